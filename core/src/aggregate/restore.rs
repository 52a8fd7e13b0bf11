//! The VirtualMachineRestore aggregate (`snapshot.kubevirt.io/v1beta1`): stream
//! `restore/<ns>/<name>`.
//!
//! A restore puts a snapshot's VM back, onto the same VM (the live target is the snapshot's
//! source: same uid) or into a new VM (the target does not exist). Restoring onto another
//! existing VM fails as in KubeVirt ("restore source and restore target are different but
//! restore target already exists"). Identity follows semantics §1:
//!
//! * row 9 — same VM: the snapshot's UUID and serial; a snapshot without a UUID (imported from
//!   KubeVirt) gives the legacy value of the VM name;
//! * row 10 — new VM: the snapshot's UUID only if no live VM holds it (the gateway passes the
//!   holder, [`RestoreInput::uuid_holder`]; the target's `firmware-uuid/<uuid>` claim settles
//!   races atomically); otherwise a new UUID, serial and MACs, recorded in `RestoreStarted`
//!   and shown in `status.targetIdentity`.
//!
//! ## The saga (two streams cannot be appended atomically)
//!
//! 1. `Progress` (creating the restore, or continuing it): the decision's events go to
//!    `restore/<ns>/<name>`. While the target runs, the `targetReadinessPolicy` applies:
//!    `WaitGracePeriod` (default: wait [`RESTORE_TARGET_GRACE_PERIOD_SECONDS`] from the first
//!    time the target was found running, then fail), `StopTarget` (ask the VM to stop, then
//!    wait), `FailImmediate`, `WaitEventually`. Once the target is not running it records
//!    `RestoreStarted` (the whole VM to put, identity included).
//! 2. The gateway decides [`SagaDecision::next`]'s command on `vm/<ns>/<target>` (a `Create`
//!    for a new VM with `identity_origin` and `CreateOrigin::Restore`, an `Update` at the
//!    expected generation for the same VM, or a `Stop` for `StopTarget`) and appends it.
//! 3. `Progress` again with the reloaded target: the target carries the restore's
//!    `restore.kubevirt.io/lastRestoreUID` annotation → `RestoreCompleted`. If step 2 was
//!    refused, `TargetRejected` → `RestoreFailed`.
//!
//! Every step is idempotent: a retry after a crash between steps 1 and 2 returns the same
//! command (rebuilt from `RestoreStarted`, not from fresh randomness); between steps 2 and 3,
//! the annotation shows the command was applied.
//!
//! A restore is events, so it is audited, and undone by restoring an earlier snapshot again.
//! Not modelled: KubeVirt's "one restore in progress per target" admission check (it needs
//! every restore stream; the target's expected generation catches concurrent puts instead) and
//! its `status.restoreInProgress` on the VM, which blocks starting it meanwhile.

use std::ops::ControlFlow;

use serde::Deserialize;
use uuid::Uuid;

use super::dataprotection::{self, Next, ObjectRef, Saga, SagaDecision, condition, done, rfc3339};
use super::object::{self, ObjectState};
use super::snapshot::{SnapshotPhase, SnapshotState};
use super::vm::{PutVm, VmCommand, VmState};
use crate::ctx::Ctx;
use crate::decision::{Decision, streams};
use crate::error::{Causes, Rejection, codes};
use crate::event::*;
use crate::features::Features;
use crate::firmware::{self, AssignedIdentity, FirmwareOrigin, legacy_firmware_uuid};
use crate::jsonpatch::{self, PatchOp};
use crate::lifecycle;
use crate::limits::RESTORE_TARGET_GRACE_PERIOD_SECONDS;
use crate::types::{GenericObject, Kind, Manifest, VirtualMachine};

/// The annotation a restored VM carries: `<restore name>-<restore uid>` (KubeVirt's).
pub const LAST_RESTORE_ANNOTATION: &str = "restore.kubevirt.io/lastRestoreUID";

/// What a restore does while its target VM runs (`spec.targetReadinessPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum ReadinessPolicy {
    /// Wait up to the grace period for the target to stop, then fail (default).
    #[default]
    WaitGracePeriod,
    /// Stop the target, then restore.
    StopTarget,
    /// Fail at once.
    FailImmediate,
    /// Wait as long as it takes.
    WaitEventually,
}

impl ReadinessPolicy {
    /// The policy KubeVirt's word names ([`ReadinessPolicy::as_str`]), if any.
    pub fn from_word(word: &str) -> Option<ReadinessPolicy> {
        [
            ReadinessPolicy::WaitGracePeriod,
            ReadinessPolicy::StopTarget,
            ReadinessPolicy::FailImmediate,
            ReadinessPolicy::WaitEventually,
        ]
        .into_iter()
        .find(|p| p.as_str() == word)
    }

    /// KubeVirt's word.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadinessPolicy::WaitGracePeriod => "WaitGracePeriod",
            ReadinessPolicy::StopTarget => "StopTarget",
            ReadinessPolicy::FailImmediate => "FailImmediate",
            ReadinessPolicy::WaitEventually => "WaitEventually",
        }
    }
}

/// The typed part of a restore's spec.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreSpecView {
    /// The VM to restore into.
    #[serde(default)]
    pub target: ObjectRef,
    /// The snapshot to restore.
    #[serde(default)]
    pub virtual_machine_snapshot_name: String,
    /// What to do while the target runs.
    #[serde(default)]
    pub target_readiness_policy: Option<ReadinessPolicy>,
    /// JSON patches applied to a new target VM.
    #[serde(default)]
    pub patches: Vec<String>,
}

/// The folded state of a restore stream.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RestoreState {
    /// The object.
    pub object: ObjectState,
    /// When the target was first found running (the `WaitGracePeriod` clock).
    pub waiting_since_ms: Option<i64>,
    /// The VMIs found running, with whether a stop was requested for them.
    pub found_running: Vec<RestoreTargetFoundRunning>,
    /// The plan, once started.
    pub started: Option<Box<RestoreStarted>>,
    /// Completion.
    pub completed: Option<RestoreCompleted>,
    /// Failure.
    pub failed: Option<RestoreFailed>,
}

impl RestoreState {
    /// Whether the restore object exists.
    pub fn is_live(&self) -> bool {
        self.object.is_live()
    }

    /// Completed or failed.
    pub fn is_finished(&self) -> bool {
        self.completed.is_some() || self.failed.is_some()
    }

    /// The stored spec, if readable.
    pub fn spec(&self) -> Option<RestoreSpecView> {
        self.stored_spec()
    }

    /// `<name>-<uid>`: the value of [`LAST_RESTORE_ANNOTATION`] on the restored VM.
    pub fn marker(&self) -> String {
        format!(
            "{}-{}",
            self.object.name,
            self.object.uid.map(|u| u.to_string()).unwrap_or_default()
        )
    }
}

impl Saga for RestoreState {
    const KIND: Kind = Kind::VirtualMachineRestore;
    const NAME: &'static str = "restore";
    type Spec = RestoreSpecView;

    fn object(&self) -> &ObjectState {
        &self.object
    }

    fn finished(&self) -> bool {
        self.is_finished()
    }

    fn evolve(self, event: &Event) -> Self {
        evolve(self, event)
    }

    fn validate(manifest: &GenericObject) -> Result<Vec<PatchOp>, Rejection> {
        validate(manifest)
    }

    fn failed(reason: String, at_ms: i64) -> Event {
        Event::RestoreFailed(RestoreFailed { reason, at_ms })
    }
}

/// The streams the gateway must read for `Progress`, from the manifest (first step) or the
/// stored spec: `snapshot/<ns>/<spec.virtualMachineSnapshotName>` and
/// `vm/<ns>/<spec.target.name>`.
pub fn input_streams(
    state: &RestoreState,
    manifest: Option<&GenericObject>,
) -> Option<(String, String)> {
    let (spec, ns) = match manifest {
        Some(m) => (
            dataprotection::spec_view::<RestoreSpecView>(m).ok()?,
            m.metadata
                .namespace
                .clone()
                .unwrap_or_else(|| crate::defaults::DEFAULT_NAMESPACE.to_owned()),
        ),
        None => (state.spec()?, dataprotection::namespace_of(&state.object)),
    };
    Some((
        streams::for_object(
            Kind::VirtualMachineSnapshot,
            &ns,
            &spec.virtual_machine_snapshot_name,
        ),
        streams::vm(&ns, &spec.target.name),
    ))
}

/// The firmware UUID whose claim holder the gateway looks up for [`RestoreInput::uuid_holder`]
/// (claim key `firmware-uuid/<uuid>`): the snapshot's UUID, or the legacy UUID of its source
/// VM's name for a snapshot without one.
pub fn uuid_to_check(snapshot: &SnapshotState) -> Option<Uuid> {
    let t = snapshot.taken.as_ref()?;
    Some(
        t.firmware_uuid
            .unwrap_or_else(|| legacy_firmware_uuid(&t.source_name)),
    )
}

/// What the gateway read for one `Progress` step.
#[derive(Debug, Clone, PartialEq)]
pub struct RestoreInput {
    /// The VirtualMachineRestore manifest when this step creates it; `None` afterwards (or
    /// when it was created through the generic object path). Given again for an existing
    /// restore it must have the same spec.
    pub manifest: Option<GenericObject>,
    /// `snapshot/<ns>/<spec.virtualMachineSnapshotName>`, folded ([`crate::aggregate::snapshot::fold`]).
    pub snapshot: SnapshotState,
    /// `vm/<ns>/<spec.target.name>`, folded (empty when the stream does not exist).
    pub target: VmState,
    /// The stream holding the claim `firmware-uuid/<`[`uuid_to_check`]`>`, if any.
    pub uuid_holder: Option<String>,
    /// The cluster's effective features (the `Snapshot` gate is required).
    pub features: Features,
}

/// Commands on a restore stream.
#[derive(Debug, Clone, PartialEq)]
pub enum RestoreCommand {
    /// Create and/or advance the restore (saga steps 1 and 3).
    Progress(Box<RestoreInput>),
    /// The target command of [`Next::ApplyToTarget`] after `RestoreStarted` was refused (by
    /// `vm::decide` or by the store's claims): the restore fails with its reason. For a refused
    /// `Stop` (StopTarget) nothing is recorded: run `Progress` again.
    TargetRejected {
        /// Why.
        rejection: Rejection,
    },
    /// Delete the restore object (the target VM keeps what was restored).
    Delete {
        /// If set, must match the generation.
        expected_generation: Option<u64>,
    },
}

/// Validates a VirtualMachineRestore like KubeVirt's admitter (every cause).
pub fn validate(o: &GenericObject) -> Result<Vec<PatchOp>, Rejection> {
    let mut c = Causes::new();
    crate::validate::metadata(&o.metadata, true, &mut c);
    let mut patches = Vec::new();
    match dataprotection::spec_view::<RestoreSpecView>(o) {
        Err(r) => c.extend(r),
        Ok(s) => {
            dataprotection::check_ref(&s.target, "spec.target", &[Kind::VirtualMachine], &mut c);
            if s.virtual_machine_snapshot_name.is_empty() {
                c.invalid(
                    "spec.virtualMachineSnapshotName",
                    codes::REQUIRED,
                    "Required value",
                );
            }
            patches = dataprotection::check_patches(&s.patches, &mut c);
        }
    }
    c.finish().map(|()| patches)
}

/// Decides a command on a restore stream. Pure: time and ids come from `ctx`.
pub fn decide(
    state: &RestoreState,
    command: &RestoreCommand,
    ctx: &mut Ctx,
) -> Result<SagaDecision, Rejection> {
    match command {
        RestoreCommand::Delete {
            expected_generation,
        } => Ok(done(dataprotection::delete(
            &state.object,
            *expected_generation,
            ctx,
        )?)),
        RestoreCommand::TargetRejected { rejection } => {
            if !state.is_live() || state.is_finished() {
                return Ok(done(Decision::unchanged()));
            }
            if state.started.is_none() {
                return Ok(SagaDecision {
                    decision: Decision::unchanged(),
                    next: Next::WaitForChange,
                });
            }
            Ok(dataprotection::target_rejected(
                state,
                "target VirtualMachine update failed",
                rejection,
                ctx,
            ))
        }
        RestoreCommand::Progress(input) => progress(state, input, ctx),
    }
}

/// KubeVirt's restore error when the target exists and is not the snapshot's source.
pub const RESTORE_TO_EXISTING_TARGET: &str =
    "restore source and restore target are different but restore target already exists";
/// KubeVirt's `Failure` reason for `FailImmediate` (restore.go `targetNotReadyFailureMessage`).
pub const TARGET_NOT_READY: &str =
    "Restore target VMI must be powered off before restore operation";
/// KubeVirt's `Progressing`/`Ready` reason while a `WaitEventually` restore waits for its
/// running target (restore.go `waitEventuallyMessage`).
pub const WAITING_EVENTUALLY: &str = "Waiting for target VM to be powered off. Please stop the restore target to proceed with restore";
/// KubeVirt's `Progressing`/`Ready` reason while a `StopTarget` restore stops its running
/// target (restore.go `stopTargetMessage`).
pub const STOPPING_TARGET: &str = "Automatically stopping restore target for restore operation";

/// KubeVirt's `Progressing`/`Ready` reason while a `WaitGracePeriod` restore waits for its
/// running target (restore.go `waitGracePeriodMessage`), with the grace period
/// ([`RESTORE_TARGET_GRACE_PERIOD_SECONDS`]) written as Go writes a duration: `… fail after
/// 5m0s`.
pub fn waiting_grace_period() -> String {
    format!(
        "{WAITING_EVENTUALLY}, or the operation will fail after {}",
        go_duration(RESTORE_TARGET_GRACE_PERIOD_SECONDS)
    )
}

/// KubeVirt's `Failure` reason when `WaitGracePeriod` runs out (restore.go
/// `restoreGracePeriodExceededError`): `Restore target failed to be ready within 5m0s. …`.
pub fn grace_period_exceeded() -> String {
    format!(
        "Restore target failed to be ready within {}. Please power off the target VM before attempting restore",
        go_duration(RESTORE_TARGET_GRACE_PERIOD_SECONDS)
    )
}

/// A whole number of seconds as Go's `time.Duration.String` writes it: `5m0s`, `1h0m0s`, `45s`.
fn go_duration(seconds: i64) -> String {
    let (h, m, s) = (seconds / 3600, (seconds % 3600) / 60, seconds % 60);
    if h != 0 {
        format!("{h}h{m}m{s}s")
    } else if m != 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// The `Progressing`/`Ready` reason while a restore waits for its running target, by the
/// policy its `RestoreTargetFoundRunning` recorded (KubeVirt's `handleVMRestoreTargetNotReady`).
fn waiting_reason(policy: &str) -> String {
    match ReadinessPolicy::from_word(policy) {
        Some(ReadinessPolicy::StopTarget) => STOPPING_TARGET.to_owned(),
        Some(ReadinessPolicy::WaitEventually) => WAITING_EVENTUALLY.to_owned(),
        // `FailImmediate` fails in the step that finds the target running; an unknown word
        // cannot have been recorded by this code: the default policy's reason.
        _ => waiting_grace_period(),
    }
}

fn progress(
    state: &RestoreState,
    input: &RestoreInput,
    ctx: &mut Ctx,
) -> Result<SagaDecision, Rejection> {
    let (mut step, patches, spec) =
        match dataprotection::open_saga(state, &input.features, input.manifest.as_ref(), ctx)? {
            ControlFlow::Continue(open) => open,
            ControlFlow::Break(decided) => return Ok(decided),
        };
    let now = step.now();
    let ns = dataprotection::namespace_of(&step.state().object);
    check_inputs(&spec, &ns, input)?;
    let target = &input.target;
    let target_stream = streams::vm(&ns, &spec.target.name);

    // Step 3 (or a retry of step 2): the plan exists.
    if let Some(started) = step.state().started.clone() {
        if target.is_live()
            && target
                .vm
                .as_ref()
                .and_then(|v| v.metadata.annotation(LAST_RESTORE_ANNOTATION))
                == Some(step.state().marker().as_str())
        {
            step.emit(Event::RestoreCompleted(RestoreCompleted {
                target_uid: target.uid.unwrap_or_default(),
                target_generation: target.generation,
                firmware_uuid: target
                    .firmware
                    .as_ref()
                    .map_or(started.firmware_uuid, |f| f.uuid),
                at_ms: now,
            }));
            return Ok(step.done());
        }
        return Ok(match target_command(&started) {
            Some(command) => step.then(Next::ApplyToTarget {
                stream: target_stream,
                command,
            }),
            None => step.failed("the recorded restore plan is unreadable"),
        });
    }

    // Step 1: is the snapshot usable?
    let snapshot = &input.snapshot;
    let snap_name = &spec.virtual_machine_snapshot_name;
    if !snapshot.is_live() {
        return Ok(step.failed(format!(
            "VirtualMachineSnapshot {snap_name} does not exist in namespace {ns}"
        )));
    }
    match snapshot.phase() {
        SnapshotPhase::Failed => {
            return Ok(step.failed(format!("VirtualMachineSnapshot {snap_name} failed")));
        }
        SnapshotPhase::InProgress => {
            return Ok(step.then(Next::WaitForChange));
        }
        SnapshotPhase::Succeeded => {}
    }
    let (Some(taken), Some(snap_vm)) = (snapshot.taken.as_ref(), snapshot.vm()) else {
        return Ok(step.failed(format!(
            "VirtualMachineSnapshot {snap_name} has no readable VM"
        )));
    };

    // Is the target this snapshot's VM, a new VM, or someone else's?
    let same_vm = target.is_live()
        && match taken.source_uid {
            Some(uid) => target.uid == Some(uid),
            None => target.name == taken.source_name,
        };
    if target.is_live() && !same_vm {
        return Ok(step.failed(RESTORE_TO_EXISTING_TARGET));
    }

    // Target readiness: a running target is handled by the policy.
    if let Some(vmi) = target.active_vmi() {
        let policy = spec.target_readiness_policy.unwrap_or_default();
        let seen = step
            .state()
            .found_running
            .iter()
            .find(|f| f.vmi_uid == vmi.uid)
            .cloned();
        let since = step.state().waiting_since_ms.unwrap_or(now);
        match policy {
            ReadinessPolicy::FailImmediate => {
                return Ok(step.failed(TARGET_NOT_READY));
            }
            ReadinessPolicy::WaitGracePeriod
                if now.saturating_sub(since) >= RESTORE_TARGET_GRACE_PERIOD_SECONDS * 1000 =>
            {
                return Ok(step.failed(grace_period_exceeded()));
            }
            _ => {}
        }
        let stop = policy == ReadinessPolicy::StopTarget;
        if seen.is_none() {
            step.emit(Event::RestoreTargetFoundRunning(
                RestoreTargetFoundRunning {
                    vmi_uid: vmi.uid,
                    policy: policy.as_str().to_owned(),
                    stop_requested: stop,
                    at_ms: now,
                },
            ));
        }
        let next = match policy {
            ReadinessPolicy::StopTarget if target.run.stop_requested_for != Some(vmi.uid) => {
                Next::ApplyToTarget {
                    stream: target_stream,
                    command: VmCommand::Stop,
                }
            }
            ReadinessPolicy::WaitGracePeriod => Next::RetryAt {
                at_ms: since.saturating_add(RESTORE_TARGET_GRACE_PERIOD_SECONDS * 1000),
            },
            _ => Next::WaitForChange,
        };
        return Ok(step.then(next));
    }

    // The plan: the VM to put, with its identity.
    let identity = restore_identity(snapshot, &spec, &ns, target.is_live(), input, ctx);
    let mut vm = if target.is_live() {
        let mut vm = target
            .vm
            .as_deref()
            .cloned()
            .unwrap_or_else(|| snap_vm.clone());
        vm.spec = snap_vm.spec.clone();
        // An existing VM keeps its run strategy (KubeVirt); `running` becomes false.
        match target.vm.as_ref().map(|v| v.spec.running.is_some()) {
            Some(true) => {
                vm.spec.running = Some(false);
                vm.spec.run_strategy = None;
            }
            _ => {
                vm.spec.run_strategy = target.run_strategy().map(|r| r.as_str().to_owned());
                vm.spec.running = None;
            }
        }
        vm
    } else {
        let mut vm = snap_vm.clone();
        vm.metadata.strip_server_fields();
        vm.metadata.name = Some(spec.target.name.clone());
        vm.metadata.namespace = Some(ns.clone());
        // A new VM is created stopped (KubeVirt).
        if vm.spec.running.is_some() {
            vm.spec.running = Some(false);
        } else {
            vm.spec.run_strategy = Some(lifecycle::RunStrategy::Halted.as_str().to_owned());
        }
        vm
    };
    vm.status = None;
    vm.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(LAST_RESTORE_ANNOTATION.into(), step.state().marker().into());
    firmware::apply_identity(&mut vm, &identity);
    if !target.is_live() && !patches.is_empty() {
        match patch_vm(&vm, &patches) {
            Ok(p) => vm = p,
            Err(why) => {
                return Ok(step.failed(format!("error patching VM {}: {why}", spec.target.name)));
            }
        }
    }
    let identity = effective_identity(&vm, identity);
    step.emit(Event::RestoreStarted(Box::new(RestoreStarted {
        snapshot_name: snap_name.clone(),
        snapshot_uid: snapshot.object.uid,
        target_name: spec.target.name.clone(),
        target_uid: target.uid.filter(|_| target.is_live()),
        target_generation: target.generation,
        vm_json: serde_json::to_string(&vm).unwrap_or_default(),
        instancetype: taken.instancetype.clone(),
        preference: taken.preference.clone(),
        firmware_uuid: identity.uuid,
        firmware_serial: identity.serial.clone(),
        firmware_origin: identity.origin,
        macs: dataprotection::macs_payload(&identity.macs),
        identity_regenerated: identity.regenerated,
        at_ms: now,
    })));
    let started = step.state().started.clone();
    let command = started.as_deref().and_then(target_command);
    Ok(match command {
        Some(command) => step.then(Next::ApplyToTarget {
            stream: target_stream,
            command,
        }),
        None => step.then(Next::WaitForChange),
    })
}

/// Rows 9 and 10.
fn restore_identity(
    snapshot: &SnapshotState,
    spec: &RestoreSpecView,
    ns: &str,
    target_live: bool,
    input: &RestoreInput,
    ctx: &mut Ctx,
) -> AssignedIdentity {
    let snap = snapshot.identity().unwrap_or_default();
    let source = snapshot
        .taken
        .as_ref()
        .map(|t| t.source_name.clone())
        .unwrap_or_default();
    let target = &spec.target.name;
    let ifaces = snapshot
        .vm()
        .map(|v| firmware::interface_names(&v))
        .unwrap_or_default();
    if target_live {
        // Row 9: the same VM.
        let mut identity =
            firmware::identity_for_restore(&snap, target, target, false, &ifaces, ctx);
        // Row 14: the origin says where the VM's UUID came from. Putting back the UUID the VM
        // already has changes nothing about its identity: the VM keeps its origin
        // (`vm::decide` records no new one), and the restore reports that same origin. Only a
        // different UUID makes the VM's origin the restore's (`Restored`, or `Legacy`).
        if let Some(current) = input
            .target
            .firmware
            .as_ref()
            .filter(|f| f.uuid == identity.uuid)
        {
            identity.origin = current.origin;
        }
        return identity;
    }
    let target_stream = streams::vm(ns, target);
    let held = input
        .uuid_holder
        .as_deref()
        .is_some_and(|h| h != target_stream);
    if source == *target && held {
        // The deleted VM's name, but its UUID now belongs to another live VM.
        return firmware::regenerated_identity(&ifaces, ctx);
    }
    firmware::identity_for_restore(&snap, &source, target, held, &ifaces, ctx)
}

/// The identity the (possibly patched) VM really carries.
fn effective_identity(vm: &VirtualMachine, mut identity: AssignedIdentity) -> AssignedIdentity {
    let fw = vm.firmware().cloned().unwrap_or_default();
    if let Some(u) = fw.uuid.as_deref().and_then(|u| Uuid::parse_str(u).ok())
        && u != identity.uuid
    {
        identity.uuid = u;
        identity.origin = FirmwareOrigin::UserSpecified;
    }
    identity.serial = fw.serial;
    identity
}

pub(crate) fn patch_vm(vm: &VirtualMachine, patches: &[PatchOp]) -> Result<VirtualMachine, String> {
    let doc = serde_json::to_value(vm).map_err(|e| e.to_string())?;
    let patched = jsonpatch::apply_all(&doc, patches)?;
    match Manifest::from_value(patched).map_err(|e| e.to_string())? {
        Manifest::VirtualMachine(v) => Ok(*v),
        other => Err(format!(
            "the patched object is a {}, not a VirtualMachine",
            other.kind()
        )),
    }
}

fn check_inputs(spec: &RestoreSpecView, ns: &str, input: &RestoreInput) -> Result<(), Rejection> {
    let mut c = Causes::new();
    let s = &input.snapshot.object;
    if s.existence != super::vm::Existence::Never
        && (s.name != spec.virtual_machine_snapshot_name || s.namespace.as_deref() != Some(ns))
    {
        c.invalid(
            "spec.virtualMachineSnapshotName",
            codes::INPUT_MISMATCH,
            format!(
                "the snapshot state is {:?}/{}, the restore names {ns}/{}",
                s.namespace, s.name, spec.virtual_machine_snapshot_name
            ),
        );
    }
    let t = &input.target;
    if t.existence != super::vm::Existence::Never
        && (t.name != spec.target.name || t.namespace != ns)
    {
        c.invalid(
            "spec.target.name",
            codes::INPUT_MISMATCH,
            format!(
                "the target state is vm/{}/{}, the restore names vm/{ns}/{}",
                t.namespace, t.name, spec.target.name
            ),
        );
    }
    c.finish()
}

/// The command for the target VM stream, rebuilt from the recorded plan (so a retry is the
/// same command): `Create` for a new VM, `Update` at the recorded generation for the same VM.
pub fn target_command(started: &RestoreStarted) -> Option<VmCommand> {
    let vm: VirtualMachine = serde_json::from_str(&started.vm_json).ok()?;
    let existing = started.target_uid.is_some();
    let put = PutVm {
        vm,
        origin: if existing {
            CreateOrigin::Apply
        } else {
            CreateOrigin::Restore
        },
        expected_generation: existing.then_some(started.target_generation),
        instancetype: dataprotection::instancetype_of(started.instancetype.as_ref()),
        preference: dataprotection::preference_of(started.preference.as_ref()),
        identity_origin: Some(started.firmware_origin),
        recapture_revisions: existing,
        // Filled by the command path, as for an apply.
        features: None,
    };
    Some(if existing {
        VmCommand::Update(Box::new(put))
    } else {
        VmCommand::Create(Box::new(put))
    })
}

/// Folds one event. Total: never fails, never judges.
pub fn evolve(mut s: RestoreState, event: &Event) -> RestoreState {
    s.object = object::evolve(std::mem::take(&mut s.object), event);
    match event {
        Event::ObjectCreated(_) => {
            s.waiting_since_ms = None;
            s.found_running.clear();
            s.started = None;
            s.completed = None;
            s.failed = None;
        }
        Event::RestoreTargetFoundRunning(e) => {
            s.waiting_since_ms.get_or_insert(e.at_ms);
            s.found_running.push(e.clone());
        }
        Event::RestoreStarted(e) => s.started = Some(e.clone()),
        Event::RestoreCompleted(e) => s.completed = Some(e.clone()),
        Event::RestoreFailed(e) => s.failed = Some(e.clone()),
        _ => {}
    }
    s
}

/// Folds a whole stream.
pub fn fold<'a>(events: impl IntoIterator<Item = &'a Event>) -> RestoreState {
    events.into_iter().fold(RestoreState::default(), evolve)
}

/// `status` of the restore in KubeVirt's shape (`None` if it does not exist): `complete`,
/// `restoreTime`, `conditions` (`Progressing`, `Ready`, `Failure` when failed) with KubeVirt's
/// reasons; plus `targetIdentity` (firmware UUID, serial, origin, whether it was regenerated,
/// MAC addresses: semantics §1 row 10 reports it here) and `targetUID`/`targetGeneration`.
pub fn render_restore(s: &RestoreState) -> Option<serde_json::Value> {
    use serde_json::{Map, json};
    if !s.is_live() {
        return None;
    }
    let mut st = Map::new();
    st.insert("complete".into(), json!(s.completed.is_some()));
    if let Some(c) = &s.completed {
        st.insert("restoreTime".into(), json!(rfc3339(c.at_ms)));
    }
    let conditions = if let Some(f) = &s.failed {
        vec![
            condition("Progressing", false, "Operation failed", Some(f.at_ms)),
            condition("Failure", true, &f.reason, Some(f.at_ms)),
            condition("Ready", false, "Operation failed", Some(f.at_ms)),
        ]
    } else if let Some(c) = &s.completed {
        vec![
            condition("Progressing", false, "Operation complete", Some(c.at_ms)),
            condition("Ready", true, "Operation complete", Some(c.at_ms)),
        ]
    } else if let Some(st) = &s.started {
        vec![
            condition("Progressing", true, "Updating target spec", Some(st.at_ms)),
            condition("Ready", false, "Waiting for target update", Some(st.at_ms)),
        ]
    } else if let Some(w) = s.found_running.last() {
        let reason = waiting_reason(&w.policy);
        vec![
            condition("Progressing", false, &reason, Some(w.at_ms)),
            condition("Ready", false, &reason, Some(w.at_ms)),
        ]
    } else {
        let reason = "Initializing VirtualMachineRestore";
        vec![
            condition("Progressing", true, reason, None),
            condition("Ready", false, reason, None),
        ]
    };
    st.insert("conditions".into(), serde_json::Value::Array(conditions));
    if let Some(p) = &s.started {
        st.insert(
            "targetIdentity".into(),
            json!({
                "firmwareUUID": p.firmware_uuid.to_string(),
                "serial": p.firmware_serial,
                "origin": p.firmware_origin.as_str(),
                "regenerated": p.identity_regenerated,
                "macAddresses": dataprotection::macs_json(&p.macs),
            }),
        );
    }
    if let Some(c) = &s.completed {
        st.insert("targetUID".into(), json!(c.target_uid.to_string()));
        st.insert("targetGeneration".into(), json!(c.target_generation));
    }
    Some(serde_json::Value::Object(st))
}

/// The restore object as `get -o yaml` shows it.
pub fn render(s: &RestoreState) -> Option<Manifest> {
    let mut m = s.object.render()?;
    if let Manifest::Object(_, g) = &mut m {
        g.status = render_restore(s);
    }
    Some(m)
}
