//! The VM aggregate: stream `vm/<namespace>/<name>`.
//!
//! Holds the VM object (with its effective firmware UUID and serial in
//! `spec.template.spec.domain.firmware`), the captured instancetype/preference, and the VMI
//! runs. Status is never stored: [`crate::lifecycle`] derives it from [`VmState`].

use std::sync::{Arc, OnceLock};

use uuid::Uuid;

use super::Emitter;
use crate::ctx::Ctx;
use crate::decision::{Claim, Decision, Outcome, streams};
use crate::defaults;
use crate::error::{Category, Cause, Causes, Rejection, codes};
use crate::event::*;
use crate::features::{self, FeatureUse, Features};
use crate::firmware::{FirmwareIdentity, claim_key, legacy_firmware_uuid};
use crate::instancetype::{self, references};
use crate::lifecycle::{self, DesiredAction, RunStrategy};
use crate::types::{
    Instancetype, InstancetypeSpec, Kind, Preference, PreferenceSpec, VirtualMachine, VmiSpec,
};
use crate::validate;

/// Whether the name holds a live VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Existence {
    /// The stream is empty.
    #[default]
    Never,
    /// A VM lives under this name.
    Live,
    /// The last VM of this name was deleted; the name is free.
    Deleted,
}

/// An instancetype or preference as the VM captured it.
#[derive(Debug, Clone, PartialEq)]
pub struct Captured<T> {
    /// Its kind (namespaced or cluster).
    pub kind: Kind,
    /// Its name.
    pub name: String,
    /// Its uid when captured.
    pub source_uid: Option<String>,
    /// Its generation when captured (the "revision" shown in status).
    pub source_generation: u64,
    /// The full object.
    pub object: T,
}

impl<T> Captured<T> {
    /// `(kind, name, generation)`: what identifies the revision.
    pub fn revision(&self) -> (Kind, String, u64) {
        (self.kind, self.name.clone(), self.source_generation)
    }
}

/// What a VMI run started from: compared against the current spec for RestartRequired.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StartedSpec {
    /// `spec.template.spec` at launch (firmware identity included).
    pub template_spec: Option<VmiSpec>,
    /// The instancetype revision at launch.
    pub instancetype: Option<(Kind, String, u64)>,
    /// The preference revision at launch.
    pub preference: Option<(Kind, String, u64)>,
    /// The fully expanded VMI spec the run was launched with (instancetype, preference and
    /// defaults applied): what the hypervisor runs and `get vmi` shows.
    pub expanded: Option<VirtualMachine>,
    /// The features the run requests (from `expanded`, else `template_spec`).
    pub requested: Vec<FeatureUse>,
}

/// One VMI run of the VM.
#[derive(Debug, Clone, PartialEq)]
pub struct VmiRun {
    /// The VMI's uid (new for every run).
    pub uid: Uuid,
    /// Last observed phase.
    pub phase: VmiPhase,
    /// Node it was scheduled on.
    pub node: Option<String>,
    /// Reason of the last phase observation (`Unschedulable`, …).
    pub reason: Option<String>,
    /// Message of the last phase observation.
    pub message: Option<String>,
    /// Whether it ever reached Running.
    pub reached_running: bool,
    /// Started paused.
    pub paused: bool,
    /// When it was launched (ms since the epoch).
    pub launched_at_ms: i64,
    /// The VM generation it was launched from.
    pub vm_generation: u64,
    /// The firmware UUID it was launched with (the VM's effective one then). The VM keeps
    /// holding it while the run lasts, even if an edit changed the VM's since (row 7: the
    /// guest still has it).
    pub firmware_uuid: Option<Uuid>,
    /// The latest VM generation whose spec it runs (`status.observedGeneration`, the VMI's
    /// `kubevirt.io/vm-generation`): raised whenever the VM's spec is the launched one again
    /// at a later generation (a metadata or run strategy edit, a reverted edit), as KubeVirt
    /// bumps its annotation; never lowered.
    pub observed_generation: u64,
    /// The spec it was launched from (shared: it never changes during the run, and cloning a
    /// state, as time travel does, must stay cheap).
    pub started: Arc<StartedSpec>,
}

/// A deletion of the VM asked for while its VMI was active ([`VmDeletionRequested`]): the VM
/// stays, `Terminating`, until that VMI is gone; its `VmDeleted` is recorded with the VMI's
/// removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeletionRequest {
    /// When it was asked for (ms since the epoch): `metadata.deletionTimestamp`.
    pub at_ms: i64,
    /// The VMI stopped for it.
    pub vmi_uid: Uuid,
}

/// Why a VMI ended before it ever ran: the reason and message of its final phase as the
/// reconciler recorded them (`DomainDefineFailed` and libvirt's error, `InvalidSpec` and what
/// the domain builder refused, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartFailureCause {
    /// The VMI that failed.
    pub vmi_uid: Uuid,
    /// The reason of its final phase.
    pub reason: Option<String>,
    /// The message of its final phase.
    pub message: Option<String>,
}

/// Lifecycle state of a VM.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunState {
    /// The current (or last, if kept) VMI.
    pub vmi: Option<VmiRun>,
    /// A start request is pending (Manual, RerunOnFailure, restarts).
    pub start_requested: bool,
    /// The pending start asked for a paused VM.
    pub start_paused: bool,
    /// A stop was requested for this VMI.
    pub stop_requested_for: Option<Uuid>,
    /// The stop is part of a restart: start again afterwards.
    pub restart_requested: bool,
    /// VMIs in a row that ended before reaching Running.
    pub consecutive_failures: u32,
    /// No new VMI before this time (crash-loop backoff).
    pub backoff_until_ms: Option<i64>,
    /// Why the last VMI counted in `consecutive_failures` ended before running (taken from
    /// its final [`VmiPhaseObserved`] when the backoff is scheduled), while the crash loop
    /// lasts: what the `Failure` condition says after the VMI itself is gone.
    pub last_start_failure: Option<StartFailureCause>,
    /// VMIs launched so far.
    pub launches: u64,
}

/// The folded state of a `vm/<ns>/<name>` stream.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct VmState {
    /// Events folded (the stream revision this state reflects).
    pub revision: u64,
    /// Object changes so far in this stream (creations and edits, including run-strategy
    /// changes made by start/stop): `metadata.generation`. Captures, firmware assignments
    /// that accompany an edit, and VMI lifecycle events do not count.
    pub generation: u64,
    /// Never / Live / Deleted. A VM being deleted is still `Live` here, with a `deletion`.
    pub existence: Existence,
    /// The deletion asked for while its VMI was active (`None` otherwise, and once the VM is
    /// deleted or created again): the VM is Terminating.
    pub deletion: Option<DeletionRequest>,
    /// uid of the current (or last) life of the name.
    pub uid: Option<Uuid>,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// How the current life began.
    pub origin: Option<CreateOrigin>,
    /// The stored object (effective firmware identity included). Shared: it changes only on
    /// an edit, and cloning a state, as time travel does, must stay cheap.
    pub vm: Option<Arc<VirtualMachine>>,
    /// The effective firmware identity.
    pub firmware: Option<FirmwareIdentity>,
    /// The captured instancetype. Boxed: most VMs have none, and an inline one would make every
    /// state (and every cached snapshot of one) kilobytes larger.
    pub instancetype: Option<Box<Captured<Instancetype>>>,
    /// The captured preference (boxed, likewise).
    pub preference: Option<Box<Captured<Preference>>>,
    /// VMI runs and requests.
    pub run: RunState,
    /// Events whose embedded JSON could not be read (should stay 0; `verify` reports them).
    pub unreadable_events: u64,
    /// What the next VMI would request: [`VmState::requested`], derived from `vm`,
    /// `instancetype` and `preference` the first time it is asked for after [`evolve`] changed
    /// one of them, then kept, so status rendering does not expand and inspect the spec on
    /// every read, and a write whose answer shows no status never does.
    pub requested: Requested,
}

/// A [`VmState`]'s requested features, derived once when first asked for and shared by the
/// clones of the state it was derived for. [`evolve`] starts a new one whenever what it is
/// derived from changes. Equal whatever it holds: it is a function of the state's other
/// fields, which the state's equality compares.
#[derive(Debug, Clone, Default)]
pub struct Requested(Arc<OnceLock<Vec<FeatureUse>>>);

impl PartialEq for Requested {
    fn eq(&self, _: &Requested) -> bool {
        true
    }
}

impl VmState {
    /// What the next VMI would request: the spec expanded with the captured instancetype and
    /// preference, or the stored spec if that cannot be expanded (derived on first use).
    pub fn requested(&self) -> &[FeatureUse] {
        self.requested.0.get_or_init(|| requested_of(self))
    }

    /// Whether a VM lives under this name and is not being deleted: what may be edited,
    /// started, stopped and run. A Terminating VM is not live (its VMI is stopped, as a
    /// deleted VM's is) but still [exists](VmState::exists).
    pub fn is_live(&self) -> bool {
        self.existence == Existence::Live && self.deletion.is_none()
    }

    /// Whether a VM object is there to read under this name: a live VM, or one being deleted
    /// (Terminating) while its VMI stops.
    pub fn exists(&self) -> bool {
        self.existence == Existence::Live
    }

    /// The deletion this VM waits on, if it is Terminating.
    pub fn terminating(&self) -> Option<&DeletionRequest> {
        self.deletion.as_ref().filter(|_| self.exists())
    }

    /// The stream this state belongs to.
    pub fn stream(&self) -> String {
        streams::vm(&self.namespace, &self.name)
    }

    /// The run strategy of the stored VM (`running: true|false` mapped to Always/Halted).
    pub fn run_strategy(&self) -> Option<RunStrategy> {
        self.vm.as_deref().and_then(lifecycle::run_strategy_of)
    }

    /// The current VMI if it has not ended.
    pub fn active_vmi(&self) -> Option<&VmiRun> {
        self.run.vmi.as_ref().filter(|v| !v.phase.is_final())
    }

    /// The VM fully rendered with its captured instancetype and preference.
    pub fn expand(&self) -> Result<VirtualMachine, Rejection> {
        let (vm, it, pref) = self.expansion_inputs()?;
        instancetype::expand(vm, it, pref)
    }

    /// The template spec of [`VmState::expand`]'s VM, without the rest of the VM
    /// ([`instancetype::expand_vmi_spec`]).
    pub fn expand_vmi_spec(&self) -> Result<VmiSpec, Rejection> {
        let (vm, it, pref) = self.expansion_inputs()?;
        instancetype::expand_vmi_spec(vm, it, pref)
    }

    /// The stored VM with the captured instancetype's and preference's specs.
    fn expansion_inputs(
        &self,
    ) -> Result<
        (
            &VirtualMachine,
            Option<&InstancetypeSpec>,
            Option<&PreferenceSpec>,
        ),
        Rejection,
    > {
        let vm = self.vm.as_deref().ok_or_else(|| {
            Rejection::not_found("", codes::NOT_FOUND, "VirtualMachine not found")
        })?;
        Ok((
            vm,
            self.instancetype.as_ref().map(|c| &c.object.spec),
            self.preference.as_ref().map(|c| &c.object.spec),
        ))
    }
}

/// Create or update input: the manifest plus the referenced objects the gateway loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct PutVm {
    /// The VirtualMachine manifest.
    pub vm: VirtualMachine,
    /// `Apply` or `Import` (import keeps KubeVirt's legacy UUID for VMs without one).
    pub origin: CreateOrigin,
    /// If set, the object's generation must be this (else Conflict with the actual one).
    pub expected_generation: Option<u64>,
    /// The referenced instancetype, as loaded by the gateway. Needed when the VM is created or
    /// its reference changes ([`needs`] tells which); ignored otherwise.
    pub instancetype: Option<Instancetype>,
    /// The referenced preference, likewise.
    pub preference: Option<Preference>,
    /// The origin to record for a UUID given in the manifest at creation (default
    /// `UserSpecified`; the restore and clone flows pass `Restored`/`Cloned`/…, see
    /// [`crate::firmware::identity_for_restore`]). On an update that changes the UUID it is
    /// recorded too (a restore onto the same VM records `Restored`).
    pub identity_origin: Option<FirmwareOrigin>,
    /// Take the provided instancetype/preference even when the reference (kind and name) is
    /// unchanged, recording a new capture if it differs from the current one. A restore onto
    /// an existing VM sets it to put back the snapshot's revisions (KubeVirt restores the
    /// snapshot's ControllerRevisions); `false` for every other command.
    pub recapture_revisions: bool,
    /// The cluster's features, for what KubeVirt's VM admitter checks against them on CREATE
    /// ([`crate::features::check_vm_discontinued`]: a Discontinued gate still listed refuses a
    /// template that uses its API). Filled by the command path when the template uses such an
    /// API ([`crate::features::discontinued_api_uses`]); `None` checks nothing.
    pub features: Option<crate::features::Features>,
}

impl PutVm {
    /// An `apply` of `vm` with nothing resolved.
    pub fn new(vm: VirtualMachine) -> Self {
        PutVm {
            vm,
            origin: CreateOrigin::Apply,
            expected_generation: None,
            instancetype: None,
            preference: None,
            identity_origin: None,
            recapture_revisions: false,
            features: None,
        }
    }
}

/// What a VMI was observed doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmiObservation {
    /// Placed on a node.
    Scheduled {
        /// The node.
        node: String,
    },
    /// Seen in a phase.
    Phase {
        /// The phase.
        phase: VmiPhase,
        /// Reason (`Unschedulable`, `Shutdown`, `Crashed`, …).
        reason: Option<String>,
        /// Message.
        message: Option<String>,
    },
    /// The VMI object is gone.
    Removed,
}

/// Commands on a VM stream.
#[derive(Debug, Clone, PartialEq)]
pub enum VmCommand {
    /// Create; AlreadyExists if a VM lives under the name.
    Create(Box<PutVm>),
    /// Update; NotFound if no VM lives under the name.
    Update(Box<PutVm>),
    /// Create or update (`vmplane apply` / `import`).
    Apply(Box<PutVm>),
    /// Delete.
    Delete {
        /// If set, must match the generation.
        expected_generation: Option<u64>,
    },
    /// `vmplane start` (KubeVirt's start subresource).
    Start {
        /// Start paused.
        paused: bool,
    },
    /// `vmplane stop`.
    Stop,
    /// `vmplane restart`.
    Restart,
    /// The reconciler creates a VMI ([`crate::lifecycle::desired_action`] said `Launch`).
    /// Refused while the spec requests a feature that is off in `features`.
    LaunchVmi {
        /// The cluster's effective features now (from `cluster/config`).
        features: Features,
    },
    /// The reconciler saw the VMI do something.
    ObserveVmi {
        /// Which VMI.
        vmi_uid: Uuid,
        /// What it did.
        observation: VmiObservation,
    },
}

/// Which referenced objects the gateway must load for `vm` given the current state: those
/// whose reference is new or changed (unchanged references use the captured revision).
pub fn needs(state: &VmState, vm: &VirtualMachine) -> instancetype::References {
    let refs = references(vm);
    let live = state.is_live();
    let same_it = live
        && state
            .instancetype
            .as_ref()
            .map(|c| (c.kind, c.name.clone()))
            == refs.instancetype;
    let same_pref =
        live && state.preference.as_ref().map(|c| (c.kind, c.name.clone())) == refs.preference;
    instancetype::References {
        instancetype: if same_it { None } else { refs.instancetype },
        preference: if same_pref { None } else { refs.preference },
    }
}

/// Decides a command against the state. Pure: time and ids come from `ctx`.
pub fn decide(state: &VmState, command: &VmCommand, ctx: &mut Ctx) -> Result<Decision, Rejection> {
    match command {
        VmCommand::Create(p) => {
            if let Some(d) = state.terminating() {
                return Err(exists_while_terminating(state, d));
            }
            if state.is_live() {
                return Err(already_exists(state));
            }
            put(state, p, ctx)
        }
        VmCommand::Update(p) => {
            if let Some(d) = state.terminating() {
                return Err(refused_while_terminating(state, d, "an edit"));
            }
            if !state.is_live() {
                return Err(not_found(state));
            }
            put(state, p, ctx)
        }
        VmCommand::Apply(p) => {
            // As Kubernetes refuses to create a name whose object is being deleted.
            if let Some(d) = state.terminating() {
                return Err(exists_while_terminating(state, d));
            }
            put(state, p, ctx)
        }
        VmCommand::Delete {
            expected_generation,
        } => delete(state, *expected_generation, ctx),
        VmCommand::Start { paused } => start(state, *paused),
        VmCommand::Stop => stop(state),
        VmCommand::Restart => restart(state),
        VmCommand::LaunchVmi { features } => launch(state, features, ctx),
        VmCommand::ObserveVmi {
            vmi_uid,
            observation,
        } => observe(state, *vmi_uid, observation, ctx),
    }
}

/// Folds one event into the state. Total: never fails, never judges.
pub fn evolve(mut s: VmState, event: &Event) -> VmState {
    evolve_in_place(&mut s, event);
    s
}

/// [`evolve`] in place (what a long fold uses: the state is not moved per event).
pub fn evolve_in_place(s: &mut VmState, event: &Event) {
    evolve_with(s, event, None);
}

/// [`evolve`] of a `VmCreated` or `VmSpecEdited` the decider emits, `vm` being the manifest
/// its `manifest_json` was written from: the same state, without parsing back the JSON just
/// written (a create's second parse). Debug builds check that the parse gives `vm`.
fn evolve_decided(mut s: VmState, event: &Event, vm: VirtualMachine) -> VmState {
    #[cfg(debug_assertions)]
    if let Event::VmCreated(VmCreated { manifest_json, .. })
    | Event::VmSpecEdited(VmSpecEdited { manifest_json }) = event
    {
        let parsed: Option<VirtualMachine> = serde_json::from_str(manifest_json).ok();
        debug_assert_eq!(
            parsed.as_ref(),
            Some(&vm),
            "the event's JSON is the decided VM"
        );
    }
    evolve_with(&mut s, event, Some(vm));
    s
}

/// [`evolve_in_place`], the manifest of a `VmCreated` or `VmSpecEdited` taken from `decided`
/// when given (else parsed from the event).
fn evolve_with(s: &mut VmState, event: &Event, decided: Option<VirtualMachine>) {
    s.revision += 1;
    // A new object has no strategy before it (KubeVirt's empty `status.runStrategy`).
    let strategy_before = match event {
        Event::VmCreated(_) => None,
        _ => s.run_strategy(),
    };
    match event {
        Event::VmCreated(e) => {
            s.existence = Existence::Live;
            // A new object (also one re-created under a deleted one's name): generation 1.
            s.generation = 1;
            s.uid = Some(e.uid);
            s.namespace.clone_from(&e.namespace);
            s.name.clone_from(&e.name);
            s.origin = Some(e.origin);
            s.vm = decided
                .or_else(|| parse_json(&e.manifest_json, &mut s.unreadable_events))
                .map(Arc::new);
            s.firmware = Some(FirmwareIdentity {
                uuid: e.firmware_uuid,
                serial: e.firmware_serial.clone(),
                origin: e.firmware_origin,
            });
            s.instancetype = None;
            s.preference = None;
            s.run = RunState::default();
            s.deletion = None;
        }
        Event::VmSpecEdited(e) => {
            s.generation += 1;
            if let Some(vm) = decided.or_else(|| {
                parse_json::<VirtualMachine>(&e.manifest_json, &mut s.unreadable_events)
            }) {
                if vm.spec.instancetype.is_none() {
                    s.instancetype = None;
                }
                if vm.spec.preference.is_none() {
                    s.preference = None;
                }
                s.vm = Some(Arc::new(vm));
            }
        }
        Event::FirmwareUuidAssigned(e) => {
            s.firmware = Some(FirmwareIdentity {
                uuid: e.uuid,
                serial: e.serial.clone(),
                origin: e.origin,
            });
        }
        Event::InstancetypeRevisionCaptured(e) => {
            s.instancetype = captured(e, &mut s.unreadable_events).map(Box::new);
        }
        Event::PreferenceRevisionCaptured(e) => {
            s.preference = captured(e, &mut s.unreadable_events).map(Box::new);
        }
        Event::VmDeleted(_) => {
            s.existence = Existence::Deleted;
            s.deletion = None;
            s.run.start_requested = false;
            s.run.restart_requested = false;
        }
        Event::VmDeletionRequested(e) => {
            s.deletion = Some(DeletionRequest {
                at_ms: e.at_ms,
                vmi_uid: e.vmi_uid,
            });
            // Nothing starts again: the VMI is only stopped.
            s.run.start_requested = false;
            s.run.restart_requested = false;
        }
        Event::VmStartRequested(e) => {
            s.run.start_paused = e.paused;
            if let Some(rs) = &e.run_strategy_after {
                set_run_strategy(s, rs);
            } else {
                s.run.start_requested = true;
            }
        }
        Event::VmStopRequested(e) => {
            s.run.stop_requested_for = e.vmi_uid;
            s.run.start_requested = false;
            s.run.restart_requested = false;
            if let Some(rs) = &e.run_strategy_after {
                set_run_strategy(s, rs);
            }
        }
        Event::VmRestartRequested(e) => {
            s.run.stop_requested_for = Some(e.vmi_uid);
            s.run.restart_requested = true;
        }
        Event::VmiLaunched(e) => {
            s.run.vmi = Some(VmiRun {
                uid: e.vmi_uid,
                phase: VmiPhase::Pending,
                node: None,
                reason: None,
                message: None,
                reached_running: false,
                paused: e.paused,
                launched_at_ms: e.at_ms,
                vm_generation: e.vm_generation,
                observed_generation: e.vm_generation,
                firmware_uuid: s.firmware.as_ref().map(|f| f.uuid),
                started: Arc::new(started_spec(s)),
            });
            s.run.start_requested = false;
            s.run.start_paused = false;
            s.run.restart_requested = false;
            s.run.stop_requested_for = None;
            s.run.backoff_until_ms = None;
            s.run.launches += 1;
        }
        Event::VmiScheduled(e) => {
            if let Some(v) = s.run.vmi.as_mut().filter(|v| v.uid == e.vmi_uid) {
                v.node = Some(e.node.clone());
                if !v.phase.is_final() && v.phase < VmiPhase::Scheduled {
                    v.phase = VmiPhase::Scheduled;
                }
            }
        }
        Event::VmiPhaseObserved(e) => {
            if let Some(v) = s.run.vmi.as_mut().filter(|v| v.uid == e.vmi_uid) {
                v.phase = e.phase;
                v.reason.clone_from(&e.reason);
                v.message.clone_from(&e.message);
                if e.phase == VmiPhase::Running {
                    v.reached_running = true;
                    s.run.consecutive_failures = 0;
                    s.run.backoff_until_ms = None;
                    s.run.last_start_failure = None;
                }
            }
        }
        Event::VmiRemoved(e) => {
            if let Some(v) = s.run.vmi.take_if(|v| v.uid == e.vmi_uid) {
                let rerun = v.phase == VmiPhase::Failed
                    && s.run_strategy() == Some(RunStrategy::RerunOnFailure)
                    && s.run.stop_requested_for != Some(v.uid);
                if s.run.restart_requested || rerun {
                    s.run.start_requested = true;
                }
                s.run.restart_requested = false;
                s.run.stop_requested_for = None;
            }
        }
        Event::VmStartBackoffScheduled(e) => {
            s.run.consecutive_failures = e.consecutive_failures;
            s.run.backoff_until_ms = Some(e.retry_at_ms);
            // Decided with the final phase of the VMI that failed (`observe`), which is still
            // the current run: its reason and message are the crash loop's latest cause.
            s.run.last_start_failure = s
                .run
                .vmi
                .as_ref()
                .filter(|v| v.phase.is_final() && !v.reached_running)
                .map(|v| StartFailureCause {
                    vmi_uid: v.uid,
                    reason: v.reason.clone(),
                    message: v.message.clone(),
                });
        }
        // Events of other streams never reach a VM stream; folding one changes nothing.
        Event::VmiCreated(_)
        | Event::VmiDeleted(_)
        | Event::ObjectCreated(_)
        | Event::ObjectUpdated(_)
        | Event::ObjectDeleted(_)
        | Event::SnapshotTaken(_)
        | Event::SnapshotFailed(_)
        | Event::RestoreTargetFoundRunning(_)
        | Event::RestoreStarted(_)
        | Event::RestoreCompleted(_)
        | Event::RestoreFailed(_)
        | Event::CloneStarted(_)
        | Event::CloneSucceeded(_)
        | Event::CloneFailed(_)
        | Event::LogPositionVoided(_) => {}
    }
    if matches!(
        event,
        Event::VmCreated(_)
            | Event::VmSpecEdited(_)
            | Event::InstancetypeRevisionCaptured(_)
            | Event::PreferenceRevisionCaptured(_)
    ) {
        s.requested = Requested::default();
    }
    let observes_more = s.run.vmi.as_ref().is_some_and(|v| {
        v.observed_generation < s.generation && lifecycle::runs_current_spec(s, v)
    });
    if observes_more && let Some(v) = s.run.vmi.as_mut() {
        v.observed_generation = s.generation;
    }
    // KubeVirt's RerunOnFailure starts a VM without a VMI "when coming here from a different
    // RunStrategy" (its last seen `status.runStrategy` differs): on creation, and on an edit
    // that switches to it. With a VMI (running or ended) the switch starts nothing.
    let strategy_after = s.run_strategy();
    if strategy_after == Some(RunStrategy::RerunOnFailure)
        && strategy_before != strategy_after
        && s.run.vmi.is_none()
        && s.is_live()
    {
        s.run.start_requested = true;
    }
    // KubeVirt clears `status.startFailure` under a strategy that never restarts a VMI by
    // itself (kubevirt.md §4.1): a crash loop ends when a stop halts the VM, or an edit makes
    // it Halted or Manual, and a later start counts its failures from none.
    if matches!(
        strategy_after,
        Some(RunStrategy::Halted | RunStrategy::Manual)
    ) {
        s.run.consecutive_failures = 0;
        s.run.backoff_until_ms = None;
        s.run.last_start_failure = None;
    }
}

/// The features the VM's next VMI would request: its spec expanded with the captured
/// instancetype and preference, or the stored spec if that cannot be expanded.
fn requested_of(s: &VmState) -> Vec<FeatureUse> {
    match s.expand_vmi_spec() {
        // What `vm_features_requested` of the expanded VM reads, without the rest of the VM.
        Ok(spec) => features::template_features_requested(&spec),
        Err(_) => {
            s.vm.as_deref()
                .map(features::vm_features_requested)
                .unwrap_or_default()
        }
    }
}

/// Folds a whole stream.
pub fn fold<'a>(events: impl IntoIterator<Item = &'a Event>) -> VmState {
    events.into_iter().fold(VmState::default(), evolve)
}

fn parse_json<T: serde::de::DeserializeOwned>(text: &str, unreadable: &mut u64) -> Option<T> {
    match serde_json::from_str(text) {
        Ok(v) => Some(v),
        Err(_) => {
            *unreadable += 1;
            None
        }
    }
}

fn captured<T: serde::de::DeserializeOwned>(
    e: &RevisionCaptured,
    unreadable: &mut u64,
) -> Option<Captured<T>> {
    let object = parse_json(&e.object_json, unreadable)?;
    let kind = Kind::ALL.into_iter().find(|k| k.as_str() == e.kind)?;
    Some(Captured {
        kind,
        name: e.name.clone(),
        source_uid: e.source_uid.clone(),
        source_generation: e.source_generation,
        object,
    })
}

fn started_spec(s: &VmState) -> StartedSpec {
    let template_spec = s.vm.as_ref().and_then(|v| v.vmi_spec().cloned());
    let expanded = s.expand().ok();
    let requested = match (&expanded, &template_spec) {
        (Some(vm), _) => features::vm_features_requested(vm),
        (None, Some(spec)) => features::template_features_requested(spec),
        (None, None) => Vec::new(),
    };
    StartedSpec {
        template_spec,
        instancetype: s.instancetype.as_deref().map(Captured::revision),
        preference: s.preference.as_deref().map(Captured::revision),
        expanded,
        requested,
    }
}

fn set_run_strategy(s: &mut VmState, rs: &str) {
    if let Some(vm) = s.vm.as_mut().map(Arc::make_mut) {
        if vm.spec.running.is_some() {
            vm.spec.running = Some(rs == "Always");
        } else {
            vm.spec.run_strategy = Some(rs.to_owned());
        }
        s.generation += 1;
    }
}

fn already_exists(s: &VmState) -> Rejection {
    Rejection::one(
        Category::AlreadyExists,
        Cause::new(
            "metadata.name",
            codes::ALREADY_EXISTS,
            format!("virtualmachines.kubevirt.io \"{}\" already exists", s.name),
        ),
    )
}

/// `metadata.deletionTimestamp` of a Terminating VM (RFC 3339, as Kubernetes writes it).
fn deletion_time(d: &DeletionRequest) -> String {
    crate::aggregate::dataprotection::rfc3339(d.at_ms)
        .unwrap_or_else(|| format!("{} ms since the epoch", d.at_ms))
}

/// What to run to wait until the Terminating VM `s` is gone.
fn wait_for_deletion(s: &VmState) -> String {
    format!(
        "`vmplane wait --for=delete vm {} -n {}`",
        s.name, s.namespace
    )
}

/// A create or apply of a name whose VM is being deleted: `AlreadyExists`, as Kubernetes
/// refuses to create an object whose name is still held by one being deleted.
fn exists_while_terminating(s: &VmState, d: &DeletionRequest) -> Rejection {
    Rejection::one(
        Category::AlreadyExists,
        Cause::new(
            "metadata.name",
            codes::BEING_DELETED,
            format!(
                "virtualmachines.kubevirt.io \"{}\" already exists and is being deleted \
                 (since {}; it goes once its VMI has stopped): wait until it is gone with {}, \
                 then apply again",
                s.name,
                deletion_time(d),
                wait_for_deletion(s)
            ),
        ),
    )
}

/// `request` (`an edit`, `a start request`, …) of a VM being deleted.
fn refused_while_terminating(s: &VmState, d: &DeletionRequest, request: &str) -> Rejection {
    Rejection::precondition(
        codes::BEING_DELETED,
        format!(
            "virtualmachines.kubevirt.io \"{}\" is being deleted (since {}; it goes once its \
             VMI has stopped): {request} is refused; wait until it is gone with {}, then create \
             it again",
            s.name,
            deletion_time(d),
            wait_for_deletion(s)
        ),
    )
}

/// A snapshot of the VM `s`, being deleted, refused ([`crate::snapshot`]).
pub(crate) fn snapshot_while_terminating(s: &VmState) -> Option<Rejection> {
    let d = s.terminating()?;
    Some(refused_while_terminating(s, d, "a snapshot of it"))
}

fn not_found(s: &VmState) -> Rejection {
    Rejection::not_found(
        "metadata.name",
        codes::NOT_FOUND,
        format!("virtualmachines.kubevirt.io \"{}\" not found", s.name),
    )
}

fn check_generation(s: &VmState, expected: Option<u64>) -> Result<(), Rejection> {
    match expected {
        Some(g) if g != s.generation => Err(Rejection::conflict(g, s.generation)),
        _ => Ok(()),
    }
}

/// The gateway's rejection when the store refused a firmware-UUID claim (row 7).
impl Rejection {
    /// `AlreadyExists`. The stream that holds the UUID is the cause's [`Holder`]: its reason
    /// says "another object", and names the holder only where it is worded for a reader who
    /// may read the holder's namespace ([`Rejection::describe_for`]).
    pub fn firmware_uuid_taken(uuid: &str, holder: &str) -> Rejection {
        let mut cause = Cause::new(
            "spec.template.spec.domain.firmware.uuid",
            codes::FIRMWARE_UUID_TAKEN,
            format!("firmware UUID {uuid} is already used by another object"),
        );
        // `vm/<namespace>/<name>` (core's stream names: neither part holds a `/`).
        let namespace = match holder.split('/').collect::<Vec<_>>()[..] {
            [_, namespace, _] if !namespace.is_empty() => Some(namespace.to_owned()),
            _ => None,
        };
        cause.holder = Some(crate::error::Holder {
            stream: holder.to_owned(),
            namespace,
            reason: format!("firmware UUID {uuid} is already used by {holder}"),
        });
        Rejection::one(Category::AlreadyExists, cause)
    }
}

#[allow(clippy::too_many_arguments)]
fn resolve<T: Clone + PartialEq>(
    wanted: Option<&(Kind, String)>,
    current: Option<&Captured<T>>,
    provided: Option<&T>,
    recapture: bool,
    provided_id: impl Fn(&T) -> (Option<Kind>, String),
    field: &str,
    code: &'static str,
    c: &mut Causes,
) -> (Option<T>, bool) {
    let Some((kind, name)) = wanted else {
        return (None, false);
    };
    if let Some(cur) = current
        && cur.kind == *kind
        && &cur.name == name
    {
        if recapture
            && let Some(obj) = provided
            && provided_id(obj) == (Some(*kind), name.clone())
            && *obj != cur.object
        {
            return (Some(obj.clone()), true);
        }
        return (Some(cur.object.clone()), false);
    }
    match provided {
        Some(obj) if provided_id(obj) == (Some(*kind), name.clone()) => (Some(obj.clone()), true),
        _ => {
            c.push(
                Category::NotFound,
                Cause::new(
                    field,
                    code,
                    format!(
                        "{}.instancetype.kubevirt.io \"{name}\" not found",
                        kind.as_str().to_ascii_lowercase() + "s"
                    ),
                ),
            );
            (None, false)
        }
    }
}

/// KubeVirt's rule for an update of a matcher that pins a revision (kubevirt.md §2.3, its VM
/// mutator's `validateMatcherUpdate`): when the stored matcher has a `revisionName` and the
/// update changes the matcher's `name` but not its `revisionName`, the pinned revision would
/// name another object's revision. Refused at `spec.instancetype.revisionName` (and the
/// preference's); adding or removing a matcher is no such change.
fn matcher_updates(old: &VirtualMachine, new: &VirtualMachine, c: &mut Causes) {
    let pairs = [
        (
            &old.spec.instancetype,
            &new.spec.instancetype,
            "spec.instancetype.revisionName",
        ),
        (
            &old.spec.preference,
            &new.spec.preference,
            "spec.preference.revisionName",
        ),
    ];
    for (before, after, field) in pairs {
        let (Some(before), Some(after)) = (before, after) else {
            continue;
        };
        let pinned = before.revision_name.as_deref().unwrap_or("");
        let renamed = before.name.as_deref().unwrap_or("") != after.name.as_deref().unwrap_or("");
        if !pinned.is_empty() && renamed && before.revision_name == after.revision_name {
            c.invalid(
                field,
                codes::INVALID_VALUE,
                "the Matcher Name has been updated without updating the RevisionName",
            );
        }
    }
}

fn put(state: &VmState, p: &PutVm, ctx: &mut Ctx) -> Result<Decision, Rejection> {
    check_generation(state, p.expected_generation)?;
    let mut vm = p.vm.clone();
    defaults::normalize_vm(&mut vm);
    let name = vm.metadata.name.clone().unwrap_or_default();
    let namespace = vm.metadata.namespace.clone().unwrap_or_default();
    if state.existence != Existence::Never && (name != state.name || namespace != state.namespace) {
        return Err(Rejection::invalid(
            "metadata.name",
            codes::NAME_MISMATCH,
            format!(
                "manifest names {namespace}/{name}, but the stream is {}",
                state.stream()
            ),
        ));
    }
    let live = state.is_live();
    // Row 6: a manifest without a UUID (or serial) keeps the effective one.
    if live && let Some(fw) = &state.firmware {
        let f = vm.firmware_mut();
        if f.uuid.is_none() {
            f.uuid = Some(fw.uuid.to_string());
        }
        if f.serial.is_none() {
            f.serial.clone_from(&fw.serial);
        }
    }

    let mut c = Causes::new();
    if let Err(r) = validate::vm(&vm) {
        c.extend(r);
    }
    if !live
        && let Some(features) = &p.features
        && let Err(r) = crate::features::check_vm_discontinued(features, &vm)
    {
        c.extend(r);
    }
    if live && let Some(old) = state.vm.as_deref() {
        matcher_updates(old, &vm, &mut c);
    }
    let refs = references(&vm);
    let id = |k: &str, api: &str, n: &Option<String>| {
        (Kind::from_api(api, k), n.clone().unwrap_or_default())
    };
    let (it, it_new) = resolve(
        refs.instancetype.as_ref(),
        state.instancetype.as_deref().filter(|_| live),
        p.instancetype.as_ref(),
        p.recapture_revisions,
        |o: &Instancetype| id(&o.kind, &o.api_version, &o.metadata.name),
        "spec.instancetype.name",
        codes::INSTANCETYPE_NOT_FOUND,
        &mut c,
    );
    let (pref, pref_new) = resolve(
        refs.preference.as_ref(),
        state.preference.as_deref().filter(|_| live),
        p.preference.as_ref(),
        p.recapture_revisions,
        |o: &Preference| id(&o.kind, &o.api_version, &o.metadata.name),
        "spec.preference.name",
        codes::PREFERENCE_NOT_FOUND,
        &mut c,
    );
    if c.is_empty()
        && let Err(r) = instancetype::check(
            &vm,
            it.as_ref().map(|o| &o.spec),
            pref.as_ref().map(|o| &o.spec),
        )
    {
        c.extend(r);
    }
    c.finish()?;

    let mut em = Emitter::new(state.clone(), evolve);
    let stream = streams::vm(&namespace, &name);
    if live {
        let spec_changed = spec_changed(state.vm.as_deref(), &vm);
        if !spec_changed && !it_new && !pref_new {
            return Ok(Decision::unchanged());
        }
        let json = to_json(&vm);
        let fw = vm.firmware().cloned().unwrap_or_default();
        if spec_changed {
            em.emit_evolved(
                Event::VmSpecEdited(VmSpecEdited {
                    manifest_json: json,
                }),
                |s, e| evolve_decided(s, e, vm),
            );
        }
        let uuid = fw
            .uuid
            .as_deref()
            .and_then(|u| uuid::Uuid::parse_str(u).ok());
        if let (Some(cur), Some(new_uuid)) = (&state.firmware, uuid)
            && (cur.uuid != new_uuid || cur.serial != fw.serial)
        {
            let origin = if cur.uuid != new_uuid {
                p.identity_origin.unwrap_or(FirmwareOrigin::UserSpecified)
            } else {
                cur.origin
            };
            em.emit(Event::FirmwareUuidAssigned(FirmwareUuidAssigned {
                uuid: new_uuid,
                serial: fw.serial.clone(),
                origin,
                previous: Some(cur.uuid),
            }));
            if cur.uuid != new_uuid {
                // A running VMI still has the old UUID: it stays held until the VMI is
                // removed (`observe`).
                if !runs_with(state, cur.uuid) {
                    em.claim(Claim::Release {
                        key: claim_key(&cur.uuid),
                        owner: stream.clone(),
                    });
                }
                em.claim(Claim::Acquire {
                    key: claim_key(&new_uuid),
                    owner: stream.clone(),
                });
            }
        }
    } else {
        let uid = ctx.new_uuid_v4();
        let given = vm
            .firmware()
            .and_then(|f| f.uuid.as_deref())
            .and_then(|u| uuid::Uuid::parse_str(u).ok());
        let (fw_uuid, fw_origin) = match (given, p.origin) {
            (Some(u), _) => (
                u,
                p.identity_origin.unwrap_or(FirmwareOrigin::UserSpecified),
            ),
            (None, CreateOrigin::Import) => (legacy_firmware_uuid(&name), FirmwareOrigin::Legacy),
            (None, _) => (ctx.new_uuid_v4(), FirmwareOrigin::Generated),
        };
        let serial = match (vm.firmware().and_then(|f| f.serial.clone()), p.origin) {
            (Some(s), _) => Some(s),
            // An imported VM never had a serial: inventing one would change what its guest sees.
            (None, CreateOrigin::Import) => None,
            (None, _) => Some(ctx.new_uuid_v4().to_string()),
        };
        let f = vm.firmware_mut();
        f.uuid = Some(fw_uuid.to_string());
        f.serial.clone_from(&serial);
        em.emit_evolved(
            Event::VmCreated(VmCreated {
                uid,
                namespace: namespace.clone(),
                name: name.clone(),
                origin: p.origin,
                manifest_json: to_json(&vm),
                firmware_uuid: fw_uuid,
                firmware_serial: serial,
                firmware_origin: fw_origin,
            }),
            |s, e| evolve_decided(s, e, vm),
        );
        em.claim(Claim::Acquire {
            key: claim_key(&fw_uuid),
            owner: stream.clone(),
        });
    }
    if it_new && let Some(o) = &it {
        em.emit(Event::InstancetypeRevisionCaptured(revision_captured(
            &o.kind,
            &o.metadata,
            to_json(o),
        )));
    }
    if pref_new && let Some(o) = &pref {
        em.emit(Event::PreferenceRevisionCaptured(revision_captured(
            &o.kind,
            &o.metadata,
            to_json(o),
        )));
    }
    Ok(em.finish_vm(if live {
        Outcome::Configured
    } else {
        Outcome::Created
    }))
}

/// Whether `after` changes the stored VM `before`, compared as typed objects, without JSON
/// trees: a key written in another order is no change (the maps of other fields, `JsonMap`,
/// compare without regard to order), nor a quantity written another way with the same value
/// (`1Gi` and `1024Mi`: Kubernetes stores a quantity by its value, so re-applying either over
/// the other bumps no generation there either). Beyond quantities, objects that differ as types
/// differ as JSON: every optional field is left out only when it is `None`, so `None` and
/// `Some(x)` serialize differently; no other field is skipped or serialized by hand; no enum is
/// untagged; and a parsed object never holds a typed field's key in a map of other fields
/// (serde puts a known key in its field), the one way two typed objects could give one JSON
/// value. Debug builds (the test suite) check that on every decision.
fn spec_changed(before: Option<&VirtualMachine>, after: &VirtualMachine) -> bool {
    let changed = before != Some(after);
    debug_assert!(
        !changed || json_differs(before, after),
        "two VMs differ as types but not as JSON: a type changed how it serializes"
    );
    changed
}

/// Whether the JSON values of `before` and `after` differ.
fn json_differs(before: Option<&VirtualMachine>, after: &VirtualMachine) -> bool {
    let before = before.map(serde_json::to_value).and_then(Result::ok);
    before != serde_json::to_value(after).ok()
}

fn revision_captured(
    kind: &str,
    meta: &crate::types::ObjectMeta,
    object_json: String,
) -> RevisionCaptured {
    RevisionCaptured {
        kind: kind.to_owned(),
        name: meta.name_str().to_owned(),
        source_uid: meta.uid.clone(),
        source_generation: meta
            .generation
            .and_then(|g| u64::try_from(g).ok())
            .unwrap_or(0),
        object_json,
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> String {
    // Typed objects with string keys always serialize.
    serde_json::to_string(v).unwrap_or_default()
}

/// KubeVirt's VM deletion: a VM whose VMI is active keeps a finalizer until the VMI is gone.
/// Here the delete is recorded as a [`VmDeletionRequested`] (the VM is Terminating, its VMI
/// stopped gracefully by the reconciler) and the VM's `VmDeleted` follows with the VMI's
/// removal ([`observe`]); a VM without an active VMI is deleted at once. A delete of a
/// Terminating VM is accepted and changes nothing.
fn delete(state: &VmState, expected: Option<u64>, ctx: &mut Ctx) -> Result<Decision, Rejection> {
    if !state.exists() {
        return Err(not_found(state));
    }
    check_generation(state, expected)?;
    if state.terminating().is_some() {
        return Ok(Decision::unchanged());
    }
    let mut em = Emitter::new(state.clone(), evolve);
    if let Some(vmi) = state.active_vmi() {
        em.emit(Event::VmDeletionRequested(VmDeletionRequested {
            uid: state.uid.unwrap_or_default(),
            vmi_uid: vmi.uid,
            at_ms: ctx.now_ms(),
        }));
        return Ok(em.finish_vm(Outcome::Deleted));
    }
    emit_deleted(state, &mut em);
    Ok(em.finish_vm(Outcome::Deleted))
}

/// `VmDeleted` of `state`'s VM, with its claims released: its effective firmware UUID, and
/// the one its VMI (ended, not yet removed) still had since an edit changed the VM's (a VM
/// re-created under this name starts with no run to release it later).
fn emit_deleted(state: &VmState, em: &mut Emitter<VmState>) {
    em.emit(Event::VmDeleted(VmDeleted {
        uid: state.uid.unwrap_or_default(),
    }));
    if let Some(fw) = &state.firmware {
        em.claim(Claim::Release {
            key: claim_key(&fw.uuid),
            owner: state.stream(),
        });
    }
    if let Some(held) = held_by_run(state) {
        em.claim(Claim::Release {
            key: claim_key(&held),
            owner: state.stream(),
        });
    }
}

/// Whether the VM's active VMI runs with firmware UUID `uuid`.
fn runs_with(state: &VmState, uuid: Uuid) -> bool {
    state
        .active_vmi()
        .is_some_and(|v| v.firmware_uuid == Some(uuid))
}

/// The UUID the VM's current VMI (active or ended, not yet removed) holds besides the VM's
/// own effective one: the one it was launched with, when an edit changed the VM's since.
fn held_by_run(state: &VmState) -> Option<Uuid> {
    let run = state.run.vmi.as_ref()?.firmware_uuid?;
    (state.firmware.as_ref().map(|f| f.uuid) != Some(run)).then_some(run)
}

fn live_strategy(state: &VmState, request: &str) -> Result<RunStrategy, Rejection> {
    if let Some(d) = state.terminating() {
        return Err(refused_while_terminating(state, d, request));
    }
    if !state.is_live() {
        return Err(not_found(state));
    }
    state.run_strategy().ok_or_else(|| {
        Rejection::precondition(codes::RUN_STRATEGY_INVALID, "VM has no valid run strategy")
    })
}

/// KubeVirt's start subresource rules (kubevirt.md §4.1).
fn start(state: &VmState, paused: bool) -> Result<Decision, Rejection> {
    let rs = live_strategy(state, "a start request")?;
    if state.active_vmi().is_some() {
        return Err(Rejection::precondition(
            codes::START_NOT_ALLOWED,
            "VM is already running",
        ));
    }
    let last_failed = state
        .run
        .vmi
        .as_ref()
        .is_some_and(|v| v.phase == VmiPhase::Failed);
    let event = match rs {
        RunStrategy::Always | RunStrategy::Once => {
            return Err(Rejection::precondition(
                codes::START_NOT_ALLOWED,
                format!("{} does not support manual start requests", rs.as_str()),
            ));
        }
        RunStrategy::RerunOnFailure if last_failed => {
            return Err(Rejection::precondition(
                codes::START_NOT_ALLOWED,
                "RerunOnFailure does not support starting VM from failed state",
            ));
        }
        RunStrategy::Halted => VmStartRequested {
            paused,
            run_strategy_after: Some(RunStrategy::Always.as_str().to_owned()),
        },
        RunStrategy::Manual | RunStrategy::RerunOnFailure => VmStartRequested {
            paused,
            run_strategy_after: None,
        },
    };
    let mut em = Emitter::new(state.clone(), evolve);
    em.emit(Event::VmStartRequested(event));
    Ok(em.finish_vm(Outcome::Recorded))
}

/// KubeVirt's stop subresource rules.
fn stop(state: &VmState) -> Result<Decision, Rejection> {
    let rs = live_strategy(state, "a stop request")?;
    let active = state.active_vmi().map(|v| v.uid);
    let event = match rs {
        RunStrategy::Always | RunStrategy::Once => VmStopRequested {
            vmi_uid: active,
            run_strategy_after: Some(RunStrategy::Halted.as_str().to_owned()),
        },
        RunStrategy::Halted | RunStrategy::Manual | RunStrategy::RerunOnFailure => match active {
            None => {
                return Err(Rejection::precondition(
                    codes::STOP_NOT_ALLOWED,
                    "VM is not running",
                ));
            }
            Some(uid)
                if state.run.stop_requested_for == Some(uid) && !state.run.restart_requested =>
            {
                return Ok(Decision::unchanged());
            }
            Some(uid) => VmStopRequested {
                vmi_uid: Some(uid),
                run_strategy_after: None,
            },
        },
    };
    let mut em = Emitter::new(state.clone(), evolve);
    em.emit(Event::VmStopRequested(event));
    Ok(em.finish_vm(Outcome::Recorded))
}

/// KubeVirt's restart subresource rules.
fn restart(state: &VmState) -> Result<Decision, Rejection> {
    let rs = live_strategy(state, "a restart request")?;
    match rs {
        RunStrategy::Halted => {
            return Err(Rejection::precondition(
                codes::RESTART_NOT_ALLOWED,
                "Halted does not support manual restart requests",
            ));
        }
        RunStrategy::Once => {
            return Err(Rejection::precondition(
                codes::RESTART_NOT_ALLOWED,
                "RunStategy Once does not support manual restart requests",
            ));
        }
        _ => {}
    }
    let Some(vmi) = state.active_vmi() else {
        return Err(Rejection::precondition(
            codes::RESTART_NOT_ALLOWED,
            "VM is not running",
        ));
    };
    let mut em = Emitter::new(state.clone(), evolve);
    em.emit(Event::VmRestartRequested(VmRestartRequested {
        vmi_uid: vmi.uid,
    }));
    Ok(em.finish_vm(Outcome::Recorded))
}

fn launch(state: &VmState, features: &Features, ctx: &mut Ctx) -> Result<Decision, Rejection> {
    let action = lifecycle::desired_action(state, features, ctx.now_ms());
    if let DesiredAction::FeatureNotEnabled { .. } = action {
        return Err(Rejection::precondition(
            codes::FEATURE_NOT_ENABLED,
            crate::features::not_enabled_message(&lifecycle::feature_blockers(state, features)),
        ));
    }
    if action != DesiredAction::Launch {
        return Err(Rejection::precondition(
            codes::LAUNCH_NOT_WANTED,
            format!("no VMI should be launched now (desired: {action:?})"),
        ));
    }
    state.expand()?;
    let mut em = Emitter::new(state.clone(), evolve);
    em.emit(Event::VmiLaunched(VmiLaunched {
        vmi_uid: ctx.new_uuid_v4(),
        vm_generation: state.generation,
        paused: state.run.start_paused,
        at_ms: ctx.now_ms(),
    }));
    Ok(em.finish_vm(Outcome::Recorded))
}

fn observe(
    state: &VmState,
    vmi_uid: Uuid,
    obs: &VmiObservation,
    ctx: &mut Ctx,
) -> Result<Decision, Rejection> {
    let Some(vmi) = state.run.vmi.as_ref().filter(|v| v.uid == vmi_uid) else {
        return Err(Rejection::precondition(
            codes::STALE_OBSERVATION,
            format!("VMI {vmi_uid} is not the VM's current VMI"),
        ));
    };
    let now = ctx.now_ms();
    let mut em = Emitter::new(state.clone(), evolve);
    match obs {
        VmiObservation::Removed => {
            em.emit(Event::VmiRemoved(VmiRemoved {
                vmi_uid,
                at_ms: now,
            }));
            if state.terminating().is_some() {
                // The VMI a deletion waited for is gone: the VM is deleted with it, in the
                // same decision (the VM's claims released as `delete` releases them; the
                // removal above already took the run, so the UUID it held is released here).
                if let Some(held) = held_by_run(state) {
                    em.claim(Claim::Release {
                        key: claim_key(&held),
                        owner: state.stream(),
                    });
                }
                em.emit(Event::VmDeleted(VmDeleted {
                    uid: state.uid.unwrap_or_default(),
                }));
                if let Some(fw) = &state.firmware {
                    em.claim(Claim::Release {
                        key: claim_key(&fw.uuid),
                        owner: state.stream(),
                    });
                }
                return Ok(em.finish_vm(Outcome::Deleted));
            }
            // The guest is gone: the UUID it kept since an edit is free.
            if state.is_live()
                && let Some(held) = held_by_run(state)
            {
                em.claim(Claim::Release {
                    key: claim_key(&held),
                    owner: state.stream(),
                });
            }
        }
        VmiObservation::Scheduled { node } => {
            if vmi.phase.is_final() {
                return Err(stale_final(vmi));
            }
            if vmi.node.as_deref() == Some(node) && vmi.phase >= VmiPhase::Scheduled {
                return Ok(Decision::unchanged());
            }
            em.emit(Event::VmiScheduled(VmiScheduled {
                vmi_uid,
                node: node.clone(),
                at_ms: now,
            }));
        }
        VmiObservation::Phase {
            phase,
            reason,
            message,
        } => {
            if *phase == vmi.phase && *reason == vmi.reason && *message == vmi.message {
                return Ok(Decision::unchanged());
            }
            if vmi.phase.is_final() {
                return Err(stale_final(vmi));
            }
            if *phase < vmi.phase && *phase != VmiPhase::Unknown && vmi.phase != VmiPhase::Unknown {
                return Err(Rejection::precondition(
                    codes::STALE_OBSERVATION,
                    format!(
                        "VMI {vmi_uid} cannot go back from {} to {}",
                        vmi.phase.as_str(),
                        phase.as_str()
                    ),
                ));
            }
            em.emit(Event::VmiPhaseObserved(VmiPhaseObserved {
                vmi_uid,
                phase: *phase,
                reason: reason.clone(),
                message: message.clone(),
                at_ms: now,
            }));
            let counts = matches!(
                state.run_strategy(),
                Some(RunStrategy::Always | RunStrategy::RerunOnFailure | RunStrategy::Once)
            );
            // A VMI stopped on request, or because its VM is deleted or being deleted, did not
            // crash: no backoff (and none is scheduled for a VM that is going).
            let stopped_on_purpose =
                state.run.stop_requested_for == Some(vmi_uid) || !state.is_live();
            if phase.is_final() && !vmi.reached_running && counts && !stopped_on_purpose {
                let failures = state.run.consecutive_failures.saturating_add(1);
                let delay_ms = lifecycle::backoff_delay_ms(failures, ctx);
                em.emit(Event::VmStartBackoffScheduled(VmStartBackoffScheduled {
                    consecutive_failures: failures,
                    retry_at_ms: now.saturating_add(delay_ms),
                }));
            }
        }
    }
    Ok(em.finish_vm(Outcome::Recorded))
}

fn stale_final(vmi: &VmiRun) -> Rejection {
    Rejection::precondition(
        codes::STALE_OBSERVATION,
        format!(
            "VMI {} already ended ({}); final phases are sticky",
            vmi.uid,
            vmi.phase.as_str()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::spec_changed;
    use crate::types::{Manifest, VirtualMachine, parse_manifest};

    fn vm(manifest: &str) -> VirtualMachine {
        match parse_manifest(manifest.as_bytes()) {
            Ok(Manifest::VirtualMachine(vm)) => *vm,
            other => panic!("not a VM: {other:?}"),
        }
    }

    const DEMO: &str = r#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine",
        "metadata":{"name":"demo","labels":{"a":"1","b":"2"}},
        "spec":{"runStrategy":"Halted","template":{"spec":{"domain":{"memory":{"guest":"64Mi"}},
        "x-unknown":{"p":1,"q":2}}}}}"#;

    #[test]
    fn the_same_manifest_again_is_no_change() {
        assert!(!spec_changed(Some(&vm(DEMO)), &vm(DEMO)));
    }

    #[test]
    fn keys_written_in_another_order_are_no_change() {
        let reordered = DEMO
            .replace(r#""a":"1","b":"2""#, r#""b":"2","a":"1""#)
            .replace(r#""p":1,"q":2"#, r#""q":2,"p":1"#);
        assert_ne!(reordered, DEMO);
        assert!(!spec_changed(Some(&vm(DEMO)), &vm(&reordered)));
    }

    #[test]
    fn an_edit_is_a_change_and_so_is_a_first_object() {
        let bigger = DEMO.replace("64Mi", "128Mi");
        assert!(spec_changed(Some(&vm(DEMO)), &vm(&bigger)));
        assert!(spec_changed(None, &vm(DEMO)));
    }

    #[test]
    fn a_quantity_written_another_way_with_the_same_value_is_no_change() {
        let respelled = DEMO.replace("64Mi", "65536Ki");
        assert!(super::json_differs(Some(&vm(DEMO)), &vm(&respelled)));
        assert!(!spec_changed(Some(&vm(DEMO)), &vm(&respelled)));
        assert!(spec_changed(
            Some(&vm(DEMO)),
            &vm(&DEMO.replace("64Mi", "65537Ki"))
        ));
    }

    #[test]
    fn a_parsed_object_holds_no_typed_key_among_its_other_fields() {
        // What would make the typed comparison disagree with the JSON one: `name` held in the
        // metadata's map of other fields. Parsing puts it in its field, wherever it is written.
        let written_last = DEMO.replace(r#""name":"demo","#, "").replace(
            r#""labels":{"a":"1","b":"2"}}"#,
            r#""labels":{"a":"1","b":"2"},"name":"demo"}"#,
        );
        assert_ne!(written_last, DEMO);
        let parsed = vm(&written_last);
        assert_eq!(parsed.metadata.name.as_deref(), Some("demo"));
        assert!(!parsed.metadata.extra.contains_key("name"));
        assert!(!spec_changed(Some(&vm(DEMO)), &parsed));
        assert!(!super::json_differs(Some(&vm(DEMO)), &parsed));
    }
}
