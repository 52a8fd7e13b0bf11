//! The steps of one pass. Each has one concern, and each that acts pushes an [`Action`] that
//! says why; the pass itself ([`Reconciler::pass`]) only puts them in order.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use uuid::Uuid;
use vmplane_core::event::VmiPhase;
use vmplane_core::lifecycle::{self, DesiredAction, RunStrategy};
use vmplane_core::{Features, VmCommand, VmState, VmiCommand, VmiObservation, VmiState};

use super::{Action, Located, PassReport, Reconciler, Stopping, wanted_vmis};
use crate::control_plane::{ControlPlaneError, Executed};
use crate::error::{HypervisorError, SpecError};
use crate::hypervisor::{DomainState, DomainStatus, Resources};
use crate::mapping;
use crate::nodes::Unschedulable;
use crate::spec::DomainSpec;

/// The aggregate a VMI run belongs to.
#[derive(Clone, Debug)]
enum Owner {
    /// A VM's run (stream `vm/<ns>/<name>`).
    Vm { namespace: String, name: String },
    /// A standalone VMI (stream `vmi/<ns>/<name>`).
    Standalone { namespace: String, name: String },
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::Vm { namespace, name } => write!(f, "vm/{namespace}/{name}"),
            Owner::Standalone { namespace, name } => write!(f, "vmi/{namespace}/{name}"),
        }
    }
}

/// The part of a VMI run the run steps look at, from either aggregate.
#[derive(Clone, Debug)]
struct Run {
    owner: Owner,
    uid: Uuid,
    phase: VmiPhase,
    /// The reason and message of the last observation.
    reason: Option<String>,
    message: Option<String>,
    node: Option<String>,
    grace_period_s: u64,
    /// The domain it runs as (mapped once per run, see `Reconciler::specs`).
    spec: Arc<Result<DomainSpec, SpecError>>,
}

/// A state after a recorded observation.
enum Recorded {
    Vm(Box<VmState>),
    Standalone(Box<VmiState>),
}

/// What a step did to the aggregate: recorded something (look again with the new state),
/// acted on libvirt only (look again with the same state), or nothing more to do this pass.
enum Progress {
    Changed(Recorded),
    Same,
    Done,
}

#[derive(Debug, thiserror::Error)]
enum StepError {
    #[error(transparent)]
    ControlPlane(#[from] ControlPlaneError),
    #[error(transparent)]
    Hypervisor(#[from] HypervisorError),
}

type StepResult<T> = Result<T, StepError>;

/// What the pass learned from libvirt, kept up to date as it acts. Shared by the pass's
/// workers; every lock is held for a map operation only, never across a libvirt call.
struct PassState {
    now_ms: i64,
    /// The cluster's effective features at the start of the pass.
    features: Features,
    /// vmplane's domains by VMI uid.
    domains: Mutex<HashMap<Uuid, Located>>,
    /// Nodes whose listing failed: nothing is concluded about their domains this pass, and
    /// nothing new is placed on them.
    unlisted_nodes: Vec<String>,
    /// Since when (ms since the epoch) each unlisted node has failed, and its last error.
    unreachable: HashMap<String, (i64, String)>,
    /// What is placed on each node (one entry per VMI with a node).
    placed: Mutex<Vec<(String, Resources)>>,
}

impl PassState {
    fn node_unlisted(&self, node: Option<&str>) -> bool {
        node.is_some_and(|n| self.unlisted_nodes.iter().any(|u| u == n))
    }

    fn domains(&self) -> MutexGuard<'_, HashMap<Uuid, Located>> {
        self.domains.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn domain(&self, uid: Uuid) -> Option<Located> {
        self.domains().get(&uid).cloned()
    }

    /// Whether a VMI not yet ended, placed on `node`, still holds its room there. A Running
    /// (or Unknown) VMI whose domain this pass found gone or not running does not: this very
    /// pass records it ended (`observe_domain`), and until then its room must not keep
    /// another VMI from being placed (after a hypervisor restart, every VMI of the node is
    /// in that case at once). On a node whose listing failed nothing is concluded: it holds.
    fn holds_room(&self, uid: Uuid, phase: VmiPhase, node: &str) -> bool {
        if self.node_unlisted(Some(node)) || !matches!(phase, VmiPhase::Running | VmiPhase::Unknown)
        {
            return true;
        }
        self.domain(uid).is_some_and(|d| d.status.is_active())
    }

    fn set_status(&self, uid: Uuid, status: DomainStatus) {
        if let Some(d) = self.domains().get_mut(&uid) {
            d.status = status;
        }
    }
}

impl Reconciler {
    /// One pass: the steps in order. Node listing, unwanted domains and placement
    /// bookkeeping run first on the caller's thread; then up to
    /// [`super::ReconcilerOptions::workers`] threads take VMs (then standalone VMIs) one at a
    /// time, so libvirt calls and the control plane's durable appends overlap.
    pub(super) fn pass(&self, report: &mut PassReport) {
        let now_ms = self.control_plane.now_ms();
        let (domains, duplicates, unlisted_nodes) = self.observe_nodes(report);
        let (unlisted_nodes, unreachable) = self.note_reachability(now_ms, &unlisted_nodes, report);
        let features = match self.control_plane.features() {
            Ok(features) => features,
            Err(e) => {
                return report
                    .errors
                    .push(format!("reading the cluster's features: {e}"));
            }
        };
        let ps = PassState {
            now_ms,
            features,
            domains: Mutex::new(domains),
            unlisted_nodes,
            unreachable,
            placed: Mutex::new(Vec::new()),
        };
        let vms = match self.control_plane.vms() {
            Ok(vms) => vms,
            Err(e) => return report.errors.push(format!("reading VMs: {e}")),
        };
        let vmis = match self.control_plane.standalone_vmis() {
            Ok(vmis) => vmis,
            Err(e) => return report.errors.push(format!("reading standalone VMIs: {e}")),
        };
        let wanted = wanted_vmis(&vms, &vmis);
        self.forget_unwanted(&wanted);
        self.remove_unwanted_domains(&ps, duplicates, &wanted, report);
        self.count_placed(&ps, &vms, &vmis);
        self.in_parallel(vms, report, |state, report| {
            self.reconcile_vm(state, &ps, report);
        });
        self.in_parallel(vmis, report, |state, report| {
            self.reconcile_standalone(state, &ps, report);
        });
    }

    /// Runs `work` on every item with up to `workers` threads, each with a report of its own,
    /// merged into `report` in worker order.
    fn in_parallel<T: Send>(
        &self,
        items: Vec<T>,
        report: &mut PassReport,
        work: impl Fn(T, &mut PassReport) + Sync,
    ) {
        let workers = self.options.workers.clamp(1, items.len().max(1));
        if workers == 1 {
            for item in items {
                work(item, report);
            }
            return;
        }
        let next = AtomicUsize::new(0);
        let items: Vec<Mutex<Option<T>>> = items.into_iter().map(|i| Mutex::new(Some(i))).collect();
        let reports: Vec<PassReport> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    scope.spawn(|| {
                        let mut mine = PassReport::default();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(slot) = items.get(i) else { break };
                            let item = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
                            if let Some(item) = item {
                                work(item, &mut mine);
                            }
                        }
                        mine
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| PassReport {
                        errors: vec!["a reconciler worker panicked".into()],
                        ..PassReport::default()
                    })
                })
                .collect()
        });
        for mine in reports {
            report.actions.extend(mine.actions);
            report.events_appended += mine.events_appended;
            report.errors.extend(mine.errors);
            if let Some(due) = mine.next_due_ms {
                report.due(due);
            }
        }
    }

    // ---- step: observe_nodes ------------------------------------------------------------

    /// Lists vmplane's domains on every node. A second domain of the same VMI (on another
    /// node) is returned apart, to be removed.
    /// Nodes whose listing failed come back with the error.
    #[allow(clippy::type_complexity)]
    fn observe_nodes(
        &self,
        report: &mut PassReport,
    ) -> (
        HashMap<Uuid, Located>,
        Vec<(Located, String)>,
        Vec<(String, String)>,
    ) {
        let mut domains: HashMap<Uuid, Located> = HashMap::new();
        let mut duplicates = Vec::new();
        let mut unlisted = Vec::new();
        for node in self.nodes.iter() {
            self.calls.list.fetch_add(1, Ordering::Relaxed);
            let listed = match node.hypervisor.list_owned() {
                Ok(listed) => listed,
                Err(e) => {
                    report
                        .errors
                        .push(format!("listing node {}: {e}", node.name));
                    unlisted.push((node.name.clone(), e.to_string()));
                    continue;
                }
            };
            for d in listed {
                let located = Located {
                    node: node.name.clone(),
                    uuid: d.uuid,
                    name: d.name,
                    status: d.status,
                    owner: format!("{}/{}", d.metadata.namespace, d.metadata.name),
                    vmi_uid: d.metadata.vmi_uid,
                };
                match domains.get(&d.metadata.vmi_uid) {
                    Some(first) => {
                        let why = format!(
                            "a second domain of VMI {} ({}); the first is {} on node {}",
                            located.vmi_uid, located.owner, first.name, first.node
                        );
                        duplicates.push((located, why));
                    }
                    None => {
                        domains.insert(d.metadata.vmi_uid, located);
                    }
                }
            }
        }
        (domains, duplicates, unlisted)
    }

    /// Keeps since when each node has been unreachable (its listing failing pass after pass),
    /// says when one answers again, and reports the unreachable nodes of this pass. Returns
    /// the unlisted nodes' names with since when they fail and their last error.
    fn note_reachability(
        &self,
        now_ms: i64,
        unlisted: &[(String, String)],
        report: &mut PassReport,
    ) -> (Vec<String>, HashMap<String, (i64, String)>) {
        let mut since = self
            .unreachable_since
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        since.retain(|node, at_ms| {
            let failing = unlisted.iter().any(|(n, _)| n == node);
            if !failing {
                tracing::info!(%node, unreachable_for_ms = now_ms.saturating_sub(*at_ms), "node answers again");
            }
            failing
        });
        let mut out = HashMap::new();
        for (node, error) in unlisted {
            let at_ms = *since.entry(node.clone()).or_insert(now_ms);
            out.insert(node.clone(), (at_ms, error.clone()));
        }
        report.unreachable_nodes = unlisted.iter().map(|(n, _)| n.clone()).collect();
        (report.unreachable_nodes.clone(), out)
    }

    // ---- step: remove_unwanted_domains --------------------------------------------------

    /// Destroys and undefines this log's domains whose VMI no VM or standalone VMI has, and
    /// second domains of one VMI. A domain is this log's only when its VMI uid is one the log
    /// recorded ([`crate::ControlPlane::recorded_vmis`]): any other vmplane domain is another
    /// vmplane's (or made by hand), left alone and reported once (`PassReport::foreign_domains`).
    fn remove_unwanted_domains(
        &self,
        ps: &PassState,
        duplicates: Vec<(Located, String)>,
        wanted: &std::collections::HashSet<Uuid>,
        report: &mut PassReport,
    ) {
        let unwanted: Vec<Uuid> = ps
            .domains()
            .keys()
            .filter(|uid| !wanted.contains(uid))
            .copied()
            .collect();
        // A domain of a wanted VMI is this log's: the log recorded that uid.
        let to_check: Vec<Uuid> = unwanted
            .iter()
            .copied()
            .chain(
                duplicates
                    .iter()
                    .map(|(d, _)| d.vmi_uid)
                    .filter(|uid| !wanted.contains(uid)),
            )
            .collect();
        let recorded = if to_check.is_empty() {
            Default::default()
        } else {
            match self.control_plane.recorded_vmis(&to_check) {
                Ok(recorded) => recorded,
                Err(e) => {
                    // Not knowing whose they are, touch none of them this pass.
                    let mut domains = ps.domains();
                    for uid in &unwanted {
                        domains.remove(uid);
                    }
                    return report
                        .errors
                        .push(format!("reading which VMIs the log recorded: {e}"));
                }
            }
        };
        let ours = |uid: &Uuid| wanted.contains(uid) || recorded.contains(uid);
        let mut doomed = Vec::new();
        let mut foreign = Vec::new();
        for (located, why) in duplicates {
            if ours(&located.vmi_uid) {
                doomed.push((located, why));
            } else {
                foreign.push(located);
            }
        }
        for uid in unwanted {
            let removed = ps.domains().remove(&uid);
            if let Some(located) = removed {
                if ours(&uid) {
                    let why = format!(
                        "vmplane domain of VMI {uid} ({}) is wanted by no VM or VMI",
                        located.owner
                    );
                    doomed.push((located, why));
                } else {
                    foreign.push(located);
                }
            }
        }
        self.note_foreign(ps, foreign, report);
        for (located, why) in doomed {
            let subject = format!("domain/{}/{}", located.node, located.name);
            match self.destroy_and_undefine(&located) {
                Ok(()) => report.actions.push(Action {
                    subject,
                    step: "remove_unwanted_domain",
                    why,
                }),
                Err(e) => report.errors.push(format!("{subject}: {e}")),
            }
        }
    }

    /// Reports the foreign domains this pass found that the last pass did not (so each is
    /// logged once, not every pass), and remembers the ones seen.
    fn note_foreign(&self, ps: &PassState, foreign: Vec<Located>, report: &mut PassReport) {
        let mut seen = self.foreign.lock().unwrap_or_else(|p| p.into_inner());
        // A node that could not be listed says nothing about its domains: keep what is known.
        seen.retain(|(node, uuid)| {
            ps.node_unlisted(Some(node))
                || foreign.iter().any(|f| &f.node == node && f.uuid == *uuid)
        });
        for located in foreign {
            if seen.insert((located.node.clone(), located.uuid)) {
                report.foreign_domains.push(format!(
                    "domain/{}/{}: left alone: its vmplane metadata names VMI {} ({}), which this \
                     log never recorded (another vmplane's domain, or one made by hand)",
                    located.node, located.name, located.vmi_uid, located.owner
                ));
            }
        }
    }

    /// Forgets graceful stops of VMIs that no longer exist.
    fn forget_unwanted(&self, wanted: &std::collections::HashSet<Uuid>) {
        self.stopping().retain(|uid, _| wanted.contains(uid));
        self.specs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|uid, _| wanted.contains(uid));
    }

    /// Fills `ps.placed` with the resources of every VMI that has a node, has not ended and
    /// still holds its room there ([`PassState::holds_room`]).
    fn count_placed(&self, ps: &PassState, vms: &[VmState], vmis: &[VmiState]) {
        let mut placed = Vec::new();
        for state in vms {
            if let Some(v) = state.active_vmi()
                && let Some(node) = &v.node
                && ps.holds_room(v.uid, v.phase, node)
                && let Ok(spec) = self.vm_spec(state, v.uid).as_ref()
            {
                placed.push((node.clone(), Resources::of(spec)));
            }
        }
        for state in vmis.iter().filter(|s| s.is_live()) {
            if let (Some(uid), Some(node)) = (state.uid, &state.node)
                && !state.phase.is_some_and(VmiPhase::is_final)
                && state
                    .phase
                    .is_none_or(|phase| ps.holds_room(uid, phase, node))
                && let Ok(spec) = self.standalone_spec(state, uid).as_ref()
            {
                placed.push((node.clone(), Resources::of(spec)));
            }
        }
        *ps.placed.lock().unwrap_or_else(|p| p.into_inner()) = placed;
    }

    // ---- per VM -------------------------------------------------------------------------

    fn reconcile_vm(&self, mut state: VmState, ps: &PassState, report: &mut PassReport) {
        let subject = format!("vm/{}/{}", state.namespace, state.name);
        for _ in 0..self.options.vm_steps_per_pass_max {
            match self.vm_step(&state, ps, report) {
                Ok(Progress::Changed(Recorded::Vm(next))) => state = *next,
                Ok(Progress::Same) => {}
                Ok(Progress::Changed(Recorded::Standalone(_)) | Progress::Done) => return,
                Err(e) => return report.errors.push(format!("{subject}: {e}")),
            }
        }
    }

    /// What `core`'s `desired_action` says, or else moving the current VMI along.
    fn vm_step(
        &self,
        state: &VmState,
        ps: &PassState,
        report: &mut PassReport,
    ) -> StepResult<Progress> {
        match lifecycle::desired_action(state, &ps.features, ps.now_ms) {
            DesiredAction::Launch => self.launch_vmi(state, &ps.features, report),
            DesiredAction::FeatureNotEnabled { .. } => {
                // Not launched until the feature is on; the VM's conditions say why.
                Ok(Progress::Done)
            }
            DesiredAction::WaitBackoff { until_ms } => {
                // Nothing until then: the loop wakes when the backoff ends.
                report.due(until_ms);
                Ok(Progress::Done)
            }
            DesiredAction::Stop { vmi_uid } => match self.vm_run(state, vmi_uid) {
                Some(run) => self.stop_vmi(&run, &why_stop(state), true, ps, report),
                None => Ok(Progress::Done),
            },
            DesiredAction::Remove { vmi_uid } => match self.vm_run(state, vmi_uid) {
                Some(run) => self.remove_vmi(&run, &why_remove(state), true, ps, report),
                None => Ok(Progress::Done),
            },
            DesiredAction::Nothing => match state.run.vmi.as_ref() {
                Some(v) => match self.vm_run(state, v.uid) {
                    Some(run) => self.advance_run(&run, ps, report),
                    None => Ok(Progress::Done),
                },
                None => Ok(Progress::Done),
            },
        }
    }

    fn vm_run(&self, state: &VmState, uid: Uuid) -> Option<Run> {
        let v = state.run.vmi.as_ref().filter(|v| v.uid == uid)?;
        let grace_period_s = v
            .started
            .expanded
            .as_ref()
            .and_then(|vm| vm.vmi_spec())
            .map_or(
                mapping::DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS,
                mapping::grace_period_seconds,
            );
        Some(Run {
            owner: Owner::Vm {
                namespace: state.namespace.clone(),
                name: state.name.clone(),
            },
            uid,
            phase: v.phase,
            reason: v.reason.clone(),
            message: v.message.clone(),
            node: v.node.clone(),
            grace_period_s,
            spec: self.vm_spec(state, uid),
        })
    }

    // ---- step: launch_vmi ---------------------------------------------------------------

    fn launch_vmi(
        &self,
        state: &VmState,
        features: &Features,
        report: &mut PassReport,
    ) -> StepResult<Progress> {
        let command = VmCommand::LaunchVmi {
            features: features.clone(),
        };
        let executed = self
            .control_plane
            .execute(&state.namespace, &state.name, command)?;
        if executed.events_appended == 0 {
            return Ok(Progress::Done);
        }
        report.events_appended += executed.events_appended;
        report.actions.push(Action {
            subject: format!("vm/{}/{}", state.namespace, state.name),
            step: "launch_vmi",
            why: why_launch(state),
        });
        Ok(Progress::Changed(Recorded::Vm(Box::new(executed.state))))
    }

    // ---- per standalone VMI -------------------------------------------------------------

    fn reconcile_standalone(&self, mut state: VmiState, ps: &PassState, report: &mut PassReport) {
        let subject = format!("vmi/{}/{}", state.namespace, state.name);
        for _ in 0..self.options.vm_steps_per_pass_max {
            let Some(uid) = state.uid else {
                return;
            };
            let spec = self.standalone_spec(&state, uid);
            let Some(run) = standalone_run(&state, spec) else {
                return;
            };
            let step = if state.is_live() {
                if !lifecycle::vmi_blocked_by(&state, &ps.features).is_empty() {
                    // Stays Pending until the feature is on; its conditions say why.
                    return;
                }
                self.advance_run(&run, ps, report)
            } else if ps.domain(run.uid).is_some() {
                // Deleted: stop gracefully, then remove the domain. Nothing to record: a
                // deleted VMI takes no more observations.
                let why = "the VMI was deleted";
                match self.stop_vmi(&run, why, false, ps, report) {
                    Ok(Progress::Same) => self.remove_vmi(&run, why, false, ps, report),
                    other => other,
                }
            } else {
                return;
            };
            match step {
                Ok(Progress::Changed(Recorded::Standalone(next))) => state = *next,
                Ok(Progress::Same) => {}
                Ok(Progress::Changed(Recorded::Vm(_)) | Progress::Done) => return,
                Err(e) => return report.errors.push(format!("{subject}: {e}")),
            }
        }
    }

    // ---- the run steps, shared by VM runs and standalone VMIs ---------------------------

    /// Moves a VMI that has not ended one step toward Running, or notices that it ended.
    fn advance_run(
        &self,
        run: &Run,
        ps: &PassState,
        report: &mut PassReport,
    ) -> StepResult<Progress> {
        if run.phase.is_final() {
            return Ok(Progress::Done);
        }
        if ps.node_unlisted(run.node.as_deref()) {
            return self.observe_node_unreachable(run, ps, report);
        }
        match (run.phase, &run.node) {
            (VmiPhase::Running | VmiPhase::Unknown, _) => self.observe_domain(run, ps, report),
            (_, None) => self.schedule_vmi(run, ps, report),
            (_, Some(_)) => self.start_domain(run, ps, report),
        }
    }

    // ---- step: observe_node_unreachable -------------------------------------------------

    /// A VMI on a node whose listing fails: nothing is done to it (its domain may well still
    /// run; only libvirt cannot be reached), but once the node has failed for
    /// [`super::ReconcilerOptions::node_unreachable_timeout_ms`] the VMI stops claiming to be
    /// Running and Ready: a running VMI goes to phase `Unknown` (KubeVirt: "the state of
    /// the VMI could not be obtained, typically due to an error in communicating with the
    /// host"), reason `NodeUnreachable`, so its `Ready` condition is False with that reason and
    /// the VM's printableStatus is `Unknown`; a VMI scheduled there keeps its phase with that
    /// reason. Not `Failed` (KubeVirt's `NodeUnresponsive`, which it records only once the
    /// node's pods are known gone): a Failed VMI of a VM that wants one running is replaced,
    /// and a second copy of a guest that may still run would share its disks. Once the node
    /// answers, `observe_domain` records what libvirt says (Running again, or ended).
    /// A standalone VMI goes `Unknown` as a VM's does.
    fn observe_node_unreachable(
        &self,
        run: &Run,
        ps: &PassState,
        report: &mut PassReport,
    ) -> StepResult<Progress> {
        let Some(node) = run.node.as_deref() else {
            return Ok(Progress::Done);
        };
        let Some((since_ms, error)) = ps.unreachable.get(node) else {
            return Ok(Progress::Done);
        };
        let timeout_ms =
            i64::try_from(self.options.node_unreachable_timeout_ms).unwrap_or(i64::MAX);
        let due_ms = since_ms.saturating_add(timeout_ms);
        if ps.now_ms < due_ms {
            report.due(due_ms);
            return Ok(Progress::Done);
        }
        if run.reason.as_deref() == Some(NODE_UNREACHABLE_REASON) {
            return Ok(Progress::Done);
        }
        let phase = match run.phase {
            VmiPhase::Running | VmiPhase::Unknown => VmiPhase::Unknown,
            VmiPhase::Scheduled => VmiPhase::Scheduled,
            _ => return Ok(Progress::Done),
        };
        let observation = VmiObservation::Phase {
            phase,
            reason: Some(NODE_UNREACHABLE_REASON.into()),
            message: Some(format!(
                "node {node} has not answered for more than {} s; whether the guest still runs \
                 there is unknown",
                self.options.node_unreachable_timeout_ms / 1000
            )),
        };
        let why = format!(
            "VMI {} is {} on node {node}, unreachable for {} s: {error}",
            run.uid,
            run.phase.as_str(),
            ps.now_ms.saturating_sub(*since_ms) / 1000
        );
        self.record(run, observation, "observe_node_unreachable", why, report)
    }

    // ---- step: schedule_vmi -------------------------------------------------------------

    /// Places a VMI without a node on a node with room, or records that none has room.
    fn schedule_vmi(
        &self,
        run: &Run,
        ps: &PassState,
        report: &mut PassReport,
    ) -> StepResult<Progress> {
        let spec = match run.spec.as_ref() {
            Ok(spec) => spec.clone(),
            Err(e) => return self.record_invalid_spec(run, e, report),
        };
        if let Some(found) = ps.domain(run.uid) {
            let why = format!(
                "its domain {} already exists on node {} (adopted)",
                found.name, found.node
            );
            let node = found.node.clone();
            return self.record(
                run,
                VmiObservation::Scheduled { node },
                "schedule_vmi",
                why,
                report,
            );
        }
        let request = Resources::of(&spec);
        // Placing and counting the placement happen under one lock: workers never place two
        // VMIs into the same room.
        let placement = {
            let mut placed = ps.placed.lock().unwrap_or_else(|p| p.into_inner());
            let chosen = self
                .nodes
                .place_reachable(
                    request,
                    placed.iter().map(|(n, r)| (n.as_str(), *r)),
                    &spec.node_selector,
                    &ps.unlisted_nodes,
                )
                .map(|node| node.name.clone());
            if let Ok(node) = &chosen {
                placed.push((node.clone(), request));
            }
            chosen
        };
        match placement {
            Ok(node) => {
                let why = format!(
                    "VMI {} has no node; node {node} has room for {} vCPUs and {} MiB",
                    run.uid,
                    request.vcpus,
                    request.memory_bytes >> 20
                );
                self.record(
                    run,
                    VmiObservation::Scheduled { node },
                    "schedule_vmi",
                    why,
                    report,
                )
            }
            Err(unschedulable) => {
                // Recorded when the reasons change, not the free figures: they change with
                // every VMI placed or stopped elsewhere, and the log would fill with them.
                let recorded = run.phase == VmiPhase::Scheduling
                    && run.reason.as_deref() == Some(UNSCHEDULABLE_REASON)
                    && run
                        .message
                        .as_deref()
                        .is_some_and(|m| Unschedulable::reasons_of(m) == unschedulable.reasons());
                if recorded {
                    return Ok(Progress::Done);
                }
                let observation = VmiObservation::Phase {
                    phase: VmiPhase::Scheduling,
                    reason: Some(UNSCHEDULABLE_REASON.into()),
                    message: Some(unschedulable.to_string()),
                };
                let why = format!("VMI {} cannot be placed: {unschedulable}", run.uid);
                self.record(run, observation, "record_unschedulable", why, report)
            }
        }
    }

    // ---- step: start_domain -------------------------------------------------------------

    /// Defines the domain of a scheduled VMI where it is missing, starts it, and records
    /// Running once libvirt says it runs.
    fn start_domain(
        &self,
        run: &Run,
        ps: &PassState,
        report: &mut PassReport,
    ) -> StepResult<Progress> {
        let Some(node_name) = run.node.clone() else {
            return Ok(Progress::Done);
        };
        let Some(node) = self.nodes.get(&node_name).cloned() else {
            let observation = failed(
                "NodeUnknown",
                format!("node {node_name:?} is not one of vmplane's nodes"),
            );
            let why = format!("VMI {} is scheduled on unknown node {node_name}", run.uid);
            return self.record(run, observation, "start_domain", why, report);
        };
        let spec = match run.spec.as_ref() {
            Ok(spec) => spec.clone(),
            Err(e) => return self.record_invalid_spec(run, e, report),
        };
        let subject = run.owner.to_string();
        let located = match ps.domain(run.uid) {
            Some(found) if found.node != node_name => {
                // The domain lives elsewhere than recorded: what libvirt has wins.
                let why = format!(
                    "its domain {} is on node {}, not {node_name}",
                    found.name, found.node
                );
                let node = found.node.clone();
                return self.record(
                    run,
                    VmiObservation::Scheduled { node },
                    "schedule_vmi",
                    why,
                    report,
                );
            }
            Some(found) => found,
            None => {
                self.calls.define.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = node.hypervisor.define(&spec) {
                    let observation = failed("DomainDefineFailed", e.to_string());
                    let why = format!("libvirt refused the domain of VMI {}: {e}", run.uid);
                    return self.record(run, observation, "define_domain", why, report);
                }
                report.actions.push(Action {
                    subject: subject.clone(),
                    step: "define_domain",
                    why: format!(
                        "VMI {} is scheduled on {node_name} and has no domain there",
                        run.uid
                    ),
                });
                let located = Located {
                    node: node_name.clone(),
                    uuid: spec.firmware_uuid,
                    name: spec.name.to_string(),
                    status: DomainStatus::from_raw(5, 0),
                    owner: format!("{}/{}", spec.metadata.namespace, spec.metadata.name),
                    vmi_uid: run.uid,
                };
                ps.domains().insert(run.uid, located.clone());
                located
            }
        };
        let mut status = located.status;
        if !status.is_active() {
            self.calls.start.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = node.hypervisor.start(located.uuid) {
                let observation = failed("DomainStartFailed", e.to_string());
                let why = format!("libvirt could not start the domain of VMI {}: {e}", run.uid);
                return self.record(run, observation, "start_domain", why, report);
            }
            report.actions.push(Action {
                subject,
                step: "start_domain",
                why: format!(
                    "VMI {} is {} and its domain {} is {}",
                    run.uid,
                    run.phase.as_str(),
                    located.name,
                    describe(status)
                ),
            });
            self.calls.state.fetch_add(1, Ordering::Relaxed);
            status = node.hypervisor.state(located.uuid)?;
            ps.set_status(run.uid, status);
        }
        if !status.is_active() {
            return Ok(Progress::Done);
        }
        let why = format!(
            "libvirt reports domain {} {}",
            located.name,
            describe(status)
        );
        let observation = VmiObservation::Phase {
            phase: VmiPhase::Running,
            reason: None,
            message: None,
        };
        self.record(run, observation, "observe_domain", why, report)
    }

    // ---- step: observe_domain -----------------------------------------------------------

    /// Compares a running VMI with its domain: a domain that stopped or vanished behind
    /// vmplane's back ends the VMI (Succeeded when the guest powered off, Failed otherwise),
    /// so the run strategy decides what follows.
    fn observe_domain(
        &self,
        run: &Run,
        ps: &PassState,
        report: &mut PassReport,
    ) -> StepResult<Progress> {
        let node = run.node.clone().unwrap_or_default();
        match ps.domain(run.uid) {
            None => {
                let observation = failed(
                    "DomainLost",
                    format!("the domain of VMI {} is gone from node {node}", run.uid),
                );
                let why = format!(
                    "VMI {} is {} but node {node} has no domain for it",
                    run.uid,
                    run.phase.as_str()
                );
                self.record(run, observation, "observe_domain", why, report)
            }
            Some(found) if found.status.is_active() => {
                // Running as recorded; a standalone VMI whose node was unreachable also drops
                // the reason it kept meanwhile.
                if run.phase == VmiPhase::Running
                    && run.reason.as_deref() != Some(NODE_UNREACHABLE_REASON)
                {
                    return Ok(Progress::Done);
                }
                let why = format!(
                    "libvirt reports domain {} {}",
                    found.name,
                    describe(found.status)
                );
                let observation = VmiObservation::Phase {
                    phase: VmiPhase::Running,
                    reason: None,
                    message: None,
                };
                self.record(run, observation, "observe_domain", why, report)
            }
            Some(found) => {
                let why = format!(
                    "domain {} is {} behind vmplane's back while VMI {} is {}",
                    found.name,
                    describe(found.status),
                    run.uid,
                    run.phase.as_str()
                );
                let observation = ended(found.status);
                self.record(run, observation, "observe_domain", why, report)
            }
        }
    }

    // ---- steps: stop_vmi, destroy_after_grace_period ------------------------------------

    /// Stops a VMI's domain: an ACPI shutdown first, `destroy` once the grace period is over,
    /// and the final phase recorded once it is off (when `record`; a deleted standalone VMI
    /// takes no more observations, and then `Same` says the domain is off).
    fn stop_vmi(
        &self,
        run: &Run,
        why: &str,
        record: bool,
        ps: &PassState,
        report: &mut PassReport,
    ) -> StepResult<Progress> {
        if ps.node_unlisted(run.node.as_deref()) {
            return Ok(Progress::Done);
        }
        let Some(found) = ps.domain(run.uid) else {
            if !record {
                return Ok(Progress::Done);
            }
            if run.phase < VmiPhase::Running {
                // Scheduled but its domain never defined: nothing ran and nothing is to shut
                // down, so it is removed, as a VMI never placed on a node is
                // (`lifecycle::desired_action`), not recorded as having ended: it did not
                // succeed, nor fail.
                let why = format!(
                    "{why}; VMI {} is {} and its domain was never defined",
                    run.uid,
                    run.phase.as_str()
                );
                return self.remove_vmi(run, &why, true, ps, report);
            }
            let observation = VmiObservation::Phase {
                phase: VmiPhase::Succeeded,
                reason: Some("Stopped".into()),
                message: Some("stopped while its domain was gone".into()),
            };
            let why = format!("{why}; VMI {} has no domain", run.uid);
            return self.record(run, observation, "stop_vmi", why, report);
        };
        let Some(node) = self.nodes.get(&found.node).cloned() else {
            return Ok(Progress::Done);
        };
        let mut status = found.status;
        if status.is_active() {
            let in_flight = self.stopping().get(&run.uid).copied();
            match in_flight {
                None => {
                    self.calls.shutdown.fetch_add(1, Ordering::Relaxed);
                    node.hypervisor.shutdown(found.uuid)?;
                    let grace_ms =
                        i64::try_from(run.grace_period_s.saturating_mul(1000)).unwrap_or(i64::MAX);
                    let deadline_ms = ps.now_ms.saturating_add(grace_ms);
                    self.stopping().insert(
                        run.uid,
                        Stopping {
                            deadline_ms,
                            destroyed: false,
                        },
                    );
                    report.actions.push(Action {
                        subject: run.owner.to_string(),
                        step: "stop_vmi",
                        why: format!(
                            "{why}: asked the guest of {} to shut down; destroy after {} s",
                            found.name, run.grace_period_s
                        ),
                    });
                }
                Some(stopping) if ps.now_ms >= stopping.deadline_ms => {
                    self.calls.destroy.fetch_add(1, Ordering::Relaxed);
                    node.hypervisor.destroy(found.uuid)?;
                    self.stopping().insert(
                        run.uid,
                        Stopping {
                            destroyed: true,
                            ..stopping
                        },
                    );
                    report.actions.push(Action {
                        subject: run.owner.to_string(),
                        step: "destroy_after_grace_period",
                        why: format!(
                            "the guest of {} still runs after the grace period of {} s",
                            found.name, run.grace_period_s
                        ),
                    });
                }
                Some(stopping) => {
                    report.due(stopping.deadline_ms);
                    return Ok(Progress::Done);
                }
            }
            self.calls.state.fetch_add(1, Ordering::Relaxed);
            status = node.hypervisor.state(found.uuid)?;
            ps.set_status(run.uid, status);
            if status.is_active() {
                let deadline = self.stopping().get(&run.uid).map(|s| s.deadline_ms);
                if let Some(deadline_ms) = deadline {
                    report.due(deadline_ms);
                }
                return Ok(Progress::Done);
            }
        }
        if !record {
            return Ok(Progress::Same);
        }
        let destroyed = self.stopping().get(&run.uid).is_some_and(|s| s.destroyed);
        let observation = if destroyed {
            failed(
                "GracePeriodExpired",
                format!(
                    "the guest did not power off within {} s and was destroyed",
                    run.grace_period_s
                ),
            )
        } else {
            ended(status)
        };
        let why = format!("{why}; domain {} is {}", found.name, describe(status));
        let progress = self.record(run, observation, "record_stopped", why, report)?;
        self.stopping().remove(&run.uid);
        Ok(progress)
    }

    // ---- step: remove_vmi ---------------------------------------------------------------

    /// Removes an ended VMI's domain (destroying it first should it run) and records that
    /// the VMI is gone (when `record`).
    fn remove_vmi(
        &self,
        run: &Run,
        why: &str,
        record: bool,
        ps: &PassState,
        report: &mut PassReport,
    ) -> StepResult<Progress> {
        if let Some(found) = ps.domain(run.uid) {
            self.destroy_and_undefine(&found)?;
            ps.domains().remove(&run.uid);
            report.actions.push(Action {
                subject: run.owner.to_string(),
                step: "remove_vmi",
                why: format!(
                    "{why}: undefined domain {} on node {}",
                    found.name, found.node
                ),
            });
        } else if ps.node_unlisted(run.node.as_deref()) {
            // Its node could not be listed: the domain may still be there.
            return Ok(Progress::Done);
        }
        self.stopping().remove(&run.uid);
        if !record {
            return Ok(Progress::Done);
        }
        self.record(
            run,
            VmiObservation::Removed,
            "remove_vmi",
            why.to_owned(),
            report,
        )
    }

    // ---- helpers ------------------------------------------------------------------------

    fn stopping(&self) -> MutexGuard<'_, HashMap<Uuid, Stopping>> {
        self.stopping.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn destroy_and_undefine(&self, found: &Located) -> Result<(), HypervisorError> {
        let Some(node) = self.nodes.get(&found.node) else {
            return Ok(());
        };
        if found.status.is_active() {
            self.calls.destroy.fetch_add(1, Ordering::Relaxed);
            node.hypervisor.destroy(found.uuid)?;
        }
        self.calls.undefine.fetch_add(1, Ordering::Relaxed);
        match node.hypervisor.undefine(found.uuid) {
            Ok(()) | Err(HypervisorError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Records `observation` of `run` and reports `step` with `why` if it appended anything.
    fn record(
        &self,
        run: &Run,
        observation: VmiObservation,
        step: &'static str,
        why: String,
        report: &mut PassReport,
    ) -> StepResult<Progress> {
        let (recorded, appended) = match &run.owner {
            Owner::Vm { namespace, name } => {
                let command = VmCommand::ObserveVmi {
                    vmi_uid: run.uid,
                    observation,
                };
                let Executed {
                    state,
                    events_appended,
                } = self.control_plane.execute(namespace, name, command)?;
                (Recorded::Vm(Box::new(state)), events_appended)
            }
            Owner::Standalone { namespace, name } => {
                let command = VmiCommand::Observe(observation);
                let Executed {
                    state,
                    events_appended,
                } = self.control_plane.execute_vmi(namespace, name, command)?;
                (Recorded::Standalone(Box::new(state)), events_appended)
            }
        };
        if appended == 0 {
            return Ok(Progress::Done);
        }
        report.events_appended += appended;
        report.actions.push(Action {
            subject: run.owner.to_string(),
            step,
            why,
        });
        Ok(Progress::Changed(recorded))
    }

    fn record_invalid_spec(
        &self,
        run: &Run,
        error: &SpecError,
        report: &mut PassReport,
    ) -> StepResult<Progress> {
        let why = format!("VMI {} cannot become a domain: {error}", run.uid);
        self.record(
            run,
            failed("InvalidSpec", error.to_string()),
            "schedule_vmi",
            why,
            report,
        )
    }

    /// The domain spec of a VM's run `uid`, mapped once per run and kept while it is wanted.
    fn vm_spec(&self, state: &VmState, uid: Uuid) -> Arc<Result<DomainSpec, SpecError>> {
        let defaults = &self.options.domain_defaults;
        let mut specs = self.specs.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(specs.entry(uid).or_insert_with(|| {
            Arc::new(mapping::vm_domain_spec(state, defaults).unwrap_or_else(|| Err(no_vmi())))
        }))
    }

    /// The domain spec of a standalone VMI, likewise.
    fn standalone_spec(&self, state: &VmiState, uid: Uuid) -> Arc<Result<DomainSpec, SpecError>> {
        let defaults = &self.options.domain_defaults;
        let mut specs = self.specs.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(specs.entry(uid).or_insert_with(|| {
            Arc::new(
                mapping::standalone_domain_spec(state, defaults).unwrap_or_else(|| Err(no_vmi())),
            )
        }))
    }
}

fn no_vmi() -> SpecError {
    SpecError {
        problems: vec![crate::error::SpecProblem::new(
            "spec",
            "the stream holds no VMI",
        )],
    }
}

fn standalone_run(state: &VmiState, spec: Arc<Result<DomainSpec, SpecError>>) -> Option<Run> {
    let uid = state.uid?;
    let grace_period_s = state
        .vmi
        .as_ref()
        .map_or(mapping::DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS, |v| {
            mapping::grace_period_seconds(&v.spec)
        });
    Some(Run {
        owner: Owner::Standalone {
            namespace: state.namespace.clone(),
            name: state.name.clone(),
        },
        uid,
        phase: state.phase.unwrap_or(VmiPhase::Pending),
        reason: state.reason.clone(),
        message: state.message.clone(),
        node: state.node.clone(),
        grace_period_s,
        spec,
    })
}

/// The reason of a VMI that no node has room for (KubeVirt's `PodReasonUnschedulable`).
const UNSCHEDULABLE_REASON: &str = "Unschedulable";

/// The reason of a VMI whose node has not answered for the timeout (Kubernetes' word for a
/// node that stopped reporting, as in its `node.kubernetes.io/unreachable` taint).
pub(crate) const NODE_UNREACHABLE_REASON: &str = "NodeUnreachable";

fn failed(reason: &str, message: String) -> VmiObservation {
    VmiObservation::Phase {
        phase: VmiPhase::Failed,
        reason: Some(reason.to_owned()),
        message: Some(message),
    }
}

/// The final phase of a VMI whose domain is off, as KubeVirt's virt-handler reads libvirt:
/// a guest that powered off (or was saved) Succeeded; destroyed, crashed or failed is Failed.
fn ended(status: DomainStatus) -> VmiObservation {
    let libvirt = describe(status);
    match (status.state, status.reason()) {
        (DomainState::Shutoff, "shutdown" | "saved" | "from snapshot") => VmiObservation::Phase {
            phase: VmiPhase::Succeeded,
            reason: Some("Shutdown".into()),
            message: Some(format!("the guest powered off (libvirt: {libvirt})")),
        },
        (DomainState::Shutoff, "destroyed") => failed(
            "Destroyed",
            format!("the domain was destroyed outside vmplane (libvirt: {libvirt})"),
        ),
        _ => failed(
            "Crashed",
            format!("the domain stopped (libvirt: {libvirt})"),
        ),
    }
}

/// `shut off (destroyed)`, `running (booted)`, … as libvirt would say it.
fn describe(status: DomainStatus) -> String {
    let state = match status.state {
        DomainState::NoState => "in no state",
        DomainState::Running => "running",
        DomainState::Blocked => "blocked",
        DomainState::Paused => "paused",
        DomainState::ShuttingDown => "shutting down",
        DomainState::Shutoff => "shut off",
        DomainState::Crashed => "crashed",
        DomainState::PmSuspended => "PM-suspended",
        DomainState::Unknown(_) => "in an unknown state",
    };
    format!("{state} ({})", status.reason())
}

fn strategy(state: &VmState) -> &'static str {
    state.run_strategy().map_or("(none)", RunStrategy::as_str)
}

fn why_launch(state: &VmState) -> String {
    let mut why = match state.run_strategy() {
        _ if state.run.start_requested => "a start was requested".to_owned(),
        Some(RunStrategy::Always) => "runStrategy Always and the VM has no VMI".to_owned(),
        Some(RunStrategy::Once) => "runStrategy Once and no VMI ran yet".to_owned(),
        _ => format!("runStrategy {} wants a VMI", strategy(state)),
    };
    if state.run.consecutive_failures > 0 {
        why.push_str(&format!(
            " (crash-loop backoff over after {} failures)",
            state.run.consecutive_failures
        ));
    }
    why
}

fn why_stop(state: &VmState) -> String {
    if !state.is_live() {
        "the VM was deleted".to_owned()
    } else if state.run.restart_requested {
        "a restart was requested".to_owned()
    } else if state.run_strategy() == Some(RunStrategy::Halted) {
        "runStrategy is Halted".to_owned()
    } else {
        "a stop was requested".to_owned()
    }
}

fn why_remove(state: &VmState) -> String {
    let ended = state.run.vmi.as_ref().map_or("ended", |v| v.phase.as_str());
    if !state.is_live() {
        format!("the VM was deleted and its VMI is {ended}")
    } else if state.run.restart_requested {
        format!("restart: the old VMI is {ended}")
    } else {
        format!(
            "the VMI is {ended} and runStrategy {} replaces it",
            strategy(state)
        )
    }
}
