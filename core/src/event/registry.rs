//! The event registry: `(type name, version) ↔ frozen payload`, with upcasting.

use rkyv::rancor;
use rkyv::util::AlignedVec;

use super::Event;
use super::payload::*;
use crate::firmware::legacy_firmware_uuid;

/// Every `(type name, schema version)` the registry decodes, oldest versions included.
pub const EVENT_TYPES: &[(&str, u16)] = &[
    ("VmCreated", 1),
    ("VmCreated", 2),
    ("VmSpecEdited", 1),
    ("FirmwareUuidAssigned", 1),
    ("InstancetypeRevisionCaptured", 1),
    ("PreferenceRevisionCaptured", 1),
    ("VmDeleted", 1),
    ("VmStartRequested", 1),
    ("VmStopRequested", 1),
    ("VmRestartRequested", 1),
    ("VmiLaunched", 1),
    ("VmiScheduled", 1),
    ("VmiPhaseObserved", 1),
    ("VmiRemoved", 1),
    ("VmStartBackoffScheduled", 1),
    ("VmiCreated", 1),
    ("VmiDeleted", 1),
    ("ObjectCreated", 1),
    ("ObjectUpdated", 1),
    ("ObjectDeleted", 1),
    ("SnapshotTaken", 1),
    ("SnapshotFailed", 1),
    ("RestoreTargetFoundRunning", 1),
    ("RestoreStarted", 1),
    ("RestoreCompleted", 1),
    ("RestoreFailed", 1),
    ("CloneStarted", 1),
    ("CloneSucceeded", 1),
    ("CloneFailed", 1),
    ("LogPositionVoided", 1),
];

/// An event ready for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedEvent {
    /// Stable type name.
    pub type_name: &'static str,
    /// Schema version of `bytes`.
    pub version: u16,
    /// rkyv archive of the payload.
    pub bytes: Vec<u8>,
}

/// Why bytes from the log could not become an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// No such `(type, version)` in the registry.
    #[error("unknown event type {type_name} version {version}")]
    UnknownType {
        /// The type name read.
        type_name: String,
        /// The version read.
        version: u16,
    },
    /// The bytes are not a valid archive of that payload (or its JSON is not JSON).
    #[error("corrupt {type_name} v{version} payload: {message}")]
    Corrupt {
        /// The type name.
        type_name: String,
        /// The version.
        version: u16,
        /// What the validator said.
        message: String,
    },
}

fn to_bytes<T>(value: &T) -> Vec<u8>
where
    T: for<'a> rkyv::Serialize<
            rkyv::api::high::HighSerializer<
                AlignedVec,
                rkyv::ser::allocator::ArenaHandle<'a>,
                rancor::Error,
            >,
        >,
{
    // Serializing owned plain data into a growable buffer only fails if allocation fails.
    match rkyv::to_bytes::<rancor::Error>(value) {
        Ok(v) => v.to_vec(),
        Err(e) => panic!("rkyv serialization of an event payload failed: {e}"),
    }
}

/// Encodes an event at its current schema version.
pub fn encode(event: &Event) -> EncodedEvent {
    let bytes = match event {
        Event::VmCreated(p) => to_bytes(p),
        Event::VmSpecEdited(p) => to_bytes(p),
        Event::FirmwareUuidAssigned(p) => to_bytes(p),
        Event::InstancetypeRevisionCaptured(p) | Event::PreferenceRevisionCaptured(p) => {
            to_bytes(p)
        }
        Event::VmDeleted(p) => to_bytes(p),
        Event::VmStartRequested(p) => to_bytes(p),
        Event::VmStopRequested(p) => to_bytes(p),
        Event::VmRestartRequested(p) => to_bytes(p),
        Event::VmiLaunched(p) => to_bytes(p),
        Event::VmiScheduled(p) => to_bytes(p),
        Event::VmiPhaseObserved(p) => to_bytes(p),
        Event::VmiRemoved(p) => to_bytes(p),
        Event::VmStartBackoffScheduled(p) => to_bytes(p),
        Event::VmiCreated(p) => to_bytes(p),
        Event::VmiDeleted(p) => to_bytes(p),
        Event::ObjectCreated(p) => to_bytes(p),
        Event::ObjectUpdated(p) => to_bytes(p),
        Event::ObjectDeleted(p) => to_bytes(p),
        Event::SnapshotTaken(p) => to_bytes(&**p),
        Event::SnapshotFailed(p) => to_bytes(p),
        Event::RestoreTargetFoundRunning(p) => to_bytes(p),
        Event::RestoreStarted(p) => to_bytes(&**p),
        Event::RestoreCompleted(p) => to_bytes(p),
        Event::RestoreFailed(p) => to_bytes(p),
        Event::CloneStarted(p) => to_bytes(&**p),
        Event::CloneSucceeded(p) => to_bytes(p),
        Event::CloneFailed(p) => to_bytes(p),
        Event::LogPositionVoided(p) => to_bytes(p),
    };
    EncodedEvent {
        type_name: event.type_name(),
        version: event.schema_version(),
        bytes,
    }
}

/// Encodes an old-version payload (for golden fixtures and upcaster tests only).
pub fn encode_vm_created_v1(p: &VmCreatedV1) -> Vec<u8> {
    to_bytes(p)
}

fn read<T>(type_name: &str, version: u16, bytes: &[u8]) -> Result<T, DecodeError>
where
    T: rkyv::Archive,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rancor::Error>>
        + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rancor::Error>>,
{
    // Archives must be aligned; log bytes may not be, so copy once.
    let mut aligned = AlignedVec::<16>::with_capacity(bytes.len());
    aligned.extend_from_slice(bytes);
    rkyv::from_bytes::<T, rancor::Error>(&aligned).map_err(|e| DecodeError::Corrupt {
        type_name: type_name.to_owned(),
        version,
        message: e.to_string(),
    })
}

/// Decodes a payload read from the log, upcasting old versions to the current event.
pub fn decode(type_name: &str, version: u16, bytes: &[u8]) -> Result<Event, DecodeError> {
    let t = type_name;
    Ok(match (type_name, version) {
        ("VmCreated", 1) => Event::VmCreated(upcast_vm_created_v1(read(t, version, bytes)?)),
        ("VmCreated", 2) => Event::VmCreated(read(t, version, bytes)?),
        ("VmSpecEdited", 1) => Event::VmSpecEdited(read(t, version, bytes)?),
        ("FirmwareUuidAssigned", 1) => Event::FirmwareUuidAssigned(read(t, version, bytes)?),
        ("InstancetypeRevisionCaptured", 1) => {
            Event::InstancetypeRevisionCaptured(read(t, version, bytes)?)
        }
        ("PreferenceRevisionCaptured", 1) => {
            Event::PreferenceRevisionCaptured(read(t, version, bytes)?)
        }
        ("VmDeleted", 1) => Event::VmDeleted(read(t, version, bytes)?),
        ("VmStartRequested", 1) => Event::VmStartRequested(read(t, version, bytes)?),
        ("VmStopRequested", 1) => Event::VmStopRequested(read(t, version, bytes)?),
        ("VmRestartRequested", 1) => Event::VmRestartRequested(read(t, version, bytes)?),
        ("VmiLaunched", 1) => Event::VmiLaunched(read(t, version, bytes)?),
        ("VmiScheduled", 1) => Event::VmiScheduled(read(t, version, bytes)?),
        ("VmiPhaseObserved", 1) => Event::VmiPhaseObserved(read(t, version, bytes)?),
        ("VmiRemoved", 1) => Event::VmiRemoved(read(t, version, bytes)?),
        ("VmStartBackoffScheduled", 1) => Event::VmStartBackoffScheduled(read(t, version, bytes)?),
        ("VmiCreated", 1) => Event::VmiCreated(read(t, version, bytes)?),
        ("VmiDeleted", 1) => Event::VmiDeleted(read(t, version, bytes)?),
        ("ObjectCreated", 1) => Event::ObjectCreated(read(t, version, bytes)?),
        ("ObjectUpdated", 1) => Event::ObjectUpdated(read(t, version, bytes)?),
        ("ObjectDeleted", 1) => Event::ObjectDeleted(read(t, version, bytes)?),
        ("SnapshotTaken", 1) => Event::SnapshotTaken(Box::new(read(t, version, bytes)?)),
        ("SnapshotFailed", 1) => Event::SnapshotFailed(read(t, version, bytes)?),
        ("RestoreTargetFoundRunning", 1) => {
            Event::RestoreTargetFoundRunning(read(t, version, bytes)?)
        }
        ("RestoreStarted", 1) => Event::RestoreStarted(Box::new(read(t, version, bytes)?)),
        ("RestoreCompleted", 1) => Event::RestoreCompleted(read(t, version, bytes)?),
        ("RestoreFailed", 1) => Event::RestoreFailed(read(t, version, bytes)?),
        ("CloneStarted", 1) => Event::CloneStarted(Box::new(read(t, version, bytes)?)),
        ("CloneSucceeded", 1) => Event::CloneSucceeded(read(t, version, bytes)?),
        ("CloneFailed", 1) => Event::CloneFailed(read(t, version, bytes)?),
        ("LogPositionVoided", 1) => Event::LogPositionVoided(read(t, version, bytes)?),
        _ => {
            return Err(DecodeError::UnknownType {
                type_name: type_name.to_owned(),
                version,
            });
        }
    })
}

/// Checks that `bytes` are a valid payload of `(type_name, version)`, including that every
/// embedded JSON document parses (the store's `verify` calls this).
pub fn validate_payload(type_name: &str, version: u16, bytes: &[u8]) -> Result<(), DecodeError> {
    let event = decode(type_name, version, bytes)?;
    let mut texts: Vec<&String> = Vec::new();
    let revisions = |it: &'_ Option<RevisionCapturedV1>, pref: &'_ Option<RevisionCapturedV1>| {
        [it, pref]
            .into_iter()
            .flatten()
            .map(|r| r.object_json.clone())
            .collect::<Vec<String>>()
    };
    let nested = match &event {
        Event::SnapshotTaken(p) => {
            texts.push(&p.vm_json);
            revisions(&p.instancetype, &p.preference)
        }
        Event::RestoreStarted(p) => {
            texts.push(&p.vm_json);
            revisions(&p.instancetype, &p.preference)
        }
        Event::CloneStarted(p) => {
            texts.push(&p.vm_json);
            revisions(&p.instancetype, &p.preference)
        }
        _ => Vec::new(),
    };
    texts.extend(nested.iter());
    let json = match &event {
        Event::VmCreated(p) => Some(&p.manifest_json),
        Event::VmSpecEdited(p) => Some(&p.manifest_json),
        Event::InstancetypeRevisionCaptured(p) | Event::PreferenceRevisionCaptured(p) => {
            Some(&p.object_json)
        }
        Event::VmiCreated(p) => Some(&p.manifest_json),
        Event::ObjectCreated(p) => Some(&p.manifest_json),
        Event::ObjectUpdated(p) => Some(&p.manifest_json),
        _ => None,
    };
    texts.extend(json);
    for text in texts {
        serde_json::from_str::<serde_json::Value>(text).map_err(|e| DecodeError::Corrupt {
            type_name: type_name.to_owned(),
            version,
            message: format!("embedded JSON: {e}"),
        })?;
    }
    Ok(())
}

/// `VmCreated` v1 → v2: a VM created before firmware UUIDs were persisted had KubeVirt's
/// legacy name-derived UUID and no serial; record that (origin `Legacy`) in the stored spec
/// too, so the effective UUID is the one the guest always saw (semantics.md §1 row 4).
fn upcast_vm_created_v1(v1: VmCreatedV1) -> VmCreatedV2 {
    let uuid = legacy_firmware_uuid(&v1.name);
    let manifest_json = match serde_json::from_str::<serde_json::Value>(&v1.manifest_json) {
        Ok(mut doc) => {
            set_firmware_uuid(&mut doc, &uuid.to_string());
            serde_json::to_string(&doc).unwrap_or(v1.manifest_json)
        }
        // Leave unparseable JSON as it was: evolve reports it, decode does not judge.
        Err(_) => v1.manifest_json,
    };
    VmCreatedV2 {
        uid: v1.uid,
        namespace: v1.namespace,
        name: v1.name,
        origin: CreateOrigin::Apply,
        manifest_json,
        firmware_uuid: uuid,
        firmware_serial: None,
        firmware_origin: FirmwareOrigin::Legacy,
    }
}

fn set_firmware_uuid(doc: &mut serde_json::Value, uuid: &str) {
    let mut node = doc;
    for key in ["spec", "template", "spec", "domain", "firmware"] {
        let Some(map) = node.as_object_mut() else {
            return;
        };
        node = map
            .entry(key)
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
    }
    if let Some(fw) = node.as_object_mut() {
        fw.entry("uuid")
            .or_insert_with(|| serde_json::Value::String(uuid.to_owned()));
    }
}
