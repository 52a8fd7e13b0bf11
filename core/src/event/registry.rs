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
    ("VmDeletionRequested", 1),
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
        Event::VmDeletionRequested(p) => to_bytes(p),
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
    with_aligned(bytes, |aligned| {
        rkyv::from_bytes::<T, rancor::Error>(aligned)
    })
    .map_err(|e| DecodeError::Corrupt {
        type_name: type_name.to_owned(),
        version,
        message: e.to_string(),
    })
}

/// Payloads up to this size are realigned on the stack; larger ones on the heap.
const STACK_ALIGNED_MAX: usize = 2048;

/// A 16-byte aligned buffer on the stack.
#[repr(C, align(16))]
struct StackAligned<const N: usize>([u8; N]);

/// Runs `body` over `bytes` at an address archives may be read from (16-byte aligned): as
/// they are if they already are aligned, else copied once — onto the stack when small, so
/// decoding the many small events of a fold does not allocate for it.
fn with_aligned<R>(bytes: &[u8], body: impl FnOnce(&[u8]) -> R) -> R {
    if bytes.as_ptr().align_offset(16) == 0 {
        return body(bytes);
    }
    let len = bytes.len();
    if len <= 256 {
        let mut buf = StackAligned([0u8; 256]);
        buf.0[..len].copy_from_slice(bytes);
        body(&buf.0[..len])
    } else if len <= STACK_ALIGNED_MAX {
        let mut buf = StackAligned([0u8; STACK_ALIGNED_MAX]);
        buf.0[..len].copy_from_slice(bytes);
        body(&buf.0[..len])
    } else {
        let mut aligned = AlignedVec::<16>::with_capacity(len);
        aligned.extend_from_slice(bytes);
        body(&aligned)
    }
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
        ("VmDeletionRequested", 1) => Event::VmDeletionRequested(read(t, version, bytes)?),
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

/// What a creation event (`VmCreated`, `VmiCreated`, `ObjectCreated`) says of the identity of
/// the object it creates: what a read model indexes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedIdentity {
    /// The new object's uid.
    pub uid: uuid::Uuid,
    /// Its firmware UUID (VMs and VMIs; for `VmCreated` v1, the legacy UUID of its name,
    /// as the upcast to v2 records it).
    pub firmware_uuid: Option<uuid::Uuid>,
    /// Its name, for `ObjectCreated` (whose stream may not say it).
    pub name: Option<String>,
}

/// The identity a creation event records, read in place from its archive (validated as
/// [`decode`] validates it, but nothing deserialized: the manifest is not copied). Equal to
/// what [`decode`] gives for the same bytes; `None` for other event types.
pub fn decode_created(
    type_name: &str,
    version: u16,
    bytes: &[u8],
) -> Result<Option<CreatedIdentity>, DecodeError> {
    let corrupt = |e: rancor::Error| DecodeError::Corrupt {
        type_name: type_name.to_owned(),
        version,
        message: e.to_string(),
    };
    with_aligned(bytes, |bytes| {
        Ok(Some(match (type_name, version) {
            ("VmCreated", 1) => {
                let e =
                    rkyv::access::<ArchivedVmCreatedV1, rancor::Error>(bytes).map_err(corrupt)?;
                CreatedIdentity {
                    uid: e.uid,
                    firmware_uuid: Some(legacy_firmware_uuid(e.name.as_str())),
                    name: None,
                }
            }
            ("VmCreated", 2) => {
                let e =
                    rkyv::access::<ArchivedVmCreatedV2, rancor::Error>(bytes).map_err(corrupt)?;
                CreatedIdentity {
                    uid: e.uid,
                    firmware_uuid: Some(e.firmware_uuid),
                    name: None,
                }
            }
            ("VmiCreated", 1) => {
                let e =
                    rkyv::access::<ArchivedVmiCreatedV1, rancor::Error>(bytes).map_err(corrupt)?;
                CreatedIdentity {
                    uid: e.uid,
                    firmware_uuid: Some(e.firmware_uuid),
                    name: None,
                }
            }
            ("ObjectCreated", 1) => {
                let e = rkyv::access::<ArchivedObjectCreatedV1, rancor::Error>(bytes)
                    .map_err(corrupt)?;
                CreatedIdentity {
                    uid: e.uid,
                    firmware_uuid: None,
                    name: Some(e.name.as_str().to_owned()),
                }
            }
            _ => return Ok(None),
        }))
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

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;
    use crate::event::{CreateOrigin, FirmwareOrigin};

    /// Runs `body` over a copy of `bytes` at an address that is not 16-byte aligned (the log
    /// gives no alignment promise).
    fn misaligned<R>(bytes: &[u8], body: impl FnOnce(&[u8]) -> R) -> R {
        let mut buf = vec![0u8; bytes.len() + 1];
        let offset = usize::from(buf.as_ptr().align_offset(16) == 0);
        buf[offset..offset + bytes.len()].copy_from_slice(bytes);
        let slice = &buf[offset..offset + bytes.len()];
        assert_ne!(slice.as_ptr().align_offset(16), 0);
        body(slice)
    }

    fn identity_of(event: &Event) -> Option<CreatedIdentity> {
        match event {
            Event::VmCreated(e) => Some(CreatedIdentity {
                uid: e.uid,
                firmware_uuid: Some(e.firmware_uuid),
                name: None,
            }),
            Event::VmiCreated(e) => Some(CreatedIdentity {
                uid: e.uid,
                firmware_uuid: Some(e.firmware_uuid),
                name: None,
            }),
            Event::ObjectCreated(e) => Some(CreatedIdentity {
                uid: e.uid,
                firmware_uuid: None,
                name: Some(e.name.clone()),
            }),
            _ => None,
        }
    }

    /// Every creation event, with manifests small and large (stack and heap realignment).
    fn creations(manifest: &str) -> Vec<(&'static str, u16, Vec<u8>)> {
        let v2 = encode(&Event::VmCreated(VmCreatedV2 {
            uid: Uuid::from_u128(1),
            namespace: "ns".into(),
            name: "vm".into(),
            origin: CreateOrigin::Apply,
            manifest_json: manifest.into(),
            firmware_uuid: Uuid::from_u128(2),
            firmware_serial: Some("s".into()),
            firmware_origin: FirmwareOrigin::Generated,
        }));
        let vmi = encode(&Event::VmiCreated(VmiCreatedV1 {
            uid: Uuid::from_u128(3),
            namespace: "ns".into(),
            name: "vmi".into(),
            manifest_json: manifest.into(),
            firmware_uuid: Uuid::from_u128(4),
            firmware_origin: FirmwareOrigin::UserSpecified,
        }));
        let object = encode(&Event::ObjectCreated(ObjectCreatedV1 {
            kind: "KubeVirt".into(),
            uid: Uuid::from_u128(5),
            namespace: None,
            name: "kubevirt".into(),
            manifest_json: manifest.into(),
        }));
        let v1 = encode_vm_created_v1(&VmCreatedV1 {
            uid: Uuid::from_u128(6),
            namespace: "ns".into(),
            name: "old".into(),
            manifest_json: manifest.into(),
        });
        vec![
            ("VmCreated", 2, v2.bytes),
            ("VmiCreated", 1, vmi.bytes),
            ("ObjectCreated", 1, object.bytes),
            ("VmCreated", 1, v1),
        ]
    }

    #[test]
    fn created_identity_read_in_place_is_what_decode_gives() {
        let large = format!(r#"{{"pad":"{}"}}"#, "x".repeat(4096));
        for manifest in [r#"{"kind":"X"}"#, large.as_str()] {
            for (type_name, version, bytes) in creations(manifest) {
                let check = |bytes: &[u8]| {
                    let decoded = decode(type_name, version, bytes).expect("decode");
                    let read = decode_created(type_name, version, bytes).expect("read in place");
                    assert_eq!(read, identity_of(&decoded), "{type_name} v{version}");
                    assert!(read.is_some());
                };
                check(&bytes);
                misaligned(&bytes, check);
            }
        }
    }

    #[test]
    fn created_identity_of_damaged_bytes_is_an_error_like_decode() {
        for (type_name, version, bytes) in creations(r#"{"kind":"X"}"#) {
            for cut in [0, 1, bytes.len() / 2, bytes.len() - 1] {
                let damaged = &bytes[..cut];
                assert!(decode(type_name, version, damaged).is_err());
                assert!(decode_created(type_name, version, damaged).is_err());
            }
        }
        let other = encode(&Event::VmDeleted(VmDeletedV1 {
            uid: Uuid::from_u128(7),
        }));
        assert_eq!(decode_created("VmDeleted", 1, &other.bytes), Ok(None));
    }
}
