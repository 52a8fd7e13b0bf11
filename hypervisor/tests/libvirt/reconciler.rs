//! The reconciler against real libvirt (a private test-driver node) and the real log and core
//! (`LogControlPlane`): launch, stop, restart, crash, backoff, adoption after a restart,
//! removal of unwanted domains, unschedulable VMIs, standalone VMIs, and the idempotence of
//! a second pass after every scenario.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use uuid::Uuid;
use vmplane_core::event::VmiPhase;
use vmplane_core::lifecycle::{self, PrintableStatus};
use vmplane_core::{Features, VmCommand, VmState};
use vmplane_hypervisor::{
    ControlPlane, DomainSpec, DomainState, DomainStatus, Hypervisor, HypervisorError,
    LibvirtHypervisor, LifecycleEvent, Nodes, OwnedDomain, PassReport, RECONCILER_ACTOR,
    Reconciler, ReconcilerOptions, Resources,
};

use vmplane_hypervisor::qemu_harness::SessionLibvirtd;

use crate::common::{PrivateNode, minimal_spec};
use crate::log_control_plane::LogControlPlane;

const NS: &str = "default";

fn vm_yaml(name: &str, run_strategy: &str) -> String {
    vm_yaml_sized(name, run_strategy, 1)
}

fn vm_yaml_sized(name: &str, run_strategy: &str, sockets: u32) -> String {
    format!(
        r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {{name: {name}, namespace: {NS}, labels: {{app: demo}}}}
spec:
  runStrategy: {run_strategy}
  template:
    metadata: {{labels: {{app: demo}}}}
    spec:
      terminationGracePeriodSeconds: 5
      domain:
        cpu: {{sockets: {sockets}}}
        memory: {{guest: 64Mi}}
        devices:
          disks:
          - {{name: root, disk: {{bus: virtio}}}}
      volumes:
      - {{name: root, containerDisk: {{image: quay.io/containerdisks/cirros}}}}
"#
    )
}

/// A log, a node and a reconciler over them; the node's connection is shared with the test,
/// which uses it to look at domains and to act behind vmplane's back.
struct Fixture {
    log_dir: tempfile::TempDir,
    _node: PrivateNode,
    /// The node's one connection (the test driver's state is private to a connection).
    lv: Arc<LibvirtHypervisor>,
    /// What the reconciler drives: `lv`, possibly wrapped.
    node_hv: Arc<dyn Hypervisor>,
    cp: Option<Arc<LogControlPlane>>,
    reconciler: Option<Reconciler>,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture::on(PrivateNode::empty(), |hv| hv)
    }

    /// A fixture on `node`, whose connection `wrap` may wrap (to inject failures).
    fn on(
        node: PrivateNode,
        wrap: impl FnOnce(Arc<dyn Hypervisor>) -> Arc<dyn Hypervisor>,
    ) -> Fixture {
        let lv = Arc::new(node.open());
        let node_hv = wrap(lv.clone());
        let log_dir = tempfile::tempdir().expect("temp dir");
        let mut fixture = Fixture {
            log_dir,
            _node: node,
            lv,
            node_hv,
            cp: None,
            reconciler: None,
        };
        fixture.start_vmplane();
        fixture
    }

    fn nodes(&self) -> Nodes {
        let mut nodes = Nodes::default();
        nodes
            .add("node1".into(), Arc::clone(&self.node_hv))
            .expect("add node");
        nodes
    }

    /// Opens the log and starts a new reconciler: what a vmplane (re)start does.
    fn start_vmplane(&mut self) {
        let cp = LogControlPlane::open(self.log_dir.path());
        let dyn_cp: Arc<dyn ControlPlane> = cp.clone();
        self.reconciler = Some(Reconciler::new(
            dyn_cp,
            self.nodes(),
            ReconcilerOptions::default(),
        ));
        self.cp = Some(cp);
    }

    /// Drops the reconciler and the log (vmplane stops; libvirt keeps its domains).
    fn stop_vmplane(&mut self) {
        self.reconciler = None;
        self.cp = None;
    }

    fn cp(&self) -> &LogControlPlane {
        self.cp.as_ref().expect("vmplane is running")
    }

    fn hv(&self) -> &dyn Hypervisor {
        self.node_hv.as_ref()
    }

    /// One pass, which must not fail.
    fn pass(&mut self) -> PassReport {
        let report = self.reconciler.as_mut().expect("running").run_once();
        assert!(report.errors.is_empty(), "{:#?}", report.errors);
        report
    }

    /// Passes until one changes nothing (at most 5), then checks that the next one changes
    /// nothing either and makes no libvirt call that changes a domain. Returns every action.
    fn settle(&mut self) -> Vec<String> {
        let mut actions = Vec::new();
        for _ in 0..5 {
            let report = self.pass();
            actions.extend(report.actions.iter().map(ToString::to_string));
            if report.changed_nothing() {
                let again = self.pass();
                assert!(
                    again.changed_nothing(),
                    "second pass acted: {:#?}",
                    again.actions
                );
                assert!(again.actions.is_empty(), "{:#?}", again.actions);
                assert_eq!(again.calls.mutating(), 0);
                return actions;
            }
        }
        panic!("no quiet pass after 5: {actions:#?}");
    }

    fn vm(&self, name: &str) -> VmState {
        self.cp().vm(NS, name)
    }

    fn status(&self, name: &str) -> PrintableStatus {
        lifecycle::printable_status(&self.vm(name), &Features::defaults(), self.cp().now_ms())
    }

    fn owned(&self) -> Vec<OwnedDomain> {
        self.hv().list_owned().expect("list")
    }
}

fn firmware_uuid(state: &VmState) -> Uuid {
    state.firmware.as_ref().expect("firmware identity").uuid
}

fn vmi_uid(state: &VmState) -> Uuid {
    state.run.vmi.as_ref().expect("a VMI").uid
}

fn phase(state: &VmState) -> Option<VmiPhase> {
    state.run.vmi.as_ref().map(|v| v.phase)
}

fn running(status: DomainStatus) -> bool {
    status.state == DomainState::Running
}

#[test]
fn always_vm_runs_as_a_domain_with_its_firmware_uuid() {
    let mut f = Fixture::new();
    let head = f.cp().head();
    f.cp().apply_vm(&vm_yaml("web", "Always"));
    let actions = f.settle();
    let steps: Vec<&str> = actions
        .iter()
        .map(|a| a.split_whitespace().nth(1).unwrap_or(""))
        .collect();
    assert_eq!(
        steps,
        [
            "launch_vmi:",
            "schedule_vmi:",
            "define_domain:",
            "start_domain:",
            "observe_domain:"
        ],
        "{actions:#?}"
    );
    let state = f.vm("web");
    assert_eq!(phase(&state), Some(VmiPhase::Running));
    assert_eq!(
        state.run.vmi.as_ref().and_then(|v| v.node.as_deref()),
        Some("node1")
    );
    assert_eq!(f.status("web"), PrintableStatus::Running);

    // One domain, named for the VM, whose UUID is the firmware UUID, carrying the VMI uid.
    let owned = f.owned();
    assert_eq!(owned.len(), 1);
    let fw = firmware_uuid(&state);
    assert_eq!(owned[0].uuid, fw);
    assert_eq!(owned[0].name, "vmplane_default_web");
    assert_eq!(owned[0].metadata.vmi_uid, vmi_uid(&state));
    assert!(running(owned[0].status));
    // The SMBIOS system UUID (in libvirt's own rendering of the domain) matches.
    let xml = f.lv.domain_xml(fw).expect("dumpxml");
    assert!(xml.contains(&format!("<uuid>{fw}</uuid>")), "{xml}");
    assert!(
        xml.contains(&format!("<entry name='uuid'>{fw}</entry>")),
        "{xml}"
    );

    // Every event the reconciler recorded carries its actor.
    let recorded = f.cp().actors_after(head);
    assert_eq!(recorded[0], ("alice".to_owned(), "VmCreated".to_owned()));
    let by_reconciler: Vec<&str> = recorded
        .iter()
        .filter(|(actor, _)| actor == RECONCILER_ACTOR)
        .map(|(_, t)| t.as_str())
        .collect();
    assert_eq!(
        by_reconciler,
        ["VmiLaunched", "VmiScheduled", "VmiPhaseObserved"]
    );
}

#[test]
fn stop_shuts_the_domain_off_and_the_vm_is_stopped_then_start_runs_it_again() {
    let mut f = Fixture::new();
    f.cp().apply_vm(&vm_yaml("web", "Always"));
    f.settle();
    let fw = firmware_uuid(&f.vm("web"));
    let first = vmi_uid(&f.vm("web"));

    f.cp().user_vm(NS, "web", VmCommand::Stop);
    assert_eq!(f.status("web"), PrintableStatus::Stopping);
    let actions = f.settle();
    assert!(
        actions
            .iter()
            .any(|a| a.contains("stop_vmi: runStrategy is Halted")),
        "{actions:#?}"
    );
    assert!(
        actions.iter().any(|a| a.contains("record_stopped")),
        "{actions:#?}"
    );
    let state = f.vm("web");
    assert_eq!(f.status("web"), PrintableStatus::Stopped);
    assert!(
        state.run.vmi.is_none(),
        "the ended VMI is removed under Halted"
    );
    assert!(f.owned().is_empty(), "the domain is shut off and undefined");

    f.cp()
        .user_vm(NS, "web", VmCommand::Start { paused: false });
    f.settle();
    let state = f.vm("web");
    assert_eq!(f.status("web"), PrintableStatus::Running);
    assert_ne!(vmi_uid(&state), first, "a new VMI");
    assert_eq!(firmware_uuid(&state), fw, "the same firmware UUID");
    assert_eq!(f.owned().len(), 1);
    assert!(running(f.hv().state(fw).expect("state")));
}

#[test]
fn restart_replaces_the_vmi_and_keeps_the_domain_identity() {
    let mut f = Fixture::new();
    f.cp().apply_vm(&vm_yaml("web", "Always"));
    f.settle();
    let before = f.vm("web");
    f.cp().user_vm(NS, "web", VmCommand::Restart);
    let actions = f.settle();
    assert!(
        actions
            .iter()
            .any(|a| a.contains("stop_vmi: a restart was requested")),
        "{actions:#?}"
    );
    assert!(
        actions.iter().any(|a| a.contains("remove_vmi: restart")),
        "{actions:#?}"
    );
    let after = f.vm("web");
    assert_ne!(vmi_uid(&after), vmi_uid(&before));
    assert_eq!(phase(&after), Some(VmiPhase::Running));
    let owned = f.owned();
    assert_eq!(owned.len(), 1);
    assert_eq!(owned[0].uuid, firmware_uuid(&before));
    assert_eq!(owned[0].metadata.vmi_uid, vmi_uid(&after));
}

#[test]
fn a_crash_is_relaunched_under_always_and_not_under_once() {
    let mut f = Fixture::new();
    f.cp().apply_vm(&vm_yaml("always", "Always"));
    f.cp().apply_vm(&vm_yaml("once", "Once"));
    f.settle();
    let always = f.vm("always");
    let once = f.vm("once");
    assert_eq!(phase(&always), Some(VmiPhase::Running));
    assert_eq!(phase(&once), Some(VmiPhase::Running));

    // Behind vmplane's back.
    f.hv().destroy(firmware_uuid(&always)).expect("destroy");
    f.hv().destroy(firmware_uuid(&once)).expect("destroy");
    let actions = f.settle();
    assert!(
        actions.iter().any(|a| a.contains("vm/default/always observe_domain: domain vmplane_default_always is shut off (destroyed) behind vmplane's back")),
        "{actions:#?}"
    );

    // Always: the crashed VMI (which had reached Running, so no crash-loop backoff) is
    // replaced by a new one at once.
    let after = f.vm("always");
    assert_ne!(vmi_uid(&after), vmi_uid(&always));
    assert_eq!(phase(&after), Some(VmiPhase::Running));
    assert!(running(f.hv().state(firmware_uuid(&after)).expect("state")));

    // Once: the VMI stays Failed with the reason; its domain stays shut off; nothing relaunches.
    let after = f.vm("once");
    assert_eq!(vmi_uid(&after), vmi_uid(&once));
    let vmi = after.run.vmi.as_ref().expect("the failed VMI is kept");
    assert_eq!(
        (vmi.phase, vmi.reason.as_deref()),
        (VmiPhase::Failed, Some("Destroyed"))
    );
    assert_eq!(f.status("once"), PrintableStatus::Stopped);
    assert_eq!(
        f.hv().state(firmware_uuid(&once)).expect("state").state,
        DomainState::Shutoff
    );
    assert_eq!(after.run.launches, 1);
}

/// A node whose `start` fails while `failing` is set.
struct FailingStarts {
    inner: Arc<dyn Hypervisor>,
    failing: Arc<AtomicBool>,
}

impl Hypervisor for FailingStarts {
    fn node_capacity(&self) -> Result<Resources, HypervisorError> {
        self.inner.node_capacity()
    }
    fn list_owned(&self) -> Result<Vec<OwnedDomain>, HypervisorError> {
        self.inner.list_owned()
    }
    fn define(&self, spec: &DomainSpec) -> Result<(), HypervisorError> {
        self.inner.define(spec)
    }
    fn start(&self, uuid: Uuid) -> Result<(), HypervisorError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(HypervisorError::NotFound {
                domain: vmplane_hypervisor::DomainRef { uuid, name: None },
            });
        }
        self.inner.start(uuid)
    }
    fn shutdown(&self, uuid: Uuid) -> Result<(), HypervisorError> {
        self.inner.shutdown(uuid)
    }
    fn destroy(&self, uuid: Uuid) -> Result<(), HypervisorError> {
        self.inner.destroy(uuid)
    }
    fn undefine(&self, uuid: Uuid) -> Result<(), HypervisorError> {
        self.inner.undefine(uuid)
    }
    fn state(&self, uuid: Uuid) -> Result<DomainStatus, HypervisorError> {
        self.inner.state(uuid)
    }
    fn subscribe(&self) -> Result<std::sync::mpsc::Receiver<LifecycleEvent>, HypervisorError> {
        self.inner.subscribe()
    }
}

#[test]
fn failed_starts_back_off_before_always_launches_again() {
    let failing = Arc::new(AtomicBool::new(true));
    let flag = Arc::clone(&failing);
    let mut f = Fixture::on(PrivateNode::empty(), move |inner| {
        Arc::new(FailingStarts {
            inner,
            failing: flag,
        })
    });
    f.cp().apply_vm(&vm_yaml("web", "Always"));
    let first = f.pass();
    assert!(
        first
            .actions
            .iter()
            .any(|a| a.step == "start_domain" && a.why.contains("could not start")),
        "{:#?}",
        first.actions
    );
    // The VMI failed before it ran: core scheduled a crash-loop backoff, the reconciler
    // removed the failed VMI and now waits.
    let state = f.vm("web");
    assert_eq!(state.run.consecutive_failures, 1);
    let until = state.run.backoff_until_ms.expect("a backoff");
    assert!(state.run.vmi.is_none());
    assert_eq!(f.status("web"), PrintableStatus::CrashLoopBackOff);
    assert!(f.owned().is_empty());
    let waiting = f.pass();
    assert!(waiting.changed_nothing(), "{:#?}", waiting.actions);
    assert_eq!(waiting.next_due_ms, Some(until));

    // After the backoff, with starts working again, Always launches a new VMI.
    failing.store(false, Ordering::SeqCst);
    f.cp().advance_secs(16);
    let actions = f.settle();
    assert!(
        actions
            .iter()
            .any(|a| a.contains("crash-loop backoff over after 1 failures")),
        "{actions:#?}"
    );
    assert_eq!(phase(&f.vm("web")), Some(VmiPhase::Running));
    assert_eq!(f.vm("web").run.consecutive_failures, 0);
}

#[test]
fn a_restarted_vmplane_adopts_its_domains_instead_of_duplicating_them() {
    let mut f = Fixture::new();
    for name in ["a", "b", "c"] {
        f.cp().apply_vm(&vm_yaml(name, "Always"));
    }
    f.settle();
    let before: Vec<(Uuid, Uuid)> = f
        .owned()
        .iter()
        .map(|d| (d.uuid, d.metadata.vmi_uid))
        .collect();
    assert_eq!(before.len(), 3);
    let head = f.cp().head();

    f.stop_vmplane();
    f.start_vmplane();
    let report = f.pass();
    assert!(report.changed_nothing(), "{:#?}", report.actions);
    assert!(report.actions.is_empty(), "{:#?}", report.actions);
    assert_eq!(report.calls.mutating(), 0);
    assert_eq!(f.cp().head(), head);
    let mut after: Vec<(Uuid, Uuid)> = f
        .owned()
        .iter()
        .map(|d| (d.uuid, d.metadata.vmi_uid))
        .collect();
    let mut before = before;
    before.sort();
    after.sort();
    assert_eq!(after, before);

    // The adopted domains are driven as before: a stop after the restart works.
    f.cp().user_vm(NS, "b", VmCommand::Stop);
    f.settle();
    assert_eq!(f.owned().len(), 2);
}

#[test]
fn unwanted_vmplane_domains_are_removed_and_foreign_domains_stay() {
    let foreign = "<node>\n<domain type='test'><name>test</name>\
        <uuid>6695eb01-f6a4-8304-79aa-97f2502e193f</uuid><memory>8388608</memory>\
        <vcpu>2</vcpu><os><type>hvm</type></os></domain>\n</node>\n";
    let mut f = Fixture::on(PrivateNode::with_xml(foreign), |hv| hv);
    f.cp().apply_vm(&vm_yaml("kept", "Always"));
    // A VM whose VMI this log recorded, then deleted: its domain went with it.
    f.cp().apply_vm(&vm_yaml("gone", "Always"));
    f.settle();
    let gone_vmi = vmi_uid(&f.vm("gone"));
    f.cp().user_vm(
        NS,
        "gone",
        VmCommand::Delete {
            expected_generation: None,
        },
    );
    f.settle();
    assert_eq!(f.owned().len(), 1);
    // A domain of that VMI left behind (e.g. a vmplane that crashed between the log and
    // libvirt), running: the log recorded its VMI, so it is this log's to remove.
    let mut stray = minimal_spec(NS, "gone");
    stray.metadata.vmi_uid = gone_vmi;
    f.hv().define(&stray).expect("define");
    f.hv().start(stray.firmware_uuid).expect("start");
    // A vmplane domain of a VMI this log never recorded: another vmplane's.
    let others = minimal_spec(NS, "others");
    f.hv().define(&others).expect("define");
    f.hv().start(others.firmware_uuid).expect("start");
    assert_eq!(f.owned().len(), 3);

    let actions = f.settle();
    let removed: Vec<&String> = actions
        .iter()
        .filter(|a| a.contains("remove_unwanted_domain"))
        .collect();
    assert_eq!(removed.len(), 1, "{actions:#?}");
    assert!(
        removed[0].contains("domain/node1/vmplane_default_gone"),
        "{removed:?}"
    );
    assert!(
        removed[0].contains("is wanted by no VM or VMI"),
        "{removed:?}"
    );
    assert!(matches!(
        f.hv().state(stray.firmware_uuid),
        Err(HypervisorError::NotFound { .. })
    ));
    let mut owned: Vec<String> = f.owned().into_iter().map(|d| d.metadata.name).collect();
    owned.sort();
    assert_eq!(owned, ["kept", "others"]);
    assert!(running(
        f.hv()
            .state(others.firmware_uuid)
            .expect("others still there")
    ));

    // The test driver's own domain is still there and running: vmplane never touched it.
    let foreign_uuid = Uuid::parse_str("6695eb01-f6a4-8304-79aa-97f2502e193f").expect("uuid");
    assert!(matches!(
        f.hv().state(foreign_uuid),
        Err(HypervisorError::NotOwned { .. })
    ));
}

/// Copies a closed log's directory (a backup restored elsewhere, as far as the log goes).
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("create the copy");
    for entry in std::fs::read_dir(from).expect("read the log dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a file");
        }
    }
}

/// Audit: a second server with a fresh `--data` against the same libvirt removed the first
/// server's 47 domains ("is wanted by no VM or VMI"), a live QEMU guest among them.
#[test]
fn a_fresh_log_never_touches_another_logs_domains_and_a_restored_copy_adopts_them() {
    let mut f = Fixture::new();
    for name in ["a", "b"] {
        f.cp().apply_vm(&vm_yaml(name, "Always"));
    }
    f.cp().create_vmi(
        r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: solo, namespace: default}
spec:
  domain:
    memory: {guest: 64Mi}
    devices: {}
"#,
    );
    f.settle();
    let theirs: Vec<OwnedDomain> = f.owned();
    assert_eq!(theirs.len(), 3);
    let head = f.cp().head();

    // A second vmplane, fresh log, same node.
    let fresh_dir = tempfile::tempdir().expect("temp dir");
    let fresh = LogControlPlane::open(fresh_dir.path());
    let mut second = Reconciler::new(fresh.clone(), f.nodes(), ReconcilerOptions::default());
    let report = second.run_once();
    assert!(report.errors.is_empty(), "{:#?}", report.errors);
    assert!(report.actions.is_empty(), "{:#?}", report.actions);
    assert_eq!(report.calls.mutating(), 0);
    assert_eq!(
        report.foreign_domains.len(),
        3,
        "{:#?}",
        report.foreign_domains
    );
    assert!(
        report
            .foreign_domains
            .iter()
            .all(|d| d.contains("left alone") && d.contains("never recorded")),
        "{:#?}",
        report.foreign_domains
    );
    // Said once: the next pass finds the same domains and says nothing.
    let again = second.run_once();
    assert!(again.actions.is_empty() && again.foreign_domains.is_empty());
    assert_eq!(again.calls.mutating(), 0);
    assert_eq!(fresh.head(), 0);
    let mut now: Vec<(Uuid, DomainState)> =
        f.owned().iter().map(|d| (d.uuid, d.status.state)).collect();
    let mut before: Vec<(Uuid, DomainState)> =
        theirs.iter().map(|d| (d.uuid, d.status.state)).collect();
    now.sort_by_key(|(u, _)| *u);
    before.sort_by_key(|(u, _)| *u);
    assert_eq!(now, before);
    assert!(now.iter().all(|(_, s)| *s == DomainState::Running));
    drop(second);

    // The first log, restored from a copy: its domains are its own, adopted as they are, and
    // the VMIs it stops go.
    f.stop_vmplane();
    let restored_dir = tempfile::tempdir().expect("temp dir");
    copy_dir(f.log_dir.path(), restored_dir.path());
    let restored = LogControlPlane::open(restored_dir.path());
    assert_eq!(restored.head(), head);
    let mut third = Reconciler::new(restored.clone(), f.nodes(), ReconcilerOptions::default());
    let report = third.run_once();
    assert!(report.errors.is_empty(), "{:#?}", report.errors);
    assert!(report.changed_nothing(), "{:#?}", report.actions);
    assert!(
        report.foreign_domains.is_empty(),
        "{:#?}",
        report.foreign_domains
    );
    restored.user_vm(NS, "a", VmCommand::Stop);
    let report = third.run_once();
    assert!(
        report
            .actions
            .iter()
            .any(|a| a.subject == "vm/default/a" && a.step == "stop_vmi"),
        "{:#?}",
        report.actions
    );
}

#[test]
fn vmis_that_fit_nowhere_are_unschedulable_until_room_frees_up() {
    // One vCPU: room for one VM only.
    let node = PrivateNode::with_capacity(1, 4 << 20);
    let mut f = Fixture::on(node, |hv| hv);
    f.cp().apply_vm(&vm_yaml("first", "Always"));
    f.settle();
    f.cp().apply_vm(&vm_yaml("second", "Always"));
    let actions = f.settle();
    assert!(
        actions.iter().any(
            |a| a.contains("vm/default/second record_unschedulable: VMI")
                && a.contains("no node has 1 vCPUs")
        ),
        "{actions:#?}"
    );
    let second = f.vm("second");
    let vmi = second.run.vmi.as_ref().expect("a VMI");
    assert_eq!(
        (vmi.phase, vmi.reason.as_deref()),
        (VmiPhase::Scheduling, Some("Unschedulable"))
    );
    assert_eq!(f.status("second"), PrintableStatus::ErrorUnschedulable);
    assert_eq!(f.owned().len(), 1);

    // Stopping the first frees the vCPU: the second is placed on the next pass.
    f.cp().user_vm(NS, "first", VmCommand::Stop);
    f.settle();
    assert_eq!(phase(&f.vm("second")), Some(VmiPhase::Running));
    assert_eq!(f.status("second"), PrintableStatus::Running);
}

/// Audit: 20 VMs too big for any node; every start or stop of an unrelated VM appended one
/// `VmiPhaseObserved "Scheduling"` per unschedulable VM (differing only in the free figures of
/// the message), sometimes two in one pass.
#[test]
fn unschedulable_vmis_are_recorded_once_not_at_every_change_of_free_room() {
    // Two vCPUs: the four-vCPU VMs fit nowhere, ever.
    let node = PrivateNode::with_capacity(2, 4 << 20);
    let mut f = Fixture::on(node, |hv| hv);
    let big: Vec<String> = (0..4).map(|i| format!("big{i}")).collect();
    for name in &big {
        f.cp().apply_vm(&vm_yaml_sized(name, "Always", 4));
    }
    f.cp().apply_vm(&vm_yaml("churn", "Manual"));
    f.settle();
    for _ in 0..3 {
        f.cp()
            .user_vm(NS, "churn", VmCommand::Start { paused: false });
        f.settle();
        assert_eq!(phase(&f.vm("churn")), Some(VmiPhase::Running));
        f.cp().user_vm(NS, "churn", VmCommand::Stop);
        f.settle();
    }
    for name in &big {
        let observed = f
            .cp()
            .event_types(&vmplane_core::streams::vm(NS, name))
            .into_iter()
            .filter(|t| t == "VmiPhaseObserved")
            .count();
        assert_eq!(observed, 1, "{name}");
        let state = f.vm(name);
        let vmi = state.run.vmi.as_ref().expect("a VMI");
        assert_eq!(
            (vmi.phase, vmi.reason.as_deref()),
            (VmiPhase::Scheduling, Some("Unschedulable"))
        );
        // Still helpful: what was free when it was recorded.
        let message = vmi.message.as_deref().unwrap_or_default();
        assert!(
            message.starts_with("no node has 4 vCPUs") && message.contains("(free: node1:"),
            "{message}"
        );
    }
}

#[test]
fn a_vmi_whose_domain_is_gone_frees_its_room_in_the_pass_that_finds_it_gone() {
    // One vCPU: room for one VM only. `z` runs there; then its domain disappears behind
    // vmplane's back (as after a hypervisor restart) and `a` asks for the room.
    let node = PrivateNode::with_capacity(1, 4 << 20);
    let mut f = Fixture::on(node, |hv| hv);
    f.cp().apply_vm(&vm_yaml("z", "Manual"));
    f.cp().user_vm(NS, "z", VmCommand::Start { paused: false });
    f.settle();
    let z = f.vm("z");
    assert_eq!(phase(&z), Some(VmiPhase::Running));
    f.hv().destroy(firmware_uuid(&z)).expect("destroy");
    f.hv().undefine(firmware_uuid(&z)).expect("undefine");
    f.cp().apply_vm(&vm_yaml("a", "Always"));

    // One pass finds z's domain gone and places a in the room z held: a VMI of a node's
    // lost domain holds no room, even before the pass has recorded it Failed.
    let report = f.pass();
    let actions: Vec<String> = report.actions.iter().map(ToString::to_string).collect();
    assert!(
        actions
            .iter()
            .any(|a| a.contains("vm/default/z observe_domain") && a.contains("has no domain")),
        "{actions:#?}"
    );
    assert!(
        actions
            .iter()
            .any(|a| a.contains("vm/default/a schedule_vmi")),
        "{actions:#?}"
    );
    assert!(
        !actions.iter().any(|a| a.contains("record_unschedulable")),
        "{actions:#?}"
    );
    f.settle();
    assert_eq!(phase(&f.vm("a")), Some(VmiPhase::Running));
    let z = f.vm("z");
    let vmi = z.run.vmi.as_ref().expect("z's ended VMI");
    assert_eq!(
        (vmi.phase, vmi.reason.as_deref()),
        (VmiPhase::Failed, Some("DomainLost"))
    );
}

#[test]
fn a_deleted_vm_has_its_domain_stopped_and_removed() {
    let mut f = Fixture::new();
    f.cp().apply_vm(&vm_yaml("web", "Always"));
    f.settle();
    f.cp().user_vm(
        NS,
        "web",
        VmCommand::Delete {
            expected_generation: None,
        },
    );
    let actions = f.settle();
    assert!(
        actions
            .iter()
            .any(|a| a.contains("stop_vmi: the VM was deleted")),
        "{actions:#?}"
    );
    assert!(f.owned().is_empty());
    assert!(f.vm("web").run.vmi.is_none());
}

#[test]
fn a_standalone_vmi_runs_and_its_domain_goes_when_it_is_deleted() {
    let mut f = Fixture::new();
    let created = f.cp().create_vmi(
        r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: solo, namespace: default}
spec:
  terminationGracePeriodSeconds: 0
  domain:
    memory: {guest: 64Mi}
    devices: {}
"#,
    );
    f.settle();
    let state = f.cp().vmi(NS, "solo");
    assert_eq!(state.phase, Some(VmiPhase::Running));
    assert_eq!(state.node.as_deref(), Some("node1"));
    let owned = f.owned();
    assert_eq!(owned.len(), 1);
    assert_eq!(Some(owned[0].metadata.vmi_uid), created.uid);
    assert_eq!(
        Some(owned[0].uuid),
        created.firmware.as_ref().map(|fw| fw.uuid)
    );

    f.cp().delete_vmi(NS, "solo");
    let actions = f.settle();
    assert!(
        actions
            .iter()
            .any(|a| a.contains("vmi/default/solo remove_vmi: the VMI was deleted")),
        "{actions:#?}"
    );
    assert!(f.owned().is_empty());
}

#[test]
fn the_spawned_reconciler_wakes_on_writes_and_on_libvirt_events() {
    let node = PrivateNode::empty();
    let hv: Arc<dyn Hypervisor> = Arc::new(node.open());
    let mut nodes = Nodes::default();
    nodes.add("node1".into(), Arc::clone(&hv)).expect("add");
    let log_dir = tempfile::tempdir().expect("temp dir");
    let cp = LogControlPlane::open(log_dir.path());
    let options = ReconcilerOptions {
        // Long enough that only wake-ups can explain a quick reaction.
        resync_interval_ms: 600_000,
        ..ReconcilerOptions::default()
    };
    let handle = Reconciler::spawn(cp.clone(), nodes, options).expect("spawn");
    let wait_until = |what: &str, check: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !check() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {:?}",
                handle.last_errors()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };

    cp.apply_vm(&vm_yaml("web", "Always"));
    handle.wake();
    wait_until("Running after a wake-up", &|| {
        phase(&cp.vm(NS, "web")) == Some(VmiPhase::Running)
    });
    let first = cp.vm(NS, "web");

    // A crash behind vmplane's back: libvirt's lifecycle event wakes the reconciler.
    hv.destroy(firmware_uuid(&first)).expect("destroy");
    wait_until("a new VMI after the crash event", &|| {
        let now = cp.vm(NS, "web");
        now.run
            .vmi
            .as_ref()
            .is_some_and(|v| v.uid != vmi_uid(&first) && v.phase == VmiPhase::Running)
    });
    assert!(handle.passes() >= 2);
    assert!(handle.calls().mutating() >= 4);
    handle.stop();
}

/// Audit: with nodes `remote` (libvirtd killed) and `good`, new VMs were placed on `remote`
/// and stayed Starting, and a VMI on `remote` kept `phase: Running`, `Ready: True`.
#[test]
fn an_unreachable_node_gets_no_new_vmis_and_its_running_vmis_turn_unknown_after_the_timeout() {
    let mut daemon = SessionLibvirtd::start().expect("a session libvirtd");
    let remote: Arc<dyn Hypervisor> =
        Arc::new(LibvirtHypervisor::open(&daemon.test_uri()).expect("open remote"));
    // Smaller than the test driver's default node: without a reason not to, placement picks
    // `remote`, the roomier.
    let good_node = PrivateNode::with_capacity(2, 1 << 20);
    let good: Arc<dyn Hypervisor> = Arc::new(good_node.open());
    let mut nodes = Nodes::default();
    nodes
        .add("remote".into(), Arc::clone(&remote))
        .expect("add");
    nodes.add("good".into(), Arc::clone(&good)).expect("add");
    let log_dir = tempfile::tempdir().expect("temp dir");
    let cp = LogControlPlane::open(log_dir.path());
    let timeout_s = 60;
    let options = ReconcilerOptions {
        node_unreachable_timeout_ms: timeout_s * 1000,
        ..ReconcilerOptions::default()
    };
    let mut reconciler = Reconciler::new(cp.clone(), nodes, options);
    let mut pass = |allow_errors: bool| {
        let report = reconciler.run_once();
        if !allow_errors {
            assert!(report.errors.is_empty(), "{:#?}", report.errors);
        }
        report
    };

    cp.apply_vm(&vm_yaml("first", "Always"));
    cp.create_vmi(
        r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: solo, namespace: default}
spec:
  domain:
    memory: {guest: 64Mi}
    devices: {}
"#,
    );
    for _ in 0..3 {
        pass(false);
    }
    let solo = cp.vmi(NS, "solo");
    assert_eq!(
        (solo.phase, solo.node.as_deref()),
        (Some(VmiPhase::Running), Some("remote"))
    );
    let first = cp.vm(NS, "first");
    let vmi = first.run.vmi.clone().expect("a VMI");
    assert_eq!(
        (vmi.phase, vmi.node.as_deref()),
        (VmiPhase::Running, Some("remote"))
    );

    daemon.kill();
    cp.apply_vm(&vm_yaml("second", "Always"));
    let mut unreachable = Vec::new();
    for _ in 0..3 {
        let report = pass(true);
        unreachable.clone_from(&report.unreachable_nodes);
        assert!(
            report.errors.iter().all(|e| e.contains("node remote")),
            "{:#?}",
            report.errors
        );
    }
    assert_eq!(unreachable, ["remote"]);
    let second = cp.vm(NS, "second");
    let vmi = second.run.vmi.as_ref().expect("a VMI");
    assert_eq!(
        (vmi.phase, vmi.node.as_deref()),
        (VmiPhase::Running, Some("good")),
        "placed on the node that answers"
    );
    // Before the timeout nothing is concluded about `first`.
    assert_eq!(phase(&cp.vm(NS, "first")), Some(VmiPhase::Running));

    cp.advance_secs(i64::try_from(timeout_s).expect("small") + 1);
    let head = cp.head();
    let report = pass(true);
    assert!(
        report
            .actions
            .iter()
            .any(|a| a.subject == "vm/default/first" && a.step == "observe_node_unreachable"),
        "{:#?}",
        report.actions
    );
    let first = cp.vm(NS, "first");
    let vmi = first.run.vmi.as_ref().expect("a VMI");
    assert_eq!(
        (vmi.phase, vmi.reason.as_deref()),
        (VmiPhase::Unknown, Some("NodeUnreachable"))
    );
    let ready = lifecycle::vmi_ready(vmi);
    assert_eq!(
        (ready.status, ready.reason.as_str()),
        (false, "NodeUnreachable")
    );
    assert!(ready.message.contains("node remote"), "{}", ready.message);
    assert_eq!(
        lifecycle::printable_status(&first, &Features::defaults(), cp.now_ms()),
        PrintableStatus::Unknown
    );
    // So does a standalone VMI.
    let solo = cp.vmi(NS, "solo");
    assert_eq!(
        (solo.phase, solo.reason.as_deref()),
        (Some(VmiPhase::Unknown), Some("NodeUnreachable"))
    );
    // Recorded once: the next passes add nothing.
    let recorded = cp.head();
    assert!(recorded > head);
    pass(true);
    pass(true);
    assert_eq!(cp.head(), recorded);

    // libvirtd comes back (its test driver empty: the domain went with it): once the node
    // answers, what libvirt says is recorded.
    daemon.restart().expect("libvirtd starts again");
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let report = pass(true);
        if report.unreachable_nodes.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "remote never answered again");
        std::thread::sleep(Duration::from_millis(200));
    }
    pass(false);
    let first = cp.vm(NS, "first");
    assert!(
        first
            .run
            .vmi
            .as_ref()
            .is_none_or(|v| v.phase != VmiPhase::Unknown),
        "{:?}",
        first.run.vmi
    );
    let solo = cp.vmi(NS, "solo");
    assert_ne!(solo.phase, Some(VmiPhase::Unknown), "{solo:?}");
}

/// A node whose test driver already has two domains outside vmplane (no vmplane metadata),
/// holding these UUIDs: a VMI given one as its firmware UUID cannot be defined there.
const SQUATTED_VM_UUID: &str = "6695eb01-f6a4-8304-79aa-97f2502e1001";
const SQUATTED_VMI_UUID: &str = "6695eb01-f6a4-8304-79aa-97f2502e1002";

fn squatted_node() -> PrivateNode {
    let domain = |name: &str, uuid: &str| {
        format!(
            "<domain type='test'><name>{name}</name><uuid>{uuid}</uuid>\
             <memory>65536</memory><vcpu>1</vcpu><os><type>hvm</type></os></domain>\n"
        )
    };
    PrivateNode::with_xml(&format!(
        "<node>\n{}{}</node>\n",
        domain("squatter-a", SQUATTED_VM_UUID),
        domain("squatter-b", SQUATTED_VMI_UUID)
    ))
}

/// Audit: a VM whose domain could not be defined crash-looped with "1 VMI(s) in a row ended
/// before running; next start in 9 s" and nothing else; the cause was in the server's log only.
#[test]
fn a_domain_libvirt_refuses_says_why_in_the_vm_s_failure_and_the_vmi_s_status() {
    let mut f = Fixture::on(squatted_node(), |hv| hv);
    let with_uuid = |yaml: String, uuid: &str| {
        yaml.replace(
            "memory: {guest: 64Mi}",
            &format!("memory: {{guest: 64Mi}}\n        firmware: {{uuid: {uuid}}}"),
        )
    };
    f.cp()
        .apply_vm(&with_uuid(vm_yaml("web", "Always"), SQUATTED_VM_UUID));
    f.cp().create_vmi(&format!(
        r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {{name: solo, namespace: default}}
spec:
  domain:
    firmware: {{uuid: {SQUATTED_VMI_UUID}}}
    memory: {{guest: 64Mi}}
    devices: {{}}
"#
    ));
    let report = f.pass();
    assert!(
        report
            .actions
            .iter()
            .any(|a| a.subject == "vm/default/web" && a.step == "define_domain"),
        "{:#?}",
        report.actions
    );

    // The VM: its VMI failed and was replaced by a backoff; the Failure condition says why.
    let web = f.vm("web");
    assert!(web.run.vmi.is_none());
    let cause = web.run.last_start_failure.as_ref().expect("a cause");
    assert_eq!(cause.reason.as_deref(), Some("DomainDefineFailed"));
    let message = cause.message.as_deref().unwrap_or_default();
    assert!(message.contains("not managed by vmplane"), "{message}");
    let now = f.cp().now_ms();
    let failure = lifecycle::conditions(&web, &Features::defaults(), now)
        .into_iter()
        .find(|c| c.kind == "Failure")
        .expect("a Failure condition");
    assert!(
        failure.message.starts_with(&format!(
            "1 VMI(s) in a row ended before running: DomainDefineFailed: {message}; next start in "
        )),
        "{}",
        failure.message
    );

    // The standalone VMI: Failed, with the reason and message in its status and Ready.
    let solo = f.cp().vmi(NS, "solo");
    assert_eq!(solo.phase, Some(VmiPhase::Failed));
    let status =
        lifecycle::standalone_vmi_status(&solo, &Features::defaults()).expect("a live VMI");
    assert_eq!(status["reason"], "DomainDefineFailed");
    let said = status["message"].as_str().unwrap_or_default();
    assert!(said.contains("not managed by vmplane"), "{status}");
    assert_eq!(status["conditions"][0]["type"], "Ready");
    assert_eq!(status["conditions"][0]["reason"], "DomainDefineFailed");
    assert_eq!(status["conditions"][0]["message"], said);
    // Neither squatter was touched.
    assert_eq!(f.owned().len(), 0);
    let waiting = f.pass();
    assert!(waiting.changed_nothing(), "{:#?}", waiting.actions);
}

/// Audit: a standalone VMI that fit nowhere showed `{phase: Scheduling, reason: Unschedulable}`
/// without a message or conditions, while a VM's VMI in the same place said which node lacks
/// what, with `Ready=False`.
#[test]
fn a_standalone_vmi_that_fits_nowhere_says_why_as_a_vm_s_vmi_does() {
    // One vCPU: room for `first` only.
    let node = PrivateNode::with_capacity(1, 4 << 20);
    let mut f = Fixture::on(node, |hv| hv);
    f.cp().apply_vm(&vm_yaml("first", "Always"));
    f.settle();
    f.cp().apply_vm(&vm_yaml("second", "Always"));
    f.cp().create_vmi(
        r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: solo, namespace: default}
spec:
  domain:
    cpu: {sockets: 1}
    memory: {guest: 64Mi}
    devices: {}
"#,
    );
    f.settle();
    let owned = lifecycle::render_vmi(&f.vm("second"))
        .and_then(|v| v.status)
        .expect("second's VMI");
    let solo = f.cp().vmi(NS, "solo");
    let status = lifecycle::standalone_vmi_status(&solo, &Features::defaults()).expect("live");
    for (key, value) in [("phase", "Scheduling"), ("reason", "Unschedulable")] {
        assert_eq!(status[key], value, "{status}");
        assert_eq!(owned[key], value, "{owned}");
    }
    let message = status["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("no node has 1 vCPUs"), "{status}");
    assert_eq!(status["message"], owned["message"]);
    assert_eq!(status["conditions"], owned["conditions"]);
    assert_eq!(
        status["conditions"][0],
        serde_json::json!({"type": "Ready", "status": "False", "reason": "Unschedulable",
                           "message": message})
    );
    // Recorded once, as a VM's VMI is.
    let observed = f
        .cp()
        .event_types(&vmplane_core::streams::vmi(NS, "solo"))
        .into_iter()
        .filter(|t| t == "VmiPhaseObserved")
        .count();
    assert_eq!(observed, 1);
}

/// Audit: a VMI scheduled on a node, whose domain was never defined, was recorded `Succeeded`
/// ("stopped before its domain was started") when stopped: nothing ran, so it is removed, as a
/// VMI never placed is.
#[test]
fn a_vmi_scheduled_but_never_defined_is_removed_on_stop_not_recorded_succeeded() {
    let mut f = Fixture::new();
    f.cp().apply_vm(&vm_yaml("half", "Manual"));
    f.cp()
        .user_vm(NS, "half", VmCommand::Start { paused: false });
    // The reconciler's first steps, without the define that follows them.
    let launched = f.cp().user_vm(
        NS,
        "half",
        VmCommand::LaunchVmi {
            features: Features::defaults(),
        },
    );
    let uid = vmi_uid(&launched);
    f.cp().user_vm(
        NS,
        "half",
        VmCommand::ObserveVmi {
            vmi_uid: uid,
            observation: vmplane_core::VmiObservation::Scheduled {
                node: "node1".into(),
            },
        },
    );
    assert_eq!(phase(&f.vm("half")), Some(VmiPhase::Scheduled));
    f.cp().user_vm(NS, "half", VmCommand::Stop);
    let actions = f.settle();
    assert!(
        actions
            .iter()
            .any(|a| a.contains("remove_vmi") && a.contains("never defined")),
        "{actions:#?}"
    );
    let types = f.cp().event_types(&vmplane_core::streams::vm(NS, "half"));
    assert!(!types.iter().any(|t| t == "VmiPhaseObserved"), "{types:?}");
    assert_eq!(types.last().map(String::as_str), Some("VmiRemoved"));
    assert!(f.vm("half").run.vmi.is_none());
    assert_eq!(f.status("half"), PrintableStatus::Stopped);
    assert_eq!(f.vm("half").run.consecutive_failures, 0);
    assert!(f.owned().is_empty());
}
