//! The VirtualMachineSnapshot aggregate (`snapshot.kubevirt.io/v1beta1`, v1alpha1 accepted):
//! stream `snapshot/<ns>/<name>`.
//!
//! A snapshot captures its source VM **at one log position**: the gateway folds
//! `vm/<ns>/<spec.source.name>` at a position and passes that state ([`TakeSnapshot`]); the
//! decision records [`crate::event::SnapshotTaken`] with the stored VM object at that revision
//! (effective firmware UUID and serial included, semantics §1 row 8) and the captured
//! instancetype/preference revisions — or [`crate::event::SnapshotFailed`] when the source does
//! not exist. Because the capture is one fold of the log, the snapshot is complete the moment
//! it is recorded: KubeVirt's `InProgress` is only seen for a snapshot created through the
//! generic object path and not taken yet.
//!
//! Phases `InProgress → Succeeded | Failed`, `readyToUse`, conditions `Ready`/`Progressing`
//! (and `Failure`) with KubeVirt's reasons ([`render_snapshot`]). Disk contents are out of
//! scope: no volume snapshots are taken. The stream starts with the object aggregate's
//! `ObjectCreated` (so [`crate::object::evolve`] still folds it), then this module's events.

use uuid::Uuid;

use super::Emitter;
use super::dataprotection::{self, ObjectRef, condition, rfc3339};
use super::object::{self, ObjectState};
use super::vm::VmState;
use crate::ctx::Ctx;
use crate::decision::{Decision, Outcome};
use crate::error::{Causes, Rejection, codes};
use crate::event::*;
use crate::features::{self, Features};
use crate::firmware::SnapshotIdentity;
use crate::types::{GenericObject, Instancetype, Kind, Manifest, Preference, VirtualMachine};

/// The phase KubeVirt shows (`status.phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotPhase {
    /// Created, not taken yet.
    InProgress,
    /// Taken; `readyToUse`.
    Succeeded,
    /// Could not be taken (final).
    Failed,
}

impl SnapshotPhase {
    /// KubeVirt's word.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotPhase::InProgress => "InProgress",
            SnapshotPhase::Succeeded => "Succeeded",
            SnapshotPhase::Failed => "Failed",
        }
    }
}

/// The folded state of a snapshot stream.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SnapshotState {
    /// The object (`ObjectCreated`/`ObjectDeleted` folded by [`object::evolve`]).
    pub object: ObjectState,
    /// What was captured, once taken.
    pub taken: Option<SnapshotTaken>,
    /// Why it failed, if it did.
    pub failed: Option<SnapshotFailed>,
}

impl SnapshotState {
    /// Whether the snapshot object exists.
    pub fn is_live(&self) -> bool {
        self.object.is_live()
    }

    /// The phase.
    pub fn phase(&self) -> SnapshotPhase {
        if self.failed.is_some() {
            SnapshotPhase::Failed
        } else if self.taken.is_some() {
            SnapshotPhase::Succeeded
        } else {
            SnapshotPhase::InProgress
        }
    }

    /// Live and taken: restores and clones may use it (`status.readyToUse`).
    pub fn ready_to_use(&self) -> bool {
        self.is_live() && self.phase() == SnapshotPhase::Succeeded
    }

    /// The recorded identity (row 8).
    pub fn identity(&self) -> Option<SnapshotIdentity> {
        let t = self.taken.as_ref()?;
        Some(SnapshotIdentity {
            uuid: t.firmware_uuid,
            serial: t.firmware_serial.clone(),
        })
    }

    /// The captured VM object.
    pub fn vm(&self) -> Option<VirtualMachine> {
        serde_json::from_str(&self.taken.as_ref()?.vm_json).ok()
    }

    /// `vmsnapshot-content-<snapshot uid>`, as KubeVirt names the content.
    pub fn content_name(&self) -> Option<String> {
        self.object.uid.map(|u| format!("vmsnapshot-content-{u}"))
    }

    /// The spec's source reference, if the stored spec has the right shape.
    pub fn source(&self) -> Option<ObjectRef> {
        let o = dataprotection::stored(&self.object)?;
        dataprotection::spec_view::<SnapshotSpecView>(o)
            .ok()
            .map(|s| s.source)
    }
}

#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct SnapshotSpecView {
    #[serde(default)]
    source: ObjectRef,
}

/// Take a snapshot: what the gateway read of the source at one log position.
#[derive(Debug, Clone, PartialEq)]
pub struct TakeSnapshot {
    /// The VirtualMachineSnapshot manifest when this command creates it (the usual case: the
    /// creation and the capture are one append). `None` completes a snapshot that already
    /// exists (created through the generic object path) and is still `InProgress`; given for
    /// an existing snapshot it must have the same spec (a retried create is `Unchanged`).
    pub manifest: Option<GenericObject>,
    /// `vm/<ns>/<spec.source.name>` folded up to `source_position` (an empty state when the
    /// stream does not exist).
    pub source: VmState,
    /// The global log position the source was read at.
    pub source_position: u64,
    /// The cluster's effective features (the `Snapshot` gate is required).
    pub features: Features,
}

/// Import a snapshot taken by KubeVirt (`vmplane import`): the VirtualMachineSnapshot and the
/// VM of its VirtualMachineSnapshotContent (`spec.source.virtualMachine`). A VM without a
/// persisted firmware UUID records none; restoring it onto the same VM gives KubeVirt's legacy
/// UUID of the VM name (semantics §1 row 9).
#[derive(Debug, Clone, PartialEq)]
pub struct ImportSnapshot {
    /// The VirtualMachineSnapshot manifest.
    pub manifest: GenericObject,
    /// The content's VM.
    pub vm: VirtualMachine,
    /// The source VM's uid in KubeVirt (`status.sourceUID`), if known.
    pub source_uid: Option<Uuid>,
    /// The content's instancetype revision, if any.
    pub instancetype: Option<Instancetype>,
    /// The content's preference revision, if any.
    pub preference: Option<Preference>,
    /// The cluster's effective features.
    pub features: Features,
}

/// Commands on a snapshot stream.
#[derive(Debug, Clone, PartialEq)]
pub enum SnapshotCommand {
    /// Create (and) take.
    Take(Box<TakeSnapshot>),
    /// Import a KubeVirt snapshot.
    Import(Box<ImportSnapshot>),
    /// Delete (allowed in any phase, gate or no gate).
    Delete {
        /// If set, must match the generation.
        expected_generation: Option<u64>,
    },
}

/// Validates a VirtualMachineSnapshot spec like KubeVirt's admitter (every cause).
pub fn validate(o: &GenericObject) -> Result<(), Rejection> {
    let mut c = Causes::new();
    crate::validate::metadata(&o.metadata, true, &mut c);
    match dataprotection::spec_view::<SnapshotSpecView>(o) {
        Err(r) => c.extend(r),
        Ok(s) => {
            dataprotection::check_ref(&s.source, "spec.source", &[Kind::VirtualMachine], &mut c)
        }
    }
    c.finish()
}

/// Decides a command on a snapshot stream. Pure: time and ids come from `ctx`.
pub fn decide(
    state: &SnapshotState,
    command: &SnapshotCommand,
    ctx: &mut Ctx,
) -> Result<Decision, Rejection> {
    match command {
        SnapshotCommand::Delete {
            expected_generation,
        } => dataprotection::delete(&state.object, *expected_generation, ctx),
        SnapshotCommand::Take(t) => take(state, t, ctx),
        SnapshotCommand::Import(i) => import(state, i, ctx),
    }
}

fn take(state: &SnapshotState, t: &TakeSnapshot, ctx: &mut Ctx) -> Result<Decision, Rejection> {
    features::require_feature(&t.features, features::SNAPSHOT)?;
    if let Some(m) = &t.manifest {
        validate(m)?;
    }
    let created = dataprotection::admit_manifest(
        &state.object,
        t.manifest.as_ref(),
        Kind::VirtualMachineSnapshot,
        ctx,
    )?;
    if created.is_none() && state.phase() != SnapshotPhase::InProgress {
        return Ok(Decision::unchanged());
    }
    // A new snapshot of a VM being deleted is refused, nothing recorded (one already in
    // progress when its VM began to go fails below: its source is not live).
    if created.is_some()
        && let Some(refused) = super::vm::snapshot_while_terminating(&t.source)
    {
        return Err(refused);
    }
    let mut em = Emitter::new(state.clone(), evolve);
    let outcome = if let Some(e) = created {
        em.emit(e);
        Outcome::Created
    } else {
        Outcome::Recorded
    };
    let now = ctx.now_ms();
    let stored = dataprotection::stored(&em.state.object).cloned();
    let checked = stored.as_ref().map(validate);
    let source_ref = em.state.source();
    match (checked, source_ref) {
        (Some(Ok(())), Some(source)) => {
            let ns = dataprotection::namespace_of(&em.state.object);
            let src = &t.source;
            if src.existence != super::vm::Existence::Never
                && (src.name != source.name || src.namespace != ns)
            {
                return Err(Rejection::invalid(
                    "spec.source.name",
                    codes::INPUT_MISMATCH,
                    format!(
                        "the source state is vm/{}/{}, the snapshot names vm/{ns}/{}",
                        src.namespace, src.name, source.name
                    ),
                ));
            }
            if src.is_live()
                && let Some(vm) = &src.vm
            {
                em.emit(Event::SnapshotTaken(Box::new(SnapshotTaken {
                    source_name: source.name.clone(),
                    source_uid: src.uid,
                    source_revision: src.revision,
                    source_generation: src.generation,
                    source_position: t.source_position,
                    vm_json: serde_json::to_string(&**vm).unwrap_or_default(),
                    instancetype: src.instancetype.as_deref().map(dataprotection::revision_of),
                    preference: src.preference.as_deref().map(dataprotection::revision_of),
                    firmware_uuid: src.firmware.as_ref().map(|f| f.uuid),
                    firmware_serial: src.firmware.as_ref().and_then(|f| f.serial.clone()),
                    online: src.active_vmi().is_some(),
                    imported: false,
                    at_ms: now,
                })));
            } else {
                let reason = if src.terminating().is_some() {
                    SOURCE_BEING_DELETED
                } else {
                    SOURCE_DOES_NOT_EXIST
                };
                em.emit(Event::SnapshotFailed(SnapshotFailed {
                    reason: reason.to_owned(),
                    at_ms: now,
                }));
            }
        }
        (Some(Err(r)), _) => em.emit(Event::SnapshotFailed(SnapshotFailed {
            reason: r.to_string(),
            at_ms: now,
        })),
        _ => em.emit(Event::SnapshotFailed(SnapshotFailed {
            reason: "the stored snapshot has no readable spec".to_owned(),
            at_ms: now,
        })),
    }
    Ok(em.finish(outcome))
}

/// KubeVirt's `Progressing` reason for a snapshot whose source does not exist; vmplane records
/// it as the failure reason.
pub const SOURCE_DOES_NOT_EXIST: &str = "Source does not exist";

/// The failure reason of a snapshot in progress whose source VM began to be deleted
/// (Terminating) before it was taken.
pub const SOURCE_BEING_DELETED: &str = "Source is being deleted";

fn import(state: &SnapshotState, i: &ImportSnapshot, ctx: &mut Ctx) -> Result<Decision, Rejection> {
    features::require_feature(&i.features, features::SNAPSHOT)?;
    validate(&i.manifest)?;
    if state.is_live() {
        return Err(Rejection::one(
            crate::error::Category::AlreadyExists,
            crate::error::Cause::new(
                "metadata.name",
                codes::ALREADY_EXISTS,
                format!(
                    "VirtualMachineSnapshot \"{}\" already exists",
                    state.object.name
                ),
            ),
        ));
    }
    let Some(created) = dataprotection::admit_manifest(
        &state.object,
        Some(&i.manifest),
        Kind::VirtualMachineSnapshot,
        ctx,
    )?
    else {
        return Ok(Decision::unchanged());
    };
    let mut vm = i.vm.clone();
    vm.status = None;
    vm.metadata.strip_server_fields();
    let fw = vm.firmware().cloned().unwrap_or_default();
    let revision = |kind: &str, meta: &crate::types::ObjectMeta, json: String| RevisionCaptured {
        kind: kind.to_owned(),
        name: meta.name_str().to_owned(),
        source_uid: meta.uid.clone(),
        source_generation: meta
            .generation
            .and_then(|g| u64::try_from(g).ok())
            .unwrap_or(0),
        object_json: json,
    };
    let mut em = Emitter::new(state.clone(), evolve);
    em.emit(created);
    let source_name = em.state.source().map(|s| s.name).unwrap_or_default();
    em.emit(Event::SnapshotTaken(Box::new(SnapshotTaken {
        source_name,
        source_uid: i.source_uid,
        source_revision: 0,
        source_generation: 0,
        source_position: 0,
        vm_json: serde_json::to_string(&vm).unwrap_or_default(),
        instancetype: i.instancetype.as_ref().map(|o| {
            revision(
                &o.kind,
                &o.metadata,
                serde_json::to_string(o).unwrap_or_default(),
            )
        }),
        preference: i.preference.as_ref().map(|o| {
            revision(
                &o.kind,
                &o.metadata,
                serde_json::to_string(o).unwrap_or_default(),
            )
        }),
        firmware_uuid: fw.uuid.as_deref().and_then(|u| Uuid::parse_str(u).ok()),
        firmware_serial: fw.serial,
        online: false,
        imported: true,
        at_ms: ctx.now_ms(),
    })));
    Ok(em.finish(Outcome::Created))
}

/// Folds one event. Total: never fails, never judges.
pub fn evolve(mut s: SnapshotState, event: &Event) -> SnapshotState {
    s.object = object::evolve(std::mem::take(&mut s.object), event);
    match event {
        Event::ObjectCreated(_) => {
            s.taken = None;
            s.failed = None;
        }
        Event::SnapshotTaken(e) => s.taken = Some((**e).clone()),
        Event::SnapshotFailed(e) => s.failed = Some(e.clone()),
        _ => {}
    }
    s
}

/// Folds a whole stream.
pub fn fold<'a>(events: impl IntoIterator<Item = &'a Event>) -> SnapshotState {
    events.into_iter().fold(SnapshotState::default(), evolve)
}

/// `status` of the snapshot in KubeVirt's shape (`None` if it does not exist): `sourceUID`,
/// `virtualMachineSnapshotContentName`, `creationTime`, `phase`, `readyToUse`, `error`,
/// `conditions` (`Progressing`, `Ready`, and `Failure` when failed), `indications`
/// (`Online` for a snapshot of a running VM); plus what vmplane adds: the log position and
/// revision captured, the firmware UUID and serial, and the instancetype/preference revisions.
pub fn render_snapshot(s: &SnapshotState) -> Option<serde_json::Value> {
    use serde_json::{Map, json};
    if !s.is_live() {
        return None;
    }
    let mut st = Map::new();
    let phase = s.phase();
    if let Some(t) = &s.taken {
        if let Some(uid) = t.source_uid {
            st.insert("sourceUID".into(), json!(uid.to_string()));
        }
        st.insert(
            "virtualMachineSnapshotContentName".into(),
            json!(s.content_name()),
        );
        st.insert("creationTime".into(), json!(rfc3339(t.at_ms)));
    }
    st.insert("phase".into(), json!(phase.as_str()));
    st.insert(
        "readyToUse".into(),
        json!(phase == SnapshotPhase::Succeeded),
    );
    let conditions = match (phase, &s.taken, &s.failed) {
        (SnapshotPhase::Succeeded, Some(t), _) => vec![
            condition("Progressing", false, "Operation complete", Some(t.at_ms)),
            condition("Ready", true, "Ready", Some(t.at_ms)),
        ],
        (SnapshotPhase::Failed, _, Some(f)) => {
            let source = s.source().map(|r| r.name).unwrap_or_default();
            let message = if f.reason == SOURCE_DOES_NOT_EXIST {
                format!(
                    "VirtualMachine {}/{source} does not exist",
                    dataprotection::namespace_of(&s.object)
                )
            } else {
                f.reason.clone()
            };
            st.insert(
                "error".into(),
                json!({"time": rfc3339(f.at_ms), "message": message}),
            );
            vec![
                condition("Failure", true, &f.reason, Some(f.at_ms)),
                condition("Progressing", false, "Operation failed", Some(f.at_ms)),
                condition("Ready", false, "Not ready", Some(f.at_ms)),
            ]
        }
        _ => vec![
            condition(
                "Progressing",
                true,
                "Source locked and operation in progress",
                None,
            ),
            condition("Ready", false, "Not ready", None),
        ],
    };
    st.insert("conditions".into(), serde_json::Value::Array(conditions));
    if let Some(t) = &s.taken {
        if t.online {
            st.insert("indications".into(), json!(["Online"]));
        }
        st.insert("sourcePosition".into(), json!(t.source_position));
        st.insert("sourceRevision".into(), json!(t.source_revision));
        st.insert("sourceGeneration".into(), json!(t.source_generation));
        st.insert(
            "firmwareUUID".into(),
            json!(t.firmware_uuid.map(|u| u.to_string())),
        );
        st.insert("firmwareSerial".into(), json!(t.firmware_serial));
        for (key, r) in [
            ("instancetypeRef", &t.instancetype),
            ("preferenceRef", &t.preference),
        ] {
            if let Some(r) = r {
                st.insert(
                    key.into(),
                    json!({"name": r.name, "kind": r.kind, "revision": r.source_generation}),
                );
            }
        }
        if t.imported {
            st.insert("imported".into(), json!(true));
        }
    }
    Some(serde_json::Value::Object(st))
}

/// The snapshot object as `get -o yaml` shows it: stored object, uid, generation, status.
pub fn render(s: &SnapshotState) -> Option<Manifest> {
    let mut m = s.object.render()?;
    if let Manifest::Object(_, g) = &mut m {
        g.status = render_snapshot(s);
    }
    Some(m)
}
