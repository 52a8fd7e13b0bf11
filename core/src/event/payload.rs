//! Frozen event payloads, one struct per `(event type, schema version)`.
//!
//! **Never change a struct here once it can be in a log**: its rkyv layout is the on-disk
//! format. To change an event, add `FooV2` beside `FooV1`, point [`super::Event`] at the new
//! one, and upcast the old one in `registry.rs`. Golden bytes for every version live in
//! `core/tests/golden/` and fail a test on any accidental layout change.
//!
//! KubeVirt's schema is huge and open, so specs travel inside payloads as canonical JSON text
//! (`*_json` fields, serde_json with key order preserved): freezing the whole KubeVirt schema
//! in rkyv would freeze KubeVirt's API too.
//!
//! Each struct's doc says when it is emitted; field names say what they hold. (rkyv's derived
//! `Archived*` twins carry no docs, hence the allow.)
#![allow(missing_docs)]

use rkyv::{Archive, Deserialize as RDeserialize, Serialize as RSerialize};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

macro_rules! payload {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq, Archive, RSerialize, RDeserialize, Serialize, Deserialize)]
        pub struct $name { $($(#[$fm])* pub $field: $ty),* }
    };
}

/// Where a VM's firmware UUID came from (`status.firmwareUUIDOrigin`). Frozen: append new
/// variants at the end only.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Archive,
    RSerialize,
    RDeserialize,
    Serialize,
    Deserialize,
)]
#[rkyv(derive(Debug))]
pub enum FirmwareOrigin {
    /// Random v4, assigned by vmplane at creation (row 1).
    Generated,
    /// Given in the manifest (rows 2, 5).
    UserSpecified,
    /// KubeVirt's name-derived v5 (rows 4, 9).
    Legacy,
    /// Taken from a snapshot (rows 9, 10).
    Restored,
    /// A clone's new identity (row 11).
    Cloned,
}

impl FirmwareOrigin {
    /// The word shown in `status.firmwareUUIDOrigin`.
    pub fn as_str(self) -> &'static str {
        match self {
            FirmwareOrigin::Generated => "Generated",
            FirmwareOrigin::UserSpecified => "UserSpecified",
            FirmwareOrigin::Legacy => "Legacy",
            FirmwareOrigin::Restored => "Restored",
            FirmwareOrigin::Cloned => "Cloned",
        }
    }
}

/// How a VM came to be. Frozen: append new variants at the end only.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Archive,
    RSerialize,
    RDeserialize,
    Serialize,
    Deserialize,
)]
#[rkyv(derive(Debug))]
pub enum CreateOrigin {
    /// `apply` / create.
    Apply,
    /// `import` from a KubeVirt cluster: no UUID means KubeVirt's legacy one (row 4).
    Import,
    /// Created by a restore into a new name.
    Restore,
    /// Created by a clone.
    Clone,
}

/// A VMI phase (KubeVirt's). Frozen: append new variants at the end only.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Archive,
    RSerialize,
    RDeserialize,
    Serialize,
    Deserialize,
)]
#[rkyv(derive(Debug))]
pub enum VmiPhase {
    /// Accepted, nothing scheduled yet.
    Pending,
    /// Being placed on a node.
    Scheduling,
    /// Placed on a node; the domain is being defined.
    Scheduled,
    /// The domain runs (or is paused).
    Running,
    /// Ended cleanly (final).
    Succeeded,
    /// Ended badly (final).
    Failed,
    /// The hypervisor lost track of it.
    Unknown,
}

impl VmiPhase {
    /// Succeeded or Failed: final phases are sticky.
    pub fn is_final(self) -> bool {
        matches!(self, VmiPhase::Succeeded | VmiPhase::Failed)
    }
    /// KubeVirt's word.
    pub fn as_str(self) -> &'static str {
        match self {
            VmiPhase::Pending => "Pending",
            VmiPhase::Scheduling => "Scheduling",
            VmiPhase::Scheduled => "Scheduled",
            VmiPhase::Running => "Running",
            VmiPhase::Succeeded => "Succeeded",
            VmiPhase::Failed => "Failed",
            VmiPhase::Unknown => "Unknown",
        }
    }
}

payload! {
    /// `VmCreated` v1 — from before firmware UUIDs were persisted. Upcast to v2 with KubeVirt's
    /// legacy UUID (origin `Legacy`).
    VmCreatedV1 { uid: Uuid, namespace: String, name: String, manifest_json: String }
}

payload! {
    /// `VmCreated` v2 — a VM was created (or a deleted name created again, with a new uid).
    /// `manifest_json` is the stored object with the effective firmware UUID and serial in
    /// `spec.template.spec.domain.firmware`; `firmware_*` repeat them for indexes.
    VmCreatedV2 {
        uid: Uuid,
        namespace: String,
        name: String,
        origin: CreateOrigin,
        manifest_json: String,
        firmware_uuid: Uuid,
        firmware_serial: Option<String>,
        firmware_origin: FirmwareOrigin,
    }
}

payload! {
    /// `VmSpecEdited` v1 — the stored object changed (spec, labels, annotations); the full new
    /// object, firmware identity included.
    VmSpecEditedV1 { manifest_json: String }
}

payload! {
    /// `FirmwareUuidAssigned` v1 — the firmware identity changed after creation (row 5: the user
    /// edited the UUID or serial). Takes effect at the next start.
    FirmwareUuidAssignedV1 { uuid: Uuid, serial: Option<String>, origin: FirmwareOrigin, previous: Option<Uuid> }
}

payload! {
    /// `InstancetypeRevisionCaptured` v1 / `PreferenceRevisionCaptured` v1 — the full referenced
    /// object as the VM captured it (at creation, or when the user changed the reference).
    RevisionCapturedV1 { kind: String, name: String, source_uid: Option<String>, source_generation: u64, object_json: String }
}

payload! {
    /// `VmDeleted` v1 — the VM was deleted; its name is free, its firmware UUID released.
    VmDeletedV1 { uid: Uuid }
}

payload! {
    /// `VmDeletionRequested` v1 — a delete of the VM was accepted while its VMI `vmi_uid` was
    /// active: the VM stays (printableStatus `Terminating`, `metadata.deletionTimestamp` at
    /// `at_ms`) while the reconciler stops that VMI, and its `VmDeleted` is recorded with the
    /// VMI's removal. The actor of the envelope is who asked.
    VmDeletionRequestedV1 { uid: Uuid, vmi_uid: Uuid, at_ms: i64 }
}

payload! {
    /// `VmStartRequested` v1 — a start request was accepted. `run_strategy_after` is set when
    /// the request changes the run strategy (Halted → Always, as KubeVirt patches it).
    VmStartRequestedV1 { paused: bool, run_strategy_after: Option<String> }
}

payload! {
    /// `VmStopRequested` v1 — a stop request was accepted (for the VMI `vmi_uid` if one ran);
    /// `run_strategy_after` is set when it changes the run strategy (Always/Once → Halted).
    VmStopRequestedV1 { vmi_uid: Option<Uuid>, run_strategy_after: Option<String> }
}

payload! {
    /// `VmRestartRequested` v1 — a restart was accepted: stop VMI `vmi_uid`, then start anew.
    VmRestartRequestedV1 { vmi_uid: Uuid }
}

payload! {
    /// `VmiLaunched` v1 — a VMI run of the VM began (the reconciler is creating it). The VM's
    /// spec at this revision is "the spec of the last start".
    VmiLaunchedV1 { vmi_uid: Uuid, vm_generation: u64, paused: bool, at_ms: i64 }
}

payload! {
    /// `VmiScheduled` v1 — the VMI was placed on `node`.
    VmiScheduledV1 { vmi_uid: Uuid, node: String, at_ms: i64 }
}

payload! {
    /// `VmiPhaseObserved` v1 — the hypervisor was seen with the VMI in `phase`.
    VmiPhaseObservedV1 { vmi_uid: Uuid, phase: VmiPhase, reason: Option<String>, message: Option<String>, at_ms: i64 }
}

payload! {
    /// `VmiRemoved` v1 — the VMI object of a VM run is gone (after it ended or was stopped).
    VmiRemovedV1 { vmi_uid: Uuid, at_ms: i64 }
}

payload! {
    /// `VmStartBackoffScheduled` v1 — a VMI failed before it ever ran; the next start waits
    /// until `retry_at_ms` (KubeVirt's crash-loop backoff).
    VmStartBackoffScheduledV1 { consecutive_failures: u32, retry_at_ms: i64 }
}

payload! {
    /// `VmiCreated` v1 — a standalone VMI (no VM) was created.
    VmiCreatedV1 {
        uid: Uuid,
        namespace: String,
        name: String,
        manifest_json: String,
        firmware_uuid: Uuid,
        firmware_origin: FirmwareOrigin,
    }
}

payload! {
    /// `VmiDeleted` v1 — a standalone VMI was deleted.
    VmiDeletedV1 { uid: Uuid }
}

payload! {
    /// `ObjectCreated` v1 — an instancetype, preference, snapshot, restore, clone or KubeVirt
    /// config object was created.
    ObjectCreatedV1 { kind: String, uid: Uuid, namespace: Option<String>, name: String, manifest_json: String }
}

payload! {
    /// `ObjectUpdated` v1 — such an object changed (full new object).
    ObjectUpdatedV1 { manifest_json: String }
}

payload! {
    /// `ObjectDeleted` v1 — such an object was deleted.
    ObjectDeletedV1 { uid: Uuid }
}

payload! {
    /// Part of `RestoreStarted` v1 and `CloneStarted` v1 (never an event on its own): the MAC
    /// address a restore or clone gave one interface of its target.
    MacAddressV1 { interface: String, mac: String }
}

payload! {
    /// `SnapshotTaken` v1 — a VirtualMachineSnapshot captured its source VM at one log
    /// position (stream `snapshot/<ns>/<name>`): the stored VM object at `source_revision`
    /// (effective firmware identity included), the captured instancetype/preference revisions,
    /// and the firmware UUID and serial (semantics §1 row 8). `firmware_uuid` is `None` only for
    /// a snapshot imported from KubeVirt whose VM had no persisted UUID; `imported` marks such
    /// imports (`source_position` is then 0).
    SnapshotTakenV1 {
        source_name: String,
        source_uid: Option<Uuid>,
        source_revision: u64,
        source_generation: u64,
        source_position: u64,
        vm_json: String,
        instancetype: Option<RevisionCapturedV1>,
        preference: Option<RevisionCapturedV1>,
        firmware_uuid: Option<Uuid>,
        firmware_serial: Option<String>,
        online: bool,
        imported: bool,
        at_ms: i64,
    }
}

payload! {
    /// `SnapshotFailed` v1 — a VirtualMachineSnapshot could not be taken (its source VM does
    /// not exist); final.
    SnapshotFailedV1 { reason: String, at_ms: i64 }
}

payload! {
    /// `RestoreTargetFoundRunning` v1 — a VirtualMachineRestore found its target VM running
    /// (VMI `vmi_uid`) and applied its `targetReadinessPolicy` (`policy`); `stop_requested` when
    /// the policy is `StopTarget` and the restore asked the VM to stop. Emitted once per VMI;
    /// the first one starts the `WaitGracePeriod` clock.
    RestoreTargetFoundRunningV1 { vmi_uid: Uuid, policy: String, stop_requested: bool, at_ms: i64 }
}

payload! {
    /// `RestoreStarted` v1 — a VirtualMachineRestore decided what its target becomes: the full
    /// VM object to put (`vm_json`, with the identity of semantics §1 rows 9–10 and the
    /// `restore.kubevirt.io/lastRestoreUID` annotation), the snapshot's instancetype/preference
    /// revisions, and the identity. `target_uid` is the existing target's uid (`None`: the
    /// target is created) and `target_generation` the generation the update expects.
    RestoreStartedV1 {
        snapshot_name: String,
        snapshot_uid: Option<Uuid>,
        target_name: String,
        target_uid: Option<Uuid>,
        target_generation: u64,
        vm_json: String,
        instancetype: Option<RevisionCapturedV1>,
        preference: Option<RevisionCapturedV1>,
        firmware_uuid: Uuid,
        firmware_serial: Option<String>,
        firmware_origin: FirmwareOrigin,
        macs: Vec<MacAddressV1>,
        identity_regenerated: bool,
        at_ms: i64,
    }
}

payload! {
    /// `RestoreCompleted` v1 — the target VM carries the restore (seen at `target_generation`);
    /// final.
    RestoreCompletedV1 { target_uid: Uuid, target_generation: u64, firmware_uuid: Uuid, at_ms: i64 }
}

payload! {
    /// `RestoreFailed` v1 — the restore gave up (`reason` in KubeVirt's wording where it has
    /// one); final.
    RestoreFailedV1 { reason: String, at_ms: i64 }
}

payload! {
    /// `CloneStarted` v1 — a VirtualMachineClone captured its source (a VM at one log position,
    /// or a snapshot) and decided the new VM: `vm_json` (filters, new identity and patches
    /// applied), the source's instancetype/preference revisions, and the new identity
    /// (semantics §1 row 11).
    CloneStartedV1 {
        source_kind: String,
        source_name: String,
        source_uid: Option<Uuid>,
        source_revision: u64,
        source_position: u64,
        target_name: String,
        vm_json: String,
        instancetype: Option<RevisionCapturedV1>,
        preference: Option<RevisionCapturedV1>,
        firmware_uuid: Uuid,
        firmware_serial: Option<String>,
        macs: Vec<MacAddressV1>,
        at_ms: i64,
    }
}

payload! {
    /// `CloneSucceeded` v1 — the clone's target VM exists (uid, generation when seen); final.
    CloneSucceededV1 { target_uid: Uuid, target_generation: u64, at_ms: i64 }
}

payload! {
    /// `CloneFailed` v1 — the clone gave up (`reason`); final.
    CloneFailedV1 { reason: String, at_ms: i64 }
}

payload! {
    /// `LogPositionVoided` v1 — a point-in-time restore (`vmplane admin restore --to-position` /
    /// `--to-time`, epoch `restore_epoch`) cut the log after `cut_position`; the event that stood
    /// at `voided_position` in the backup is not part of the restored history. One per cut
    /// position, appended right after the kept events on the system stream
    /// `system/restore/<epoch>`, so positions handed out after the restore stay above every
    /// position a client could have seen. Records what was undone (the original event's id,
    /// chain hash, stream, type, version, actor and time) so the audit trail keeps a
    /// tamper-evident trace. Belongs to no object: read models skip it.
    LogPositionVoidedV1 {
        restore_epoch: Uuid,
        cut_position: u64,
        voided_position: u64,
        original_id: Uuid,
        original_hash: [u8; 32],
        original_stream: String,
        original_event_type: String,
        original_schema_version: u16,
        original_actor: String,
        original_recorded_at_unix_nanos: i64,
    }
}
