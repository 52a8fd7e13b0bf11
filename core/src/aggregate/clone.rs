//! The VirtualMachineClone aggregate (`clone.kubevirt.io/v1beta1`, v1alpha1 accepted): stream
//! `clone/<ns>/<name>`.
//!
//! A clone copies a VM (read at one log position) or a snapshot into a **new** VM, always with
//! a new identity (semantics §1 row 11): a new firmware UUID, a new serial (`newSMBiosSerial`
//! if given) and a new MAC for every interface (`newMacAddresses` where given; vmplane
//! generates the others instead of leaving them blank for a MAC pool as KubeVirt does). Labels
//! and annotations of the VM and of its template pass KubeVirt's filters ([`filter_keys`]:
//! no list keeps all, `*` matches all, a trailing `*` matches a prefix, a leading `!` negates,
//! and **negations win** whatever their position — KubeVirt's `generateStrStrMapPatches`
//! applies every negation after every plain filter; `restore.kubevirt.io/lastRestoreUID` is
//! always kept). The new VM is created stopped (`runStrategy: Halted`, or `running: false`),
//! then the user's `patches` apply.
//!
//! KubeVirt goes through a temporary snapshot and restore (phases `SnapshotInProgress →
//! RestoreInProgress → CreatingTargetVM → Succeeded`); vmplane reads the source at one log
//! position, so its phases are `SnapshotInProgress` (created, or waiting for a source snapshot
//! still in progress) → `CreatingTargetVM` (`CloneStarted`) → `Succeeded` | `Failed`.
//!
//! The saga has restore's shape ([`crate::aggregate::restore`]): `Progress` records
//! `CloneStarted` and returns `VmCommand::Create` for `vm/<ns>/<target>`; after it is applied,
//! `Progress` again sees the target with the recorded firmware UUID → `CloneSucceeded`; a
//! refused create → `TargetRejected` → `CloneFailed`. A target that already exists fails the
//! clone.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use serde::Deserialize;

pub use super::dataprotection::filter_keys;
use super::dataprotection::{self, Next, ObjectRef, Saga, SagaDecision, condition, done, rfc3339};
use super::object::{self, ObjectState};
use super::restore::LAST_RESTORE_ANNOTATION;
use super::snapshot::{SnapshotPhase, SnapshotState};
use super::vm::{PutVm, VmCommand, VmState};
use crate::ctx::Ctx;
use crate::decision::{Decision, streams};
use crate::error::{Causes, Rejection, codes};
use crate::event::*;
use crate::features::Features;
use crate::firmware::{self, FirmwareOrigin};
use crate::jsonpatch::PatchOp;
use crate::limits::CLONE_TARGET_SUFFIX_CHARS;
use crate::types::{GenericObject, JsonMap, Kind, Manifest, VirtualMachine};

/// The phase KubeVirt shows (`status.phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClonePhase {
    /// Created; the source is not captured yet (a source snapshot still in progress).
    SnapshotInProgress,
    /// `CloneStarted`: the new VM is being created.
    CreatingTargetVM,
    /// The new VM exists (final).
    Succeeded,
    /// Gave up (final).
    Failed,
}

impl ClonePhase {
    /// KubeVirt's word.
    pub fn as_str(self) -> &'static str {
        match self {
            ClonePhase::SnapshotInProgress => "SnapshotInProgress",
            ClonePhase::CreatingTargetVM => "CreatingTargetVM",
            ClonePhase::Succeeded => "Succeeded",
            ClonePhase::Failed => "Failed",
        }
    }
}

/// `spec.template` of a clone: filters for the VM template's labels and annotations.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateFilters {
    /// Template label filters.
    #[serde(default)]
    pub label_filters: Option<Vec<String>>,
    /// Template annotation filters.
    #[serde(default)]
    pub annotation_filters: Option<Vec<String>>,
}

/// The typed part of a clone's spec.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CloneSpecView {
    /// A VirtualMachine or a VirtualMachineSnapshot.
    #[serde(default)]
    pub source: Option<ObjectRef>,
    /// The new VM (default name `<source>-clone-<5 random chars>`).
    #[serde(default)]
    pub target: Option<ObjectRef>,
    /// VM label filters.
    #[serde(default)]
    pub label_filters: Option<Vec<String>>,
    /// VM annotation filters.
    #[serde(default)]
    pub annotation_filters: Option<Vec<String>>,
    /// Template filters.
    #[serde(default)]
    pub template: TemplateFilters,
    /// Interface name → MAC.
    #[serde(default)]
    pub new_mac_addresses: BTreeMap<String, String>,
    /// The new SMBIOS serial.
    #[serde(default, rename = "newSMBiosSerial")]
    pub new_smbios_serial: Option<String>,
    /// JSON patches for the new VM.
    #[serde(default)]
    pub patches: Vec<String>,
}

/// The folded state of a clone stream.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CloneState {
    /// The object.
    pub object: ObjectState,
    /// The plan, once started.
    pub started: Option<Box<CloneStarted>>,
    /// Success.
    pub succeeded: Option<CloneSucceeded>,
    /// Failure.
    pub failed: Option<CloneFailed>,
}

impl CloneState {
    /// Whether the clone object exists.
    pub fn is_live(&self) -> bool {
        self.object.is_live()
    }

    /// Succeeded or failed.
    pub fn is_finished(&self) -> bool {
        self.succeeded.is_some() || self.failed.is_some()
    }

    /// The phase.
    pub fn phase(&self) -> ClonePhase {
        if self.failed.is_some() {
            ClonePhase::Failed
        } else if self.succeeded.is_some() {
            ClonePhase::Succeeded
        } else if self.started.is_some() {
            ClonePhase::CreatingTargetVM
        } else {
            ClonePhase::SnapshotInProgress
        }
    }

    /// The stored spec, if readable.
    pub fn spec(&self) -> Option<CloneSpecView> {
        self.stored_spec()
    }
}

impl Saga for CloneState {
    const KIND: Kind = Kind::VirtualMachineClone;
    const NAME: &'static str = "clone";
    type Spec = CloneSpecView;

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
        Event::CloneFailed(CloneFailed { reason, at_ms })
    }
}

/// The clone's source as the gateway read it.
#[derive(Debug, Clone, PartialEq)]
pub enum CloneSource {
    /// `vm/<ns>/<spec.source.name>` folded at `position`.
    VirtualMachine {
        /// The folded state (empty when the stream does not exist).
        vm: Box<VmState>,
        /// The global log position it was read at.
        position: u64,
    },
    /// `snapshot/<ns>/<spec.source.name>` folded.
    Snapshot(Box<SnapshotState>),
}

/// What the gateway read for one `Progress` step.
#[derive(Debug, Clone, PartialEq)]
pub struct CloneInput {
    /// The VirtualMachineClone manifest when this step creates it; `None` afterwards.
    pub manifest: Option<GenericObject>,
    /// The source, of the kind `spec.source.kind` names.
    pub source: CloneSource,
    /// `vm/<ns>/<`[`target_name`]`>` folded; an empty state when the name is not known yet (no
    /// `spec.target`: the name is generated when the clone starts).
    pub target: VmState,
    /// The cluster's effective features (the `Snapshot` gate is required).
    pub features: Features,
}

/// Commands on a clone stream.
#[derive(Debug, Clone, PartialEq)]
pub enum CloneCommand {
    /// Create and/or advance the clone.
    Progress(Box<CloneInput>),
    /// The `Create` of [`Next::ApplyToTarget`] was refused: the clone fails with the reason.
    TargetRejected {
        /// Why.
        rejection: Rejection,
    },
    /// Delete the clone object (the new VM stays).
    Delete {
        /// If set, must match the generation.
        expected_generation: Option<u64>,
    },
}

/// The source stream the gateway reads (`vm/<ns>/<name>` or `snapshot/<ns>/<name>`) and the
/// target VM name, from the manifest (first step) or the stored spec and plan. The target name
/// is `None` before the clone starts when the spec names no target (it is generated then).
pub fn input_streams(
    state: &CloneState,
    manifest: Option<&GenericObject>,
) -> Option<(String, Option<String>)> {
    let (spec, ns) = match manifest {
        Some(m) => (
            dataprotection::spec_view::<CloneSpecView>(m).ok()?,
            m.metadata
                .namespace
                .clone()
                .unwrap_or_else(|| crate::defaults::DEFAULT_NAMESPACE.to_owned()),
        ),
        None => (state.spec()?, dataprotection::namespace_of(&state.object)),
    };
    let source = spec.source.clone()?;
    let kind = if source.kind == Kind::VirtualMachineSnapshot.as_str() {
        Kind::VirtualMachineSnapshot
    } else {
        Kind::VirtualMachine
    };
    Some((
        streams::for_object(kind, &ns, &source.name),
        target_name(state, &spec),
    ))
}

/// The target VM's name: the recorded one once started, else `spec.target.name`.
pub fn target_name(state: &CloneState, spec: &CloneSpecView) -> Option<String> {
    state
        .started
        .as_ref()
        .map(|s| s.target_name.clone())
        .or_else(|| spec.target.as_ref().map(|t| t.name.clone()))
}

/// Validates a VirtualMachineClone like KubeVirt's admitter (every cause).
pub fn validate(o: &GenericObject) -> Result<Vec<PatchOp>, Rejection> {
    let mut c = Causes::new();
    crate::validate::metadata(&o.metadata, true, &mut c);
    let mut patches = Vec::new();
    match dataprotection::spec_view::<CloneSpecView>(o) {
        Err(r) => c.extend(r),
        Ok(s) => {
            match &s.source {
                None => c.invalid("spec.source", codes::REQUIRED, "Source cannot be nil"),
                Some(src) => {
                    if src.api_group.as_deref().is_none_or(str::is_empty) {
                        c.invalid(
                            "spec.source.apiGroup",
                            codes::REQUIRED,
                            "Source's APIGroup cannot be empty",
                        );
                    }
                    let kind = [Kind::VirtualMachine, Kind::VirtualMachineSnapshot]
                        .into_iter()
                        .find(|k| k.as_str() == src.kind);
                    match kind {
                        None if src.kind.is_empty() => c.invalid(
                            "spec.source.kind",
                            codes::REQUIRED,
                            "Source's Kind cannot be empty",
                        ),
                        None => c.invalid(
                            "spec.source.kind",
                            codes::INVALID_VALUE,
                            "Source kind is not supported",
                        ),
                        Some(k) => {
                            if let Some(g) = src.api_group.as_deref().filter(|g| !g.is_empty())
                                && g != k.group()
                            {
                                c.invalid(
                                    "spec.source.apiGroup",
                                    codes::INVALID_VALUE,
                                    "invalid apiGroup",
                                );
                            }
                        }
                    }
                    if src.name.is_empty() {
                        c.invalid(
                            "spec.source.name",
                            codes::REQUIRED,
                            "Source's name cannot be empty",
                        );
                    }
                }
            }
            if let Some(t) = &s.target {
                if t.kind != Kind::VirtualMachine.as_str() {
                    c.invalid(
                        "spec.target.kind",
                        codes::INVALID_VALUE,
                        "Target kind is not supported",
                    );
                }
                if let Some(g) = t.api_group.as_deref()
                    && g != Kind::VirtualMachine.group()
                {
                    c.invalid(
                        "spec.target.apiGroup",
                        codes::INVALID_VALUE,
                        "invalid apiGroup",
                    );
                }
                if t.name.is_empty() {
                    c.invalid("spec.target.name", codes::REQUIRED, "Required value");
                }
                if let Some(src) = &s.source
                    && src.kind == Kind::VirtualMachine.as_str()
                    && t.kind == Kind::VirtualMachine.as_str()
                    && src.name == t.name
                {
                    c.invalid(
                        "spec.target.name",
                        codes::INVALID_VALUE,
                        "Target name cannot be equal to source name when both are VirtualMachines",
                    );
                }
            }
            dataprotection::check_filters(s.label_filters.as_ref(), "spec.labelFilters", &mut c);
            dataprotection::check_filters(
                s.annotation_filters.as_ref(),
                "spec.annotationFilters",
                &mut c,
            );
            dataprotection::check_filters(
                s.template.label_filters.as_ref(),
                "spec.template.labelFilters",
                &mut c,
            );
            dataprotection::check_filters(
                s.template.annotation_filters.as_ref(),
                "spec.template.annotationFilters",
                &mut c,
            );
            for (iface, mac) in &s.new_mac_addresses {
                if !mac.is_empty() && !dataprotection::valid_mac(mac) {
                    c.invalid(
                        format!("spec.newMacAddresses.{iface}"),
                        codes::INVALID_VALUE,
                        format!("interface {iface} has malformed MAC address ({mac})."),
                    );
                }
            }
            if let Some(serial) = &s.new_smbios_serial
                && serial.len() > crate::limits::FIRMWARE_SERIAL_BYTES_MAX
            {
                c.invalid(
                    "spec.newSMBiosSerial",
                    codes::TOO_MANY,
                    format!(
                        "must be no more than {} characters",
                        crate::limits::FIRMWARE_SERIAL_BYTES_MAX
                    ),
                );
            }
            patches = dataprotection::check_patches(&s.patches, &mut c);
        }
    }
    c.finish().map(|()| patches)
}

/// Decides a command on a clone stream. Pure: time and ids come from `ctx`.
pub fn decide(
    state: &CloneState,
    command: &CloneCommand,
    ctx: &mut Ctx,
) -> Result<SagaDecision, Rejection> {
    match command {
        CloneCommand::Delete {
            expected_generation,
        } => Ok(done(dataprotection::delete(
            &state.object,
            *expected_generation,
            ctx,
        )?)),
        CloneCommand::TargetRejected { rejection } => {
            if !state.is_live() || state.is_finished() || state.started.is_none() {
                return Ok(done(Decision::unchanged()));
            }
            Ok(dataprotection::target_rejected(
                state,
                "creating the target VirtualMachine failed",
                rejection,
                ctx,
            ))
        }
        CloneCommand::Progress(input) => progress(state, input, ctx),
    }
}

fn progress(
    state: &CloneState,
    input: &CloneInput,
    ctx: &mut Ctx,
) -> Result<SagaDecision, Rejection> {
    let (mut step, patches, spec) =
        match dataprotection::open_saga(state, &input.features, input.manifest.as_ref(), ctx)? {
            ControlFlow::Continue(open) => open,
            ControlFlow::Break(decided) => return Ok(decided),
        };
    let Some(source_ref) = spec.source.clone() else {
        return Ok(step.unreadable_spec());
    };
    let now = step.now();
    let ns = dataprotection::namespace_of(&step.state().object);
    let target = &input.target;

    // Step 3 (or a retry of step 2).
    if let Some(started) = step.state().started.clone() {
        check_target(target, &ns, &started.target_name)?;
        if target.is_live() {
            if target.firmware.as_ref().map(|f| f.uuid) == Some(started.firmware_uuid) {
                step.emit(Event::CloneSucceeded(CloneSucceeded {
                    target_uid: target.uid.unwrap_or_default(),
                    target_generation: target.generation,
                    at_ms: now,
                }));
            } else {
                step.fail(target_exists(&started.target_name, &ns));
            }
            return Ok(step.done());
        }
        return Ok(match target_command(&started) {
            Some(command) => step.then(Next::ApplyToTarget {
                stream: streams::vm(&ns, &started.target_name),
                command,
            }),
            None => step.failed("the recorded clone plan is unreadable"),
        });
    }

    // Step 1: capture the source.
    struct Captured {
        vm: VirtualMachine,
        uid: Option<uuid::Uuid>,
        revision: u64,
        position: u64,
        instancetype: Option<RevisionCaptured>,
        preference: Option<RevisionCaptured>,
    }
    let captured = match &input.source {
        CloneSource::VirtualMachine { vm, position } => {
            if source_ref.kind != Kind::VirtualMachine.as_str() {
                return Err(source_mismatch(&source_ref));
            }
            if vm.existence != super::vm::Existence::Never
                && (vm.name != source_ref.name || vm.namespace != ns)
            {
                return Err(Rejection::invalid(
                    "spec.source.name",
                    codes::INPUT_MISMATCH,
                    format!(
                        "the source state is vm/{}/{}, the clone names vm/{ns}/{}",
                        vm.namespace, vm.name, source_ref.name
                    ),
                ));
            }
            match (&vm.vm, vm.is_live()) {
                (Some(v), true) => Captured {
                    vm: VirtualMachine::clone(v),
                    uid: vm.uid,
                    revision: vm.revision,
                    position: *position,
                    instancetype: vm.instancetype.as_deref().map(dataprotection::revision_of),
                    preference: vm.preference.as_deref().map(dataprotection::revision_of),
                },
                _ => {
                    return Ok(step.failed(format!(
                        "VirtualMachine {} does not exist in namespace {ns}",
                        source_ref.name
                    )));
                }
            }
        }
        CloneSource::Snapshot(snap) => {
            if source_ref.kind != Kind::VirtualMachineSnapshot.as_str() {
                return Err(source_mismatch(&source_ref));
            }
            let o = &snap.object;
            if o.existence != super::vm::Existence::Never
                && (o.name != source_ref.name || o.namespace.as_deref() != Some(ns.as_str()))
            {
                return Err(Rejection::invalid(
                    "spec.source.name",
                    codes::INPUT_MISMATCH,
                    format!(
                        "the source state is snapshot {:?}/{}, the clone names {ns}/{}",
                        o.namespace, o.name, source_ref.name
                    ),
                ));
            }
            if !snap.is_live() {
                return Ok(step.failed(format!(
                    "VirtualMachineSnapshot {} does not exist in namespace {ns}",
                    source_ref.name
                )));
            }
            match (snap.phase(), snap.taken.as_ref(), snap.vm()) {
                (SnapshotPhase::InProgress, _, _) => {
                    return Ok(step.then(Next::WaitForChange));
                }
                (SnapshotPhase::Succeeded, Some(t), Some(v)) => Captured {
                    vm: v,
                    uid: snap.object.uid,
                    revision: snap.object.revision,
                    position: t.source_position,
                    instancetype: t.instancetype.clone(),
                    preference: t.preference.clone(),
                },
                _ => {
                    return Ok(
                        step.failed(format!("VirtualMachineSnapshot {} failed", source_ref.name))
                    );
                }
            }
        }
    };

    // The target name, and whether it is free.
    let target_name = match spec.target.as_ref() {
        Some(t) => t.name.clone(),
        None => generated_name(&source_ref.name, ctx),
    };
    check_target(target, &ns, &target_name)?;
    if target.is_live() {
        return Ok(step.failed(target_exists(&target_name, &ns)));
    }

    // The new VM.
    let mut vm = captured.vm.clone();
    vm.status = None;
    vm.metadata.strip_server_fields();
    vm.metadata.name = Some(target_name.clone());
    vm.metadata.namespace = Some(ns.clone());
    let keep = [LAST_RESTORE_ANNOTATION];
    filter_meta(&mut vm.metadata.labels, spec.label_filters.as_deref(), &[]);
    filter_meta(
        &mut vm.metadata.annotations,
        spec.annotation_filters.as_deref(),
        &keep,
    );
    if let Some(tm) = vm.spec.template.as_mut().and_then(|t| t.metadata.as_mut()) {
        filter_meta(&mut tm.labels, spec.template.label_filters.as_deref(), &[]);
        filter_meta(
            &mut tm.annotations,
            spec.template.annotation_filters.as_deref(),
            &[],
        );
    }
    if vm.spec.running.is_some() {
        vm.spec.running = Some(false);
    } else {
        vm.spec.run_strategy = Some(crate::lifecycle::RunStrategy::Halted.as_str().to_owned());
    }
    let requested_macs: BTreeMap<String, String> = spec
        .new_mac_addresses
        .iter()
        .filter(|(_, m)| !m.is_empty())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let identity = firmware::identity_for_clone(
        &firmware::interface_names(&vm),
        spec.new_smbios_serial.as_deref(),
        &requested_macs,
        ctx,
    );
    firmware::apply_identity(&mut vm, &identity);
    if !patches.is_empty() {
        match super::restore::patch_vm(&vm, &patches) {
            Ok(p) => vm = p,
            Err(why) => {
                return Ok(step.failed(format!("error patching VM {target_name}: {why}")));
            }
        }
    }
    let fw = vm.firmware().cloned().unwrap_or_default();
    let uuid = fw
        .uuid
        .as_deref()
        .and_then(|u| uuid::Uuid::parse_str(u).ok())
        .unwrap_or(identity.uuid);
    step.emit(Event::CloneStarted(Box::new(CloneStarted {
        source_kind: source_ref.kind.clone(),
        source_name: source_ref.name.clone(),
        source_uid: captured.uid,
        source_revision: captured.revision,
        source_position: captured.position,
        target_name: target_name.clone(),
        vm_json: serde_json::to_string(&vm).unwrap_or_default(),
        instancetype: captured.instancetype,
        preference: captured.preference,
        firmware_uuid: uuid,
        firmware_serial: fw.serial,
        macs: dataprotection::macs_payload(&identity.macs),
        at_ms: now,
    })));
    let command = step.state().started.as_deref().and_then(target_command);
    Ok(step.then(match command {
        Some(command) => Next::ApplyToTarget {
            stream: streams::vm(&ns, &target_name),
            command,
        },
        None => Next::WaitForChange,
    }))
}

fn filter_meta(map: &mut Option<JsonMap>, filters: Option<&[String]>, keep: &[&str]) {
    if let Some(m) = map.as_mut() {
        *m = filter_keys(m, filters, keep);
        if m.is_empty() {
            *map = None;
        }
    }
}

fn target_exists(name: &str, ns: &str) -> String {
    format!("VirtualMachine {name} already exists in namespace {ns}")
}

fn source_mismatch(r: &ObjectRef) -> Rejection {
    Rejection::invalid(
        "spec.source.kind",
        codes::INPUT_MISMATCH,
        format!("the clone's source is a {}, the input is not", r.kind),
    )
}

fn check_target(target: &VmState, ns: &str, name: &str) -> Result<(), Rejection> {
    if target.existence != super::vm::Existence::Never
        && (target.name != name || target.namespace != ns)
    {
        return Err(Rejection::invalid(
            "spec.target.name",
            codes::INPUT_MISMATCH,
            format!(
                "the target state is vm/{}/{}, the clone's target is vm/{ns}/{name}",
                target.namespace, target.name
            ),
        ));
    }
    Ok(())
}

/// `<source>-clone-<5 chars>` from KubeVirt's random-string alphabet.
fn generated_name(source: &str, ctx: &mut Ctx) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let base = format!("{source}-clone");
    let base = if base.len() > 246 {
        "clone-object".to_owned()
    } else {
        base
    };
    let suffix: String = (0..CLONE_TARGET_SUFFIX_CHARS)
        .map(|_| {
            let i = usize::try_from(ctx.below(ALPHABET.len() as u64)).unwrap_or(0);
            char::from(ALPHABET[i % ALPHABET.len()])
        })
        .collect();
    format!("{base}-{suffix}")
}

/// The `Create` for the target VM stream, rebuilt from the recorded plan.
pub fn target_command(started: &CloneStarted) -> Option<VmCommand> {
    let vm: VirtualMachine = serde_json::from_str(&started.vm_json).ok()?;
    Some(VmCommand::Create(Box::new(PutVm {
        vm,
        origin: CreateOrigin::Clone,
        expected_generation: None,
        instancetype: dataprotection::instancetype_of(started.instancetype.as_ref()),
        preference: dataprotection::preference_of(started.preference.as_ref()),
        identity_origin: Some(FirmwareOrigin::Cloned),
        recapture_revisions: false,
        // Filled by the command path, as for an apply.
        features: None,
    })))
}

/// Folds one event. Total: never fails, never judges.
pub fn evolve(mut s: CloneState, event: &Event) -> CloneState {
    s.object = object::evolve(std::mem::take(&mut s.object), event);
    match event {
        Event::ObjectCreated(_) => {
            s.started = None;
            s.succeeded = None;
            s.failed = None;
        }
        Event::CloneStarted(e) => s.started = Some(e.clone()),
        Event::CloneSucceeded(e) => s.succeeded = Some(e.clone()),
        Event::CloneFailed(e) => s.failed = Some(e.clone()),
        _ => {}
    }
    s
}

/// Folds a whole stream.
pub fn fold<'a>(events: impl IntoIterator<Item = &'a Event>) -> CloneState {
    events.into_iter().fold(CloneState::default(), evolve)
}

/// `status` of the clone in KubeVirt's shape (`None` if it does not exist): `phase`,
/// `conditions` (`Progressing`, `Ready`; reasons `Still processing`, `Ready`, `Failed`, with
/// the failure's detail as `message`), `targetName`; plus the new identity.
pub fn render_clone(s: &CloneState) -> Option<serde_json::Value> {
    use serde_json::{Map, json};
    if !s.is_live() {
        return None;
    }
    let mut st = Map::new();
    st.insert("phase".into(), json!(s.phase().as_str()));
    let conditions = match (s.phase(), &s.failed, &s.succeeded) {
        (ClonePhase::Failed, Some(f), _) => {
            let mut p = condition("Progressing", false, "Failed", Some(f.at_ms));
            let mut r = condition("Ready", false, "Failed", Some(f.at_ms));
            for c in [&mut p, &mut r] {
                if let Some(m) = c.as_object_mut() {
                    m.insert("message".into(), json!(f.reason));
                }
            }
            vec![p, r]
        }
        (ClonePhase::Succeeded, _, Some(ok)) => vec![
            condition("Progressing", false, "Ready", Some(ok.at_ms)),
            condition("Ready", true, "Ready", Some(ok.at_ms)),
        ],
        _ => vec![
            condition("Progressing", true, "Still processing", None),
            condition("Ready", false, "Still processing", None),
        ],
    };
    st.insert("conditions".into(), serde_json::Value::Array(conditions));
    if let Some(p) = &s.started {
        st.insert("targetName".into(), json!(p.target_name));
        st.insert("creationTime".into(), json!(rfc3339(p.at_ms)));
        st.insert(
            "targetIdentity".into(),
            json!({
                "firmwareUUID": p.firmware_uuid.to_string(),
                "serial": p.firmware_serial,
                "origin": FirmwareOrigin::Cloned.as_str(),
                "macAddresses": dataprotection::macs_json(&p.macs),
            }),
        );
        st.insert("sourcePosition".into(), json!(p.source_position));
    }
    if let Some(ok) = &s.succeeded {
        st.insert("targetUID".into(), json!(ok.target_uid.to_string()));
    }
    Some(serde_json::Value::Object(st))
}

/// The clone object as `get -o yaml` shows it.
pub fn render(s: &CloneState) -> Option<Manifest> {
    let mut m = s.object.render()?;
    if let Manifest::Object(_, g) = &mut m {
        g.status = render_clone(s);
    }
    Some(m)
}
