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

use crate::common::{PrivateNode, minimal_spec};
use crate::log_control_plane::LogControlPlane;

const NS: &str = "default";

fn vm_yaml(name: &str, run_strategy: &str) -> String {
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
        cpu: {{sockets: 1}}
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
    // A domain vmplane made for a VMI nobody has any more (e.g. removed while vmplane was
    // down), running.
    let stray = minimal_spec(NS, "gone");
    f.hv().define(&stray).expect("define");
    f.hv().start(stray.firmware_uuid).expect("start");
    assert_eq!(f.owned().len(), 1);

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
    let owned = f.owned();
    assert_eq!(owned.len(), 1);
    assert_eq!(owned[0].metadata.name, "kept");

    // The test driver's own domain is still there and running: vmplane never touched it.
    let foreign_uuid = Uuid::parse_str("6695eb01-f6a4-8304-79aa-97f2502e193f").expect("uuid");
    assert!(matches!(
        f.hv().state(foreign_uuid),
        Err(HypervisorError::NotOwned { .. })
    ));
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
