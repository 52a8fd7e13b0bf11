//! The event registry: golden bytes for every (type, version), upcasting, corrupt input.

use std::path::PathBuf;

use uuid::uuid;
use vmplane_core::event::payload::*;
use vmplane_core::event::{self, EVENT_TYPES};
use vmplane_core::*;

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

const UID: uuid::Uuid = uuid!("0b8a5f4e-8d4c-4a35-9a3e-1f2d3c4b5a69");
const FW: uuid::Uuid = uuid!("5a9fc181-957e-5c32-9e5a-2de5e9673531");
const VM_JSON: &str = r#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"testvm","namespace":"default"},"spec":{"runStrategy":"Halted","template":{"spec":{"domain":{"devices":{}}}}}}"#;

/// One fixed sample of every current event type.
fn samples() -> Vec<Event> {
    let revision = RevisionCapturedV1 {
        kind: "VirtualMachineClusterInstancetype".into(),
        name: "u1.medium".into(),
        source_uid: Some("b2c3".into()),
        source_generation: 3,
        object_json: r#"{"apiVersion":"instancetype.kubevirt.io/v1beta1","kind":"VirtualMachineClusterInstancetype","metadata":{"name":"u1.medium"},"spec":{"cpu":{"guest":1},"memory":{"guest":"4Gi"}}}"#.into(),
    };
    vec![
        Event::VmCreated(VmCreatedV2 {
            uid: UID,
            namespace: "default".into(),
            name: "testvm".into(),
            origin: CreateOrigin::Apply,
            manifest_json: VM_JSON.into(),
            firmware_uuid: FW,
            firmware_serial: Some("serial-1".into()),
            firmware_origin: FirmwareOrigin::Generated,
        }),
        Event::VmSpecEdited(VmSpecEditedV1 { manifest_json: VM_JSON.into() }),
        Event::FirmwareUuidAssigned(FirmwareUuidAssignedV1 { uuid: FW, serial: None, origin: FirmwareOrigin::UserSpecified, previous: Some(UID) }),
        Event::InstancetypeRevisionCaptured(revision.clone()),
        Event::PreferenceRevisionCaptured(revision),
        Event::VmDeleted(VmDeletedV1 { uid: UID }),
        Event::VmStartRequested(VmStartRequestedV1 { paused: true, run_strategy_after: Some("Always".into()) }),
        Event::VmStopRequested(VmStopRequestedV1 { vmi_uid: Some(UID), run_strategy_after: None }),
        Event::VmRestartRequested(VmRestartRequestedV1 { vmi_uid: UID }),
        Event::VmiLaunched(VmiLaunchedV1 { vmi_uid: UID, vm_generation: 7, paused: false, at_ms: 1_700_000_000_000 }),
        Event::VmiScheduled(VmiScheduledV1 { vmi_uid: UID, node: "node-1".into(), at_ms: 1_700_000_000_001 }),
        Event::VmiPhaseObserved(VmiPhaseObservedV1 { vmi_uid: UID, phase: VmiPhase::Failed, reason: Some("Crashed".into()), message: None, at_ms: -1 }),
        Event::VmiRemoved(VmiRemovedV1 { vmi_uid: UID, at_ms: 5 }),
        Event::VmStartBackoffScheduled(VmStartBackoffScheduledV1 { consecutive_failures: 3, retry_at_ms: 1_700_000_090_000 }),
        Event::VmiCreated(VmiCreatedV1 {
            uid: UID,
            namespace: "default".into(),
            name: "vmi-fedora".into(),
            manifest_json: r#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance","metadata":{"name":"vmi-fedora"},"spec":{"domain":{}}}"#.into(),
            firmware_uuid: FW,
            firmware_origin: FirmwareOrigin::Generated,
        }),
        Event::VmiDeleted(VmiDeletedV1 { uid: UID }),
        Event::ObjectCreated(ObjectCreatedV1 {
            kind: "VirtualMachineSnapshot".into(),
            uid: UID,
            namespace: Some("default".into()),
            name: "snap".into(),
            manifest_json: r#"{"apiVersion":"snapshot.kubevirt.io/v1beta1","kind":"VirtualMachineSnapshot","metadata":{"name":"snap"}}"#.into(),
        }),
        Event::ObjectUpdated(ObjectUpdatedV1 { manifest_json: "{}".into() }),
        Event::ObjectDeleted(ObjectDeletedV1 { uid: UID }),
        Event::SnapshotTaken(Box::new(SnapshotTakenV1 {
            source_name: "testvm".into(),
            source_uid: Some(UID),
            source_revision: 4,
            source_generation: 2,
            source_position: 1234,
            vm_json: VM_JSON.into(),
            instancetype: Some(revision_sample()),
            preference: None,
            firmware_uuid: Some(FW),
            firmware_serial: Some("serial-1".into()),
            online: true,
            imported: false,
            at_ms: 1_700_000_000_000,
        })),
        Event::SnapshotFailed(SnapshotFailedV1 { reason: "Source does not exist".into(), at_ms: 7 }),
        Event::RestoreTargetFoundRunning(RestoreTargetFoundRunningV1 { vmi_uid: UID, policy: "StopTarget".into(), stop_requested: true, at_ms: 8 }),
        Event::RestoreStarted(Box::new(RestoreStartedV1 {
            snapshot_name: "snap".into(),
            snapshot_uid: Some(UID),
            target_name: "testvm-copy".into(),
            target_uid: None,
            target_generation: 0,
            vm_json: VM_JSON.into(),
            instancetype: None,
            preference: Some(revision_sample()),
            firmware_uuid: FW,
            firmware_serial: None,
            firmware_origin: FirmwareOrigin::Generated,
            macs: vec![MacAddressV1 { interface: "default".into(), mac: "02:00:00:00:00:01".into() }],
            identity_regenerated: true,
            at_ms: 9,
        })),
        Event::RestoreCompleted(RestoreCompletedV1 { target_uid: UID, target_generation: 3, firmware_uuid: FW, at_ms: 10 }),
        Event::RestoreFailed(RestoreFailedV1 { reason: "Restore target not ready".into(), at_ms: 11 }),
        Event::CloneStarted(Box::new(CloneStartedV1 {
            source_kind: "VirtualMachine".into(),
            source_name: "testvm".into(),
            source_uid: None,
            source_revision: 5,
            source_position: 99,
            target_name: "testvm-clone".into(),
            vm_json: VM_JSON.into(),
            instancetype: None,
            preference: None,
            firmware_uuid: UID,
            firmware_serial: Some("new-serial".into()),
            macs: vec![],
            at_ms: 12,
        })),
        Event::CloneSucceeded(CloneSucceededV1 { target_uid: UID, target_generation: 1, at_ms: 13 }),
        Event::CloneFailed(CloneFailedV1 { reason: "VirtualMachine x already exists in namespace default".into(), at_ms: 14 }),
        Event::LogPositionVoided(LogPositionVoidedV1 {
            restore_epoch: FW,
            cut_position: 41,
            voided_position: 42,
            original_id: UID,
            original_hash: [0xa5; 32],
            original_stream: "vm/default/testvm".into(),
            original_event_type: "VmSpecEdited".into(),
            original_schema_version: 1,
            original_actor: "alice".into(),
            original_recorded_at_unix_nanos: 1_700_000_000_000_000_015,
        }),
        Event::VmDeletionRequested(VmDeletionRequestedV1 { uid: UID, vmi_uid: FW, at_ms: 1_700_000_000_002 }),
    ]
}

fn revision_sample() -> RevisionCapturedV1 {
    RevisionCapturedV1 {
        kind: "VirtualMachineClusterPreference".into(),
        name: "fedora".into(),
        source_uid: None,
        source_generation: 1,
        object_json: r#"{"apiVersion":"instancetype.kubevirt.io/v1beta1","kind":"VirtualMachineClusterPreference","metadata":{"name":"fedora"},"spec":{}}"#.into(),
    }
}

fn vm_created_v1() -> VmCreatedV1 {
    VmCreatedV1 {
        uid: UID,
        namespace: "default".into(),
        name: "testvm".into(),
        manifest_json: VM_JSON.into(),
    }
}

/// Reads a golden file; writes it first when `VMPLANE_BLESS_GOLDEN=1` and it is missing (done
/// once, then committed; never rewritten).
fn golden(name: &str, fresh: &[u8]) -> Vec<u8> {
    let path = golden_dir().join(name);
    if !path.exists() && std::env::var("VMPLANE_BLESS_GOLDEN").as_deref() == Ok("1") {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, fresh).unwrap();
    }
    std::fs::read(&path).unwrap_or_else(|_| {
        panic!(
            "missing golden file {} (write it once with VMPLANE_BLESS_GOLDEN=1)",
            path.display()
        )
    })
}

#[test]
fn every_current_event_type_has_golden_bytes_that_still_decode() {
    let samples = samples();
    // Every registered current (type, version) has a sample.
    for (t, v) in EVENT_TYPES {
        let current = samples
            .iter()
            .any(|e| e.type_name() == *t && e.schema_version() == *v);
        let old = (*t, *v) == ("VmCreated", 1);
        assert!(current || old, "no sample for {t} v{v}");
    }
    for e in samples {
        let enc = encode(&e);
        let bytes = golden(
            &format!("{}.v{}.bin", enc.type_name, enc.version),
            &enc.bytes,
        );
        assert_eq!(
            enc.bytes, bytes,
            "{} v{}: the rkyv layout changed; add a new version instead",
            enc.type_name, enc.version
        );
        assert_eq!(decode(enc.type_name, enc.version, &bytes).unwrap(), e);
        validate_payload(enc.type_name, enc.version, &bytes).unwrap();
    }
}

#[test]
fn vm_created_v1_from_before_firmware_uuids_upcasts_with_the_legacy_uuid() {
    let bytes = golden(
        "VmCreated.v1.bin",
        &event::encode_vm_created_v1(&vm_created_v1()),
    );
    let Event::VmCreated(v2) = decode("VmCreated", 1, &bytes).unwrap() else {
        panic!()
    };
    assert_eq!(
        v2.firmware_uuid.to_string(),
        "5a9fc181-957e-5c32-9e5a-2de5e9673531"
    );
    assert_eq!(v2.firmware_origin, FirmwareOrigin::Legacy);
    assert_eq!(v2.firmware_serial, None);
    let doc: serde_json::Value = serde_json::from_str(&v2.manifest_json).unwrap();
    assert_eq!(
        doc["spec"]["template"]["spec"]["domain"]["firmware"]["uuid"],
        "5a9fc181-957e-5c32-9e5a-2de5e9673531"
    );
    // A stream from then folds to a VM whose effective UUID is the one its guest always saw.
    let st = vm::fold(&[Event::VmCreated(v2)]);
    assert_eq!(
        st.firmware.as_ref().unwrap().uuid.to_string(),
        "5a9fc181-957e-5c32-9e5a-2de5e9673531"
    );
    let shown =
        serde_json::to_value(lifecycle::render(&st, &Features::defaults(), 0).unwrap()).unwrap();
    assert_eq!(shown["status"]["firmwareUUIDOrigin"], "Legacy");
}

#[test]
fn corrupt_or_unknown_payloads_are_errors_not_panics() {
    let enc = encode(&samples()[0]);
    for cut in [0, 1, enc.bytes.len() / 2, enc.bytes.len() - 1] {
        let e = decode(enc.type_name, enc.version, &enc.bytes[..cut]).unwrap_err();
        assert!(matches!(e, DecodeError::Corrupt { .. }), "{e}");
    }
    let mut flipped = enc.bytes.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0xff;
    let _ = decode(enc.type_name, enc.version, &flipped); // error or a different value, never a panic
    assert!(matches!(
        decode("NoSuchEvent", 1, &enc.bytes),
        Err(DecodeError::UnknownType { .. })
    ));
    assert!(matches!(
        decode("VmCreated", 99, &enc.bytes),
        Err(DecodeError::UnknownType { .. })
    ));
    let bad_json = encode(&Event::VmSpecEdited(VmSpecEditedV1 {
        manifest_json: "{not json".into(),
    }));
    assert!(decode(bad_json.type_name, 1, &bad_json.bytes).is_ok());
    assert!(validate_payload(bad_json.type_name, 1, &bad_json.bytes).is_err());
    // Folding such an event does not panic either; it is counted.
    let st = vm::evolve(
        VmState::default(),
        &Event::VmSpecEdited(VmSpecEditedV1 {
            manifest_json: "{".into(),
        }),
    );
    assert_eq!(st.unreadable_events, 1);
}

#[test]
fn events_have_a_serde_form_for_watch_output() {
    let json = serde_json::to_value(&samples()[11]).unwrap();
    assert_eq!(json["type"], "VmiPhaseObserved");
    assert_eq!(json["data"]["phase"], "Failed");
}
