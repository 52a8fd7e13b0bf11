//! semantics.md §1, one test per row.

use std::collections::{BTreeMap, HashMap};

use uuid::{Uuid, uuid};
use vmplane_core::event::{FirmwareOrigin, VmiPhase};
use vmplane_core::firmware::*;
use vmplane_core::lifecycle::{self, restart_required};
use vmplane_core::*;

use crate::support::*;

fn fw_uuid(state: &VmState) -> Uuid {
    state.firmware.as_ref().expect("identity").uuid
}

fn running(s: &mut Scenario) {
    s.ok(launch());
    s.observe(VmiPhase::Running);
}

#[test]
fn legacy_uuid_matches_kubevirt() {
    assert_eq!(
        legacy_firmware_uuid("testvm"),
        uuid!("5a9fc181-957e-5c32-9e5a-2de5e9673531")
    );
    assert_eq!(
        legacy_firmware_uuid("vm-cirros"),
        uuid!("0d2a2043-41c0-59c3-9b17-025022203668")
    );
    assert_eq!(
        legacy_firmware_uuid("larry"),
        uuid!("7fc91a6e-3385-5749-addf-690bfd75fd60")
    );
    assert_eq!(
        legacy_firmware_uuid("vm-windows-clarge-windows"),
        uuid!("46dc1c10-ecb2-5734-b770-c02d19f3802a")
    );
}

#[test]
fn row_01_created_without_uuid_gets_random_v4_and_serial() {
    let mut s = Scenario::new();
    let d = s.create(small_vm("testvm", "Halted"));
    assert_eq!(types_of(&d), ["VmCreated"]);
    let c = created(&d);
    assert_eq!(c.firmware_origin, FirmwareOrigin::Generated);
    assert_eq!(c.firmware_uuid.get_version_num(), 4);
    assert_ne!(c.firmware_uuid, legacy_firmware_uuid("testvm"));
    let serial = c.firmware_serial.clone().expect("a serial");
    assert!(Uuid::parse_str(&serial).is_ok());
    // In the same append: the stored spec carries it, and the claim is taken.
    let st = s.state();
    let fw = st.vm.as_ref().unwrap().firmware().unwrap();
    assert_eq!(
        fw.uuid.as_deref(),
        Some(c.firmware_uuid.to_string().as_str())
    );
    assert_eq!(fw.serial.as_deref(), Some(serial.as_str()));
    assert_eq!(
        d.claims,
        [Claim::Acquire {
            key: claim_key(&c.firmware_uuid),
            owner: "vm/default/testvm".into()
        }]
    );
    // A given serial is kept.
    let mut vm = small_vm("other", "Halted");
    vm.firmware_mut().serial = Some("my-serial".into());
    let d = Scenario::new().create(vm);
    assert_eq!(created(&d).firmware_serial.as_deref(), Some("my-serial"));
}

#[test]
fn row_02_created_with_uuid_keeps_it() {
    let given = "11111111-2222-4333-8444-555555555555";
    let mut vm = small_vm("testvm", "Halted");
    vm.firmware_mut().uuid = Some(given.into());
    let d = Scenario::new().create(vm);
    let c = created(&d);
    assert_eq!(c.firmware_uuid.to_string(), given);
    assert_eq!(c.firmware_origin, FirmwareOrigin::UserSpecified);
}

#[test]
fn row_03_uuid_survives_start_stop_restart_and_replay() {
    let mut s = Scenario::new();
    s.create(small_vm("testvm", "Manual"));
    let original = fw_uuid(&s.state());
    s.ok(VmCommand::Start { paused: false });
    running(&mut s);
    s.ok(VmCommand::Restart);
    let old = s.state().run.vmi.unwrap().uid;
    s.ok(VmCommand::ObserveVmi {
        vmi_uid: old,
        observation: VmiObservation::Phase {
            phase: VmiPhase::Succeeded,
            reason: None,
            message: None,
        },
    });
    s.ok(VmCommand::ObserveVmi {
        vmi_uid: old,
        observation: VmiObservation::Removed,
    });
    running(&mut s);
    s.ok(VmCommand::Stop);
    assert_eq!(fw_uuid(&s.state()), original);
    // Replay (vmplane restarted / restored from backup): encode every event and fold again.
    let replayed = vm::fold(
        &s.events
            .iter()
            .map(|e| {
                let enc = encode(e);
                decode(enc.type_name, enc.version, &enc.bytes).unwrap()
            })
            .collect::<Vec<_>>(),
    );
    assert_eq!(fw_uuid(&replayed), original);
    assert_eq!(replayed, s.state());
}

#[test]
fn row_04_import_without_uuid_gets_kubevirt_legacy_uuid() {
    for (file, name, expected) in [
        (
            "examples/vm-cirros.yaml",
            "vm-cirros",
            "0d2a2043-41c0-59c3-9b17-025022203668",
        ),
        ("examples/vm-priorityclass.yaml", "vm-non-preemtible", ""),
    ] {
        let vm = load_vm(file);
        let mut put = PutVm::new(vm);
        put.origin = event::CreateOrigin::Import;
        let mut s = Scenario::new();
        let d = s.ok(VmCommand::Create(Box::new(put)));
        let c = created(&d);
        assert_eq!(c.firmware_origin, FirmwareOrigin::Legacy);
        assert_eq!(c.firmware_uuid, legacy_firmware_uuid(name));
        if !expected.is_empty() {
            assert_eq!(c.firmware_uuid.to_string(), expected);
        }
        assert_eq!(
            c.firmware_serial, None,
            "an imported VM keeps having no serial"
        );
        assert_eq!(c.origin, event::CreateOrigin::Import);
    }
    let mut put = PutVm::new(small_vm("testvm", "Halted"));
    put.origin = event::CreateOrigin::Import;
    let d = Scenario::new().ok(VmCommand::Create(Box::new(put)));
    assert_eq!(
        created(&d).firmware_uuid.to_string(),
        "5a9fc181-957e-5c32-9e5a-2de5e9673531"
    );
}

#[test]
fn row_05_user_edits_uuid_new_assignment_effective_at_next_start() {
    let mut s = Scenario::new();
    s.create(small_vm("testvm", "Always"));
    let old = fw_uuid(&s.state());
    running(&mut s);
    let new = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee";
    let mut vm = small_vm("testvm", "Always");
    vm.firmware_mut().uuid = Some(new.into());
    let d = s.apply(vm);
    assert_eq!(types_of(&d), ["VmSpecEdited", "FirmwareUuidAssigned"]);
    match &d.events[1] {
        Event::FirmwareUuidAssigned(a) => {
            assert_eq!(a.uuid.to_string(), new);
            assert_eq!(a.origin, FirmwareOrigin::UserSpecified);
            assert_eq!(a.previous, Some(old));
        }
        e => panic!("{e:?}"),
    }
    // The running guest still has the old UUID: it stays held (row 7) until the VMI is gone.
    assert_eq!(
        d.claims,
        [Claim::Acquire {
            key: format!("firmware-uuid/{new}"),
            owner: "vm/default/testvm".into()
        },]
    );
    let st = s.state();
    assert!(restart_required(&st), "RestartRequired while running");
    assert_eq!(
        st.run
            .vmi
            .as_ref()
            .unwrap()
            .started
            .template_spec
            .as_ref()
            .unwrap()
            .domain
            .firmware
            .as_ref()
            .unwrap()
            .uuid
            .as_deref(),
        Some(old.to_string().as_str()),
        "the running VMI keeps the UUID it started with"
    );
}

#[test]
fn row_06_reapply_without_uuid_keeps_assigned_uuid_and_changes_nothing() {
    let mut s = Scenario::new();
    s.create(small_vm("testvm", "Halted"));
    let before = s.state();
    let d = s.apply(small_vm("testvm", "Halted"));
    assert_eq!(d.outcome, Outcome::Unchanged);
    assert!(d.events.is_empty() && d.claims.is_empty());
    // And an edit elsewhere keeps the UUID too.
    let mut vm = small_vm("testvm", "Halted");
    vm.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("tier".into(), "web".into());
    let d = s.apply(vm);
    assert_eq!(types_of(&d), ["VmSpecEdited"]);
    assert_eq!(fw_uuid(&s.state()), fw_uuid(&before));
    assert_eq!(s.state().firmware, before.firmware);
}

/// A minimal model of the store's atomic claim table: all claims of a decision apply together
/// or not at all.
#[derive(Default)]
struct ClaimTable(HashMap<String, String>);

impl ClaimTable {
    fn apply(&mut self, claims: &[Claim]) -> Result<(), (String, String)> {
        let mut next = self.0.clone();
        for c in claims {
            match c {
                Claim::Acquire { key, owner } => match next.get(key) {
                    Some(holder) if holder != owner => return Err((key.clone(), holder.clone())),
                    _ => {
                        next.insert(key.clone(), owner.clone());
                    }
                },
                Claim::Release { key, owner } => {
                    if next.get(key) == Some(owner) {
                        next.remove(key);
                    }
                }
            }
        }
        self.0 = next;
        Ok(())
    }
}

#[test]
fn row_07_uuid_held_by_another_live_vm_is_rejected_atomically() {
    let shared = "99999999-8888-4777-8666-555555555555";
    let with_uuid = |name: &str| {
        let mut vm = small_vm(name, "Halted");
        vm.firmware_mut().uuid = Some(shared.into());
        vm
    };
    // Two concurrent creates: both decide on empty streams, both claim the same key.
    let (mut a, mut b) = (Scenario::new(), Scenario::new());
    let da = a.create(with_uuid("a"));
    let db = b.create(with_uuid("b"));
    assert_eq!(da.claims[0].key(), db.claims[0].key());
    let mut table = ClaimTable::default();
    let results = [table.apply(&da.claims), table.apply(&db.claims)];
    assert_eq!(
        results.iter().filter(|r| r.is_ok()).count(),
        1,
        "exactly one success"
    );
    let (key, holder) = results[1].clone().unwrap_err();
    let rejection =
        Rejection::firmware_uuid_taken(key.trim_start_matches("firmware-uuid/"), &holder);
    assert_eq!(rejection.category, Category::AlreadyExists);
    assert!(rejection.has_code(codes::FIRMWARE_UUID_TAKEN));
    // Named only to a reader who may read the holder's namespace.
    assert!(
        rejection
            .describe_for(|ns| ns == Some("default"))
            .contains("vm/default/a"),
        "{rejection}"
    );
    assert!(
        !rejection.to_string().contains("vm/default/a")
            && !rejection
                .describe_for(|ns| ns == Some("other"))
                .contains("default")
            && rejection.to_string().contains("another object"),
        "{rejection}"
    );
    // Deleting the holder releases the UUID; then b can have it.
    let del = a.ok(VmCommand::Delete {
        expected_generation: None,
    });
    table.apply(&del.claims).unwrap();
    assert!(table.apply(&db.claims).is_ok());
}

#[test]
fn row_07_a_uuid_a_running_vmi_still_has_after_an_edit_stays_held_until_the_vmi_is_gone() {
    let mut table = ClaimTable::default();
    let mut a = Scenario::new();
    table
        .apply(&a.create(small_vm("a", "Always")).claims)
        .unwrap();
    let old = fw_uuid(&a.state());
    running(&mut a);
    let mut edited = small_vm("a", "Always");
    edited.firmware_mut().uuid = Some("aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee".into());
    table.apply(&a.apply(edited).claims).unwrap();
    // Another VM with the old UUID: refused while a's guest runs with it.
    let mut b = Scenario::new();
    let mut dup = small_vm("b", "Halted");
    dup.firmware_mut().uuid = Some(old.to_string());
    let db = b.create(dup);
    assert_eq!(
        table.apply(&db.claims),
        Err((claim_key(&old), "vm/default/a".to_owned()))
    );
    // a's VMI stops and is removed: the old UUID is free.
    a.observe(VmiPhase::Succeeded);
    let uid = a.state().run.vmi.as_ref().unwrap().uid;
    let removed = a.ok(VmCommand::ObserveVmi {
        vmi_uid: uid,
        observation: VmiObservation::Removed,
    });
    assert_eq!(
        removed.claims,
        [Claim::Release {
            key: claim_key(&old),
            owner: "vm/default/a".into()
        }]
    );
    table.apply(&removed.claims).unwrap();
    assert!(table.apply(&db.claims).is_ok());
}

#[test]
fn row_08_snapshot_records_uuid_and_serial() {
    let mut s = Scenario::new();
    s.create(small_vm("larry", "Halted"));
    let id = s.state().firmware.unwrap();
    let snap = identity_for_snapshot(&id);
    assert_eq!(snap.uuid, Some(id.uuid));
    assert_eq!(snap.serial, id.serial);
    assert!(snap.serial.is_some());
}

#[test]
fn row_09_restore_onto_same_vm_takes_snapshot_uuid_or_legacy() {
    let mut c = ctx();
    let snap = SnapshotIdentity {
        uuid: Some(uuid!("12345678-1234-4234-8234-123456789abc")),
        serial: Some("s1".into()),
    };
    let id = identity_for_restore(&snap, "larry", "larry", true, &["default".into()], &mut c);
    assert_eq!(
        (id.uuid, id.serial.as_deref(), id.origin, id.regenerated),
        (
            snap.uuid.unwrap(),
            Some("s1"),
            FirmwareOrigin::Restored,
            false
        )
    );
    assert!(id.macs.is_empty());
    let imported = SnapshotIdentity {
        uuid: None,
        serial: None,
    };
    let id = identity_for_restore(&imported, "larry", "larry", false, &[], &mut c);
    assert_eq!(id.uuid, uuid!("7fc91a6e-3385-5749-addf-690bfd75fd60"));
    assert_eq!(id.origin, FirmwareOrigin::Legacy);
}

#[test]
fn row_10_restore_as_new_vm_keeps_uuid_only_if_free() {
    let mut c = ctx();
    let snap = SnapshotIdentity {
        uuid: Some(uuid!("12345678-1234-4234-8234-123456789abc")),
        serial: Some("s1".into()),
    };
    let ifaces = vec!["default".to_owned(), "nic2".to_owned()];
    // Disaster recovery: nobody holds it.
    let id = identity_for_restore(&snap, "larry", "larry-dr", false, &ifaces, &mut c);
    assert_eq!(
        (id.uuid, id.origin, id.regenerated),
        (snap.uuid.unwrap(), FirmwareOrigin::Restored, false)
    );
    assert!(id.macs.is_empty());
    // Next to the original: a new identity, reported.
    let id = identity_for_restore(&snap, "larry", "larry-copy", true, &ifaces, &mut c);
    assert_ne!(id.uuid, snap.uuid.unwrap());
    assert_eq!(id.uuid.get_version_num(), 4);
    assert_ne!(id.serial, snap.serial);
    assert!(id.regenerated);
    assert_eq!(id.macs.keys().cloned().collect::<Vec<_>>(), ifaces);
    // Applied to a VM.
    let mut vm = load_vm("examples/vm-cirros.yaml");
    apply_identity(&mut vm, &id);
    assert_eq!(
        vm.firmware().unwrap().uuid.as_deref(),
        Some(id.uuid.to_string().as_str())
    );
}

#[test]
fn row_11_clone_always_gets_new_uuid_serial_and_macs() {
    let mut c = ctx();
    let ifaces = vec!["default".to_owned(), "nic2".to_owned()];
    let mut requested = BTreeMap::new();
    requested.insert("nic2".to_owned(), "02:00:00:00:00:02".to_owned());
    let a = identity_for_clone(&ifaces, None, &requested, &mut c);
    let b = identity_for_clone(&ifaces, Some("new-serial"), &BTreeMap::new(), &mut c);
    assert_ne!(a.uuid, b.uuid);
    assert_eq!(a.origin, FirmwareOrigin::Cloned);
    assert_eq!(a.macs["nic2"], "02:00:00:00:00:02");
    assert_ne!(a.macs["default"], b.macs["default"]);
    assert_eq!(b.serial.as_deref(), Some("new-serial"));
    assert!(a.serial.is_some() && a.serial != b.serial);
}

#[test]
fn row_12_standalone_vmi_without_uuid_gets_random_v4() {
    let m = load("examples/vmi-fedora.yaml").remove(0);
    let types::Manifest::VirtualMachineInstance(vmi) = m else {
        panic!()
    };
    let d = vmi::decide(&VmiState::default(), &VmiCommand::Create(vmi), &mut ctx()).unwrap();
    let Event::VmiCreated(c) = &d.events[0] else {
        panic!()
    };
    assert_eq!(c.firmware_uuid.get_version_num(), 4);
    assert_eq!(c.firmware_origin, FirmwareOrigin::Generated);
    assert_eq!(d.claims[0].key(), claim_key(&c.firmware_uuid));
    let st = d.events.iter().fold(VmiState::default(), vmi::evolve);
    assert_eq!(
        st.vmi.unwrap().spec.domain.firmware.unwrap().uuid,
        Some(c.firmware_uuid.to_string())
    );
}

#[test]
fn row_13_restart_required_never_raised_by_unchanged_uuid() {
    let mut s = Scenario::new();
    s.create(small_vm("testvm", "Always"));
    running(&mut s);
    // GitOps re-apply without the UUID: nothing, and no RestartRequired.
    let d = s.apply(small_vm("testvm", "Always"));
    assert_eq!(d.outcome, Outcome::Unchanged);
    assert!(!restart_required(&s.state()));
    // Re-apply with the same UUID spelled out: still nothing.
    let mut vm = small_vm("testvm", "Always");
    let st = s.state();
    let fw = st.firmware.as_ref().unwrap();
    vm.firmware_mut().uuid = Some(fw.uuid.to_string());
    vm.firmware_mut().serial.clone_from(&fw.serial);
    assert_eq!(s.apply(vm).outcome, Outcome::Unchanged);
    let conds = lifecycle::conditions(&s.state(), &Features::defaults(), 0);
    assert!(!conds.iter().any(|c| c.kind == "RestartRequired"));
    // A real template change does raise it, with KubeVirt's message.
    let mut vm = small_vm("testvm", "Always");
    vm.vmi_spec_mut().domain.memory_mut().guest = Some("256Mi".parse().unwrap());
    s.apply(vm);
    let conds = lifecycle::conditions(&s.state(), &Features::defaults(), 0);
    let rr = conds
        .iter()
        .find(|c| c.kind == "RestartRequired")
        .expect("RestartRequired");
    assert_eq!(
        rr.message,
        "a non-live-updatable field was changed in the template spec"
    );
}

#[test]
fn row_14_get_shows_effective_uuid_in_spec_and_origin_in_status() {
    let mut s = Scenario::new();
    s.create(small_vm("testvm", "Halted"));
    let st = s.state();
    let rendered = lifecycle::render(&st, &Features::defaults(), 0).unwrap();
    let v = serde_json::to_value(&rendered).unwrap();
    assert_eq!(
        v["spec"]["template"]["spec"]["domain"]["firmware"]["uuid"],
        fw_uuid(&st).to_string()
    );
    assert_eq!(v["status"]["firmwareUUIDOrigin"], "Generated");
    assert_eq!(v["metadata"]["generation"], 1);
    assert_eq!(v["metadata"]["uid"], st.uid.unwrap().to_string());
}
