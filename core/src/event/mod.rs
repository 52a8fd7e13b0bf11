//! Events: past-tense facts, each with a stable type name and schema version.
//!
//! [`Event`] is what `decide` emits and `evolve` folds; its variants hold the *current*
//! version of each frozen payload ([`payload`]). [`encode`] / [`decode`] turn events into and
//! out of `(type name, version, rkyv bytes)`; `decode` upcasts old versions.

pub mod payload;
mod registry;

pub use payload::{CreateOrigin, FirmwareOrigin, VmiPhase};
pub use registry::{
    CreatedIdentity, DecodeError, EVENT_TYPES, EncodedEvent, decode, decode_created, encode,
    encode_vm_created_v1, validate_payload,
};

use serde::{Deserialize, Serialize};

/// Current payload of `VmCreated`.
pub type VmCreated = payload::VmCreatedV2;
/// Current payload of `VmSpecEdited`.
pub type VmSpecEdited = payload::VmSpecEditedV1;
/// Current payload of `FirmwareUuidAssigned`.
pub type FirmwareUuidAssigned = payload::FirmwareUuidAssignedV1;
/// Current payload of `InstancetypeRevisionCaptured` and `PreferenceRevisionCaptured`.
pub type RevisionCaptured = payload::RevisionCapturedV1;
/// Current payload of `VmDeleted`.
pub type VmDeleted = payload::VmDeletedV1;
/// Current payload of `VmDeletionRequested`.
pub type VmDeletionRequested = payload::VmDeletionRequestedV1;
/// Current payload of `VmStartRequested`.
pub type VmStartRequested = payload::VmStartRequestedV1;
/// Current payload of `VmStopRequested`.
pub type VmStopRequested = payload::VmStopRequestedV1;
/// Current payload of `VmRestartRequested`.
pub type VmRestartRequested = payload::VmRestartRequestedV1;
/// Current payload of `VmiLaunched`.
pub type VmiLaunched = payload::VmiLaunchedV1;
/// Current payload of `VmiScheduled`.
pub type VmiScheduled = payload::VmiScheduledV1;
/// Current payload of `VmiPhaseObserved`.
pub type VmiPhaseObserved = payload::VmiPhaseObservedV1;
/// Current payload of `VmiRemoved`.
pub type VmiRemoved = payload::VmiRemovedV1;
/// Current payload of `VmStartBackoffScheduled`.
pub type VmStartBackoffScheduled = payload::VmStartBackoffScheduledV1;
/// Current payload of `VmiCreated`.
pub type VmiCreated = payload::VmiCreatedV1;
/// Current payload of `VmiDeleted`.
pub type VmiDeleted = payload::VmiDeletedV1;
/// Current payload of `ObjectCreated`.
pub type ObjectCreated = payload::ObjectCreatedV1;
/// Current payload of `ObjectUpdated`.
pub type ObjectUpdated = payload::ObjectUpdatedV1;
/// Current payload of `ObjectDeleted`.
pub type ObjectDeleted = payload::ObjectDeletedV1;
/// Current payload of `SnapshotTaken`.
pub type SnapshotTaken = payload::SnapshotTakenV1;
/// Current payload of `SnapshotFailed`.
pub type SnapshotFailed = payload::SnapshotFailedV1;
/// Current payload of `RestoreTargetFoundRunning`.
pub type RestoreTargetFoundRunning = payload::RestoreTargetFoundRunningV1;
/// Current payload of `RestoreStarted`.
pub type RestoreStarted = payload::RestoreStartedV1;
/// Current payload of `RestoreCompleted`.
pub type RestoreCompleted = payload::RestoreCompletedV1;
/// Current payload of `RestoreFailed`.
pub type RestoreFailed = payload::RestoreFailedV1;
/// Current payload of `CloneStarted`.
pub type CloneStarted = payload::CloneStartedV1;
/// Current payload of `CloneSucceeded`.
pub type CloneSucceeded = payload::CloneSucceededV1;
/// Current payload of `CloneFailed`.
pub type CloneFailed = payload::CloneFailedV1;
/// Current payload of `LogPositionVoided`.
pub type LogPositionVoided = payload::LogPositionVoidedV1;

/// Every fact vmplane records. The serde form (`{"type": "...", "data": {...}}`) is for
/// watch/audit output; the log holds the rkyv form from [`encode`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum Event {
    /// A VM was created (stream `vm/<ns>/<name>`).
    VmCreated(VmCreated),
    /// A VM's stored object changed.
    VmSpecEdited(VmSpecEdited),
    /// A VM's firmware identity changed after creation.
    FirmwareUuidAssigned(FirmwareUuidAssigned),
    /// A VM captured its instancetype.
    InstancetypeRevisionCaptured(RevisionCaptured),
    /// A VM captured its preference.
    PreferenceRevisionCaptured(RevisionCaptured),
    /// A VM was deleted.
    VmDeleted(VmDeleted),
    /// A VM's deletion was asked for while its VMI was active: it is Terminating until the
    /// VMI is gone.
    VmDeletionRequested(VmDeletionRequested),
    /// A start request was accepted.
    VmStartRequested(VmStartRequested),
    /// A stop request was accepted.
    VmStopRequested(VmStopRequested),
    /// A restart request was accepted.
    VmRestartRequested(VmRestartRequested),
    /// A VMI run of a VM began.
    VmiLaunched(VmiLaunched),
    /// A VMI was scheduled on a node (VM or standalone stream).
    VmiScheduled(VmiScheduled),
    /// A VMI phase was observed (VM or standalone stream).
    VmiPhaseObserved(VmiPhaseObserved),
    /// A VM's VMI object was removed.
    VmiRemoved(VmiRemoved),
    /// A crash-loop backoff was scheduled.
    VmStartBackoffScheduled(VmStartBackoffScheduled),
    /// A standalone VMI was created (stream `vmi/<ns>/<name>`).
    VmiCreated(VmiCreated),
    /// A standalone VMI was deleted.
    VmiDeleted(VmiDeleted),
    /// A simple object was created (instancetype, preference, snapshot, …).
    ObjectCreated(ObjectCreated),
    /// A simple object changed.
    ObjectUpdated(ObjectUpdated),
    /// A simple object was deleted.
    ObjectDeleted(ObjectDeleted),
    /// A snapshot captured its VM (stream `snapshot/<ns>/<name>`).
    SnapshotTaken(Box<SnapshotTaken>),
    /// A snapshot could not be taken.
    SnapshotFailed(SnapshotFailed),
    /// A restore found its target running and applied its readiness policy
    /// (stream `restore/<ns>/<name>`).
    RestoreTargetFoundRunning(RestoreTargetFoundRunning),
    /// A restore decided its target VM.
    RestoreStarted(Box<RestoreStarted>),
    /// A restore's target carries it.
    RestoreCompleted(RestoreCompleted),
    /// A restore gave up.
    RestoreFailed(RestoreFailed),
    /// A clone decided its new VM (stream `clone/<ns>/<name>`).
    CloneStarted(Box<CloneStarted>),
    /// A clone's new VM exists.
    CloneSucceeded(CloneSucceeded),
    /// A clone gave up.
    CloneFailed(CloneFailed),
    /// A point-in-time restore voided a position of the backup it restored
    /// (stream `system/restore/<epoch>`; no object's stream).
    LogPositionVoided(LogPositionVoided),
}

impl Event {
    /// The stable type name in the envelope.
    pub fn type_name(&self) -> &'static str {
        match self {
            Event::VmCreated(_) => "VmCreated",
            Event::VmSpecEdited(_) => "VmSpecEdited",
            Event::FirmwareUuidAssigned(_) => "FirmwareUuidAssigned",
            Event::InstancetypeRevisionCaptured(_) => "InstancetypeRevisionCaptured",
            Event::PreferenceRevisionCaptured(_) => "PreferenceRevisionCaptured",
            Event::VmDeleted(_) => "VmDeleted",
            Event::VmDeletionRequested(_) => "VmDeletionRequested",
            Event::VmStartRequested(_) => "VmStartRequested",
            Event::VmStopRequested(_) => "VmStopRequested",
            Event::VmRestartRequested(_) => "VmRestartRequested",
            Event::VmiLaunched(_) => "VmiLaunched",
            Event::VmiScheduled(_) => "VmiScheduled",
            Event::VmiPhaseObserved(_) => "VmiPhaseObserved",
            Event::VmiRemoved(_) => "VmiRemoved",
            Event::VmStartBackoffScheduled(_) => "VmStartBackoffScheduled",
            Event::VmiCreated(_) => "VmiCreated",
            Event::VmiDeleted(_) => "VmiDeleted",
            Event::ObjectCreated(_) => "ObjectCreated",
            Event::ObjectUpdated(_) => "ObjectUpdated",
            Event::ObjectDeleted(_) => "ObjectDeleted",
            Event::SnapshotTaken(_) => "SnapshotTaken",
            Event::SnapshotFailed(_) => "SnapshotFailed",
            Event::RestoreTargetFoundRunning(_) => "RestoreTargetFoundRunning",
            Event::RestoreStarted(_) => "RestoreStarted",
            Event::RestoreCompleted(_) => "RestoreCompleted",
            Event::RestoreFailed(_) => "RestoreFailed",
            Event::CloneStarted(_) => "CloneStarted",
            Event::CloneSucceeded(_) => "CloneSucceeded",
            Event::CloneFailed(_) => "CloneFailed",
            Event::LogPositionVoided(_) => "LogPositionVoided",
        }
    }

    /// The schema version [`encode`] writes for this event.
    pub fn schema_version(&self) -> u16 {
        match self {
            Event::VmCreated(_) => 2,
            _ => 1,
        }
    }

    /// A one-line summary for history and audit output.
    pub fn summary(&self) -> String {
        match self {
            Event::VmCreated(e) => format!(
                "created {}/{} (firmware {} {})",
                e.namespace,
                e.name,
                e.firmware_uuid,
                e.firmware_origin.as_str()
            ),
            // What it changed needs the manifest before it: history and audit say that
            // (`lifecycle::edit_summary`).
            Event::VmSpecEdited(_) => "edited".to_owned(),
            Event::FirmwareUuidAssigned(e) => {
                format!("firmware UUID {} ({})", e.uuid, e.origin.as_str())
            }
            Event::InstancetypeRevisionCaptured(e) => format!(
                "captured instancetype {}/{} generation {}",
                e.kind, e.name, e.source_generation
            ),
            Event::PreferenceRevisionCaptured(e) => format!(
                "captured preference {}/{} generation {}",
                e.kind, e.name, e.source_generation
            ),
            Event::VmDeleted(_) => "deleted".to_owned(),
            Event::VmDeletionRequested(e) => format!(
                "deletion requested: Terminating until VMI {} is gone",
                e.vmi_uid
            ),
            Event::VmStartRequested(_) => "start requested".to_owned(),
            Event::VmStopRequested(_) => "stop requested".to_owned(),
            Event::VmRestartRequested(_) => "restart requested".to_owned(),
            Event::VmiLaunched(e) => format!("VMI {} launched", e.vmi_uid),
            Event::VmiScheduled(e) => format!("VMI {} scheduled on {}", e.vmi_uid, e.node),
            // Why it is in that phase, as the reconciler recorded it (a failed start's cause,
            // what an unschedulable VMI lacks): history and describe show it.
            Event::VmiPhaseObserved(e) => {
                let phase = format!("VMI {} {}", e.vmi_uid, e.phase.as_str());
                match (&e.reason, &e.message) {
                    (Some(reason), Some(message)) => format!("{phase} ({reason}: {message})"),
                    (Some(said), None) | (None, Some(said)) => format!("{phase} ({said})"),
                    (None, None) => phase,
                }
            }
            Event::VmiRemoved(e) => format!("VMI {} removed", e.vmi_uid),
            Event::VmStartBackoffScheduled(e) => format!(
                "crash loop: {} failures, retry at {}",
                e.consecutive_failures,
                crate::aggregate::dataprotection::rfc3339(e.retry_at_ms)
                    .unwrap_or_else(|| format!("{} ms since the epoch", e.retry_at_ms))
            ),
            Event::VmiCreated(e) => format!("created VMI {}/{}", e.namespace, e.name),
            Event::VmiDeleted(_) => "deleted".to_owned(),
            Event::ObjectCreated(e) => format!("created {} {}", e.kind, e.name),
            Event::ObjectUpdated(_) => "updated".to_owned(),
            Event::ObjectDeleted(_) => "deleted".to_owned(),
            Event::SnapshotTaken(e) => format!(
                "snapshot of {} at revision {} (firmware {})",
                e.source_name,
                e.source_revision,
                e.firmware_uuid
                    .map_or_else(|| "none recorded".to_owned(), |u| u.to_string())
            ),
            Event::SnapshotFailed(e) => format!("snapshot failed: {}", e.reason),
            Event::RestoreTargetFoundRunning(e) => format!(
                "target running (VMI {}), policy {}{}",
                e.vmi_uid,
                e.policy,
                if e.stop_requested {
                    ", stop requested"
                } else {
                    ""
                }
            ),
            Event::RestoreStarted(e) => format!(
                "restoring {} into {} (firmware {} {}{})",
                e.snapshot_name,
                e.target_name,
                e.firmware_uuid,
                e.firmware_origin.as_str(),
                if e.identity_regenerated {
                    ", regenerated"
                } else {
                    ""
                }
            ),
            Event::RestoreCompleted(e) => {
                format!(
                    "restore complete (target generation {})",
                    e.target_generation
                )
            }
            Event::RestoreFailed(e) => format!("restore failed: {}", e.reason),
            Event::CloneStarted(e) => format!(
                "cloning {} {} into {} (firmware {})",
                e.source_kind, e.source_name, e.target_name, e.firmware_uuid
            ),
            Event::CloneSucceeded(e) => format!("clone created VM {}", e.target_uid),
            Event::CloneFailed(e) => format!("clone failed: {}", e.reason),
            Event::LogPositionVoided(e) => format!(
                "restore {} cut the log at position {}: position {} ({} {} on {}) voided",
                e.restore_epoch,
                e.cut_position,
                e.voided_position,
                e.original_event_type,
                e.original_id,
                e.original_stream
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;

    fn observed(phase: VmiPhase, reason: Option<&str>, message: Option<&str>) -> Event {
        Event::VmiPhaseObserved(VmiPhaseObserved {
            vmi_uid: Uuid::from_u128(1),
            phase,
            reason: reason.map(str::to_owned),
            message: message.map(str::to_owned),
            at_ms: 0,
        })
    }

    #[test]
    fn a_phase_observation_s_summary_says_why_when_the_reconciler_said_why() {
        let uid = Uuid::from_u128(1);
        assert_eq!(
            observed(VmiPhase::Running, None, None).summary(),
            format!("VMI {uid} Running")
        );
        assert_eq!(
            observed(
                VmiPhase::Failed,
                Some("DomainDefineFailed"),
                Some("libvirt define failed: no room")
            )
            .summary(),
            format!("VMI {uid} Failed (DomainDefineFailed: libvirt define failed: no room)")
        );
        assert_eq!(
            observed(VmiPhase::Scheduling, Some("Unschedulable"), None).summary(),
            format!("VMI {uid} Scheduling (Unschedulable)")
        );
    }
}
