//! Snapshots, restores and clones (semantics.md §1 rows 8–11, §5; kubevirt.md §1.5, §3).
//!
//! Given a log of several streams / when a snapshot, restore or clone command (driven through
//! its saga as the gateway would) / then events on each stream, or a specific rejection.
//! [`World`] is the harness: a global log with positions, the store's atomic claim table, and
//! [`World::drive_restore`] / [`World::drive_clone`], which run the saga steps in the order
//! the gateway must.

use std::collections::HashMap;

use uuid::{Uuid, uuid};
use vmplane_core::event::{CreateOrigin, FirmwareOrigin, VmiPhase};
use vmplane_core::firmware::{claim_key, legacy_firmware_uuid};
use vmplane_core::types::{GenericObject, Manifest, VirtualMachine};
use vmplane_core::*;

use crate::support::*;

/// A global log (position = index + 1) with the store's claim table.
struct World {
    ctx: Ctx,
    log: Vec<(String, Event)>,
    claims: HashMap<String, String>,
    features: Features,
}

impl World {
    fn new() -> Self {
        World {
            ctx: ctx(),
            log: Vec::new(),
            claims: HashMap::new(),
            features: Features::defaults(),
        }
    }

    fn events(&self, stream: &str) -> Vec<Event> {
        self.log
            .iter()
            .filter(|(s, _)| s == stream)
            .map(|(_, e)| e.clone())
            .collect()
    }

    fn position(&self) -> u64 {
        self.log.len() as u64
    }

    fn vm(&self, name: &str) -> VmState {
        vm::fold(&self.events(&streams::vm("default", name)))
    }

    fn snapshot(&self, name: &str) -> SnapshotState {
        snapshot::fold(&self.events(&format!("snapshot/default/{name}")))
    }

    fn restore(&self, name: &str) -> RestoreState {
        restore::fold(&self.events(&format!("restore/default/{name}")))
    }

    fn clone_state(&self, name: &str) -> CloneState {
        clone::fold(&self.events(&format!("clone/default/{name}")))
    }

    /// The store's append: claims all-or-nothing, events through the rkyv registry.
    fn append(&mut self, stream: &str, d: &Decision) -> Result<(), Rejection> {
        let mut next = self.claims.clone();
        for c in &d.claims {
            match c {
                Claim::Acquire { key, owner } => match next.get(key) {
                    Some(holder) if holder != owner => {
                        return Err(Rejection::firmware_uuid_taken(
                            key.trim_start_matches("firmware-uuid/"),
                            holder,
                        ));
                    }
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
        self.claims = next;
        for e in &d.events {
            let enc = encode(e);
            let back = decode(enc.type_name, enc.version, &enc.bytes).expect("decodes");
            assert_eq!(&back, e, "event survives the registry");
            self.log.push((stream.to_owned(), back));
        }
        Ok(())
    }

    fn vm_cmd(&mut self, name: &str, cmd: VmCommand) -> Result<Decision, Rejection> {
        let stream = streams::vm("default", name);
        let d = vm::decide(&vm::fold(&self.events(&stream)), &cmd, &mut self.ctx)?;
        self.append(&stream, &d)?;
        Ok(d)
    }

    fn create_vm(&mut self, vm: VirtualMachine) {
        let name = vm.metadata.name.clone().unwrap();
        self.vm_cmd(&name, VmCommand::Create(Box::new(PutVm::new(vm))))
            .unwrap();
    }

    fn run_vm(&mut self, name: &str) {
        self.vm_cmd(name, launch()).unwrap();
        let uid = self.vm(name).run.vmi.unwrap().uid;
        self.observe(name, uid, VmiPhase::Running);
    }

    fn observe(&mut self, name: &str, uid: Uuid, phase: VmiPhase) {
        self.vm_cmd(
            name,
            VmCommand::ObserveVmi {
                vmi_uid: uid,
                observation: VmiObservation::Phase {
                    phase,
                    reason: None,
                    message: None,
                },
            },
        )
        .unwrap();
    }

    /// The reconciler stops the running VMI (after a stop request).
    fn vmi_stops(&mut self, name: &str) {
        let uid = self.vm(name).run.vmi.unwrap().uid;
        self.observe(name, uid, VmiPhase::Succeeded);
    }

    fn take(&mut self, manifest: GenericObject) -> Result<Decision, Rejection> {
        let name = manifest.metadata.name.clone().unwrap();
        let stream = format!("snapshot/default/{name}");
        let state = self.snapshot(&name);
        let source = manifest.spec.as_ref().unwrap()["source"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let cmd = SnapshotCommand::Take(Box::new(TakeSnapshot {
            manifest: Some(manifest),
            source: self.vm(&source),
            source_position: self.position(),
            features: self.features.clone(),
        }));
        let d = snapshot::decide(&state, &cmd, &mut self.ctx)?;
        self.append(&stream, &d)?;
        Ok(d)
    }

    fn snapshot_of(&mut self, vm: &str, name: &str) -> Decision {
        self.take(snapshot_manifest(name, vm)).unwrap()
    }

    /// Creates a snapshot, restore or clone through the generic object path (`ObjectCreated`
    /// only: no saga step, none of the saga's own admission rules).
    fn create_object(&mut self, kind: types::Kind, manifest: GenericObject) {
        let stream = streams::for_object(kind, "default", manifest.metadata.name_str());
        let d = object::decide(
            &self
                .events(&stream)
                .iter()
                .fold(ObjectState::default(), object::evolve),
            &ObjectCommand::Create(Box::new(Manifest::Object(kind, Box::new(manifest)))),
            &mut self.ctx,
        )
        .unwrap();
        self.append(&stream, &d).unwrap();
    }

    /// A snapshot of `vm` created through the object path: `InProgress` until taken.
    fn snapshot_in_progress(&mut self, vm: &str, name: &str) {
        self.create_object(
            types::Kind::VirtualMachineSnapshot,
            snapshot_manifest(name, vm),
        );
    }

    /// Takes a snapshot created earlier (the driver's `Take`, without a manifest).
    fn take_pending(&mut self, vm: &str, name: &str) {
        let d = snapshot::decide(
            &self.snapshot(name),
            &SnapshotCommand::Take(Box::new(TakeSnapshot {
                manifest: None,
                source: self.vm(vm),
                source_position: self.position(),
                features: self.features.clone(),
            })),
            &mut self.ctx,
        )
        .unwrap();
        self.append(&format!("snapshot/default/{name}"), &d)
            .unwrap();
    }

    /// Saga step 1/3 of a restore: read the snapshot, the target and the UUID's holder, decide
    /// `Progress`, append to the restore stream.
    fn restore_step(
        &mut self,
        name: &str,
        manifest: Option<GenericObject>,
    ) -> Result<SagaDecision, Rejection> {
        let stream = format!("restore/default/{name}");
        let state = self.restore(name);
        let (snap_stream, target_stream) =
            restore::input_streams(&state, manifest.as_ref()).expect("spec names streams");
        let snapshot = snapshot::fold(&self.events(&snap_stream));
        let target = vm::fold(&self.events(&target_stream));
        let uuid_holder = restore::uuid_to_check(&snapshot)
            .and_then(|u| self.claims.get(&claim_key(&u)).cloned());
        let input = RestoreInput {
            manifest,
            snapshot,
            target,
            uuid_holder,
            features: self.features.clone(),
        };
        let d = restore::decide(
            &state,
            &RestoreCommand::Progress(Box::new(input)),
            &mut self.ctx,
        )?;
        self.append(&stream, &d.decision).unwrap();
        Ok(d)
    }

    /// Runs a restore's saga as the gateway does, until it finishes or waits; returns every
    /// `Next` seen.
    fn drive_restore(
        &mut self,
        name: &str,
        manifest: Option<GenericObject>,
    ) -> Result<Vec<Next>, Rejection> {
        let mut manifest = manifest;
        let mut trace = Vec::new();
        for _ in 0..8 {
            let d = self.restore_step(name, manifest.take())?;
            trace.push(d.next.clone());
            let Next::ApplyToTarget { stream, command } = d.next else {
                return Ok(trace);
            };
            let target = vm::fold(&self.events(&stream));
            let applied = vm::decide(&target, &command, &mut self.ctx)
                .and_then(|vd| self.append(&stream, &vd));
            if let Err(rejection) = applied {
                let is_stop = command == VmCommand::Stop;
                let r = restore::decide(
                    &self.restore(name),
                    &RestoreCommand::TargetRejected { rejection },
                    &mut self.ctx,
                )
                .unwrap();
                self.append(&format!("restore/default/{name}"), &r.decision)
                    .unwrap();
                if !is_stop {
                    trace.push(r.next);
                    return Ok(trace);
                }
            }
        }
        panic!("restore saga did not settle: {trace:?}")
    }

    fn clone_step(
        &mut self,
        name: &str,
        manifest: Option<GenericObject>,
    ) -> Result<SagaDecision, Rejection> {
        let stream = format!("clone/default/{name}");
        let state = self.clone_state(name);
        let (source_stream, target) =
            clone::input_streams(&state, manifest.as_ref()).expect("spec names streams");
        let source = if source_stream.starts_with("snapshot/") {
            CloneSource::Snapshot(Box::new(snapshot::fold(&self.events(&source_stream))))
        } else {
            CloneSource::VirtualMachine {
                vm: Box::new(vm::fold(&self.events(&source_stream))),
                position: self.position(),
            }
        };
        let target = target
            .map(|t| vm::fold(&self.events(&streams::vm("default", &t))))
            .unwrap_or_default();
        let input = CloneInput {
            manifest,
            source,
            target,
            features: self.features.clone(),
        };
        let d = clone::decide(
            &state,
            &CloneCommand::Progress(Box::new(input)),
            &mut self.ctx,
        )?;
        self.append(&stream, &d.decision).unwrap();
        Ok(d)
    }

    fn drive_clone(
        &mut self,
        name: &str,
        manifest: Option<GenericObject>,
    ) -> Result<Vec<Next>, Rejection> {
        let mut manifest = manifest;
        let mut trace = Vec::new();
        for _ in 0..6 {
            let d = self.clone_step(name, manifest.take())?;
            trace.push(d.next.clone());
            let Next::ApplyToTarget { stream, command } = d.next else {
                return Ok(trace);
            };
            let target = vm::fold(&self.events(&stream));
            let applied = vm::decide(&target, &command, &mut self.ctx)
                .and_then(|vd| self.append(&stream, &vd));
            if let Err(rejection) = applied {
                let r = clone::decide(
                    &self.clone_state(name),
                    &CloneCommand::TargetRejected { rejection },
                    &mut self.ctx,
                )
                .unwrap();
                self.append(&format!("clone/default/{name}"), &r.decision)
                    .unwrap();
                trace.push(r.next);
                return Ok(trace);
            }
        }
        panic!("clone saga did not settle: {trace:?}")
    }
}

fn object(m: Manifest) -> GenericObject {
    match m {
        Manifest::Object(_, o) => *o,
        other => panic!("not a generic object: {:?}", other.kind()),
    }
}

fn object_yaml(yaml: &str) -> GenericObject {
    object(types::parse_manifest(yaml.as_bytes()).expect("test manifest"))
}

fn snippet(file: &str) -> GenericObject {
    object(load(&format!("user-guide-snippets/{file}")).remove(0))
}

fn snapshot_manifest(name: &str, vm: &str) -> GenericObject {
    object_yaml(&format!(
        "apiVersion: snapshot.kubevirt.io/v1beta1\nkind: VirtualMachineSnapshot\nmetadata: {{name: {name}}}\nspec:\n  source: {{apiGroup: kubevirt.io, kind: VirtualMachine, name: {vm}}}\n"
    ))
}

fn restore_manifest(name: &str, snapshot: &str, target: &str, extra: &str) -> GenericObject {
    object_yaml(&format!(
        "apiVersion: snapshot.kubevirt.io/v1beta1\nkind: VirtualMachineRestore\nmetadata: {{name: {name}}}\nspec:\n  target: {{apiGroup: kubevirt.io, kind: VirtualMachine, name: {target}}}\n  virtualMachineSnapshotName: {snapshot}\n{extra}"
    ))
}

fn clone_manifest(
    name: &str,
    source_kind: &str,
    source: &str,
    target: &str,
    extra: &str,
) -> GenericObject {
    let group = if source_kind == "VirtualMachine" {
        "kubevirt.io"
    } else {
        "snapshot.kubevirt.io"
    };
    object_yaml(&format!(
        "apiVersion: clone.kubevirt.io/v1beta1\nkind: VirtualMachineClone\nmetadata: {{name: {name}}}\nspec:\n  source: {{apiGroup: {group}, kind: {source_kind}, name: {source}}}\n  target: {{apiGroup: kubevirt.io, kind: VirtualMachine, name: {target}}}\n{extra}"
    ))
}

/// A VM with two interfaces (for the MAC rules).
fn vm_with_nics(name: &str, rs: &str) -> VirtualMachine {
    let mut vm = small_vm(name, rs);
    let ifaces: Vec<types::Interface> = serde_json::from_value(serde_json::json!([
        {"name": "default", "masquerade": {}, "macAddress": "02:aa:aa:aa:aa:01"},
        {"name": "interfaceName", "bridge": {}, "macAddress": "02:aa:aa:aa:aa:02"},
    ]))
    .unwrap();
    vm.vmi_spec_mut().domain.devices_mut().interfaces = Some(ifaces);
    vm.vmi_spec_mut().networks = Some(
        serde_json::from_value(serde_json::json!([
            {"name": "default", "pod": {}},
            {"name": "interfaceName", "multus": {"networkName": "br"}},
        ]))
        .unwrap(),
    );
    vm
}

fn fw(w: &World, name: &str) -> (Uuid, Option<String>, FirmwareOrigin) {
    let f = w.vm(name).firmware.expect("identity");
    (f.uuid, f.serial, f.origin)
}

fn macs(vm: &VirtualMachine) -> Vec<Option<String>> {
    vm.vmi_spec()
        .and_then(|s| s.domain.devices.as_ref())
        .and_then(|d| d.interfaces.as_ref())
        .map(|i| i.iter().map(|i| i.mac_address.clone()).collect())
        .unwrap_or_default()
}

fn status_of(v: Option<serde_json::Value>) -> serde_json::Value {
    v.expect("a status")
}

fn condition<'a>(status: &'a serde_json::Value, kind: &str) -> &'a serde_json::Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} condition in {status}"))
}

fn started(w: &World, name: &str) -> event::RestoreStarted {
    *w.restore(name).started.expect("RestoreStarted")
}

// ---------------------------------------------------------------------------------------------
// Snapshots (row 8)
// ---------------------------------------------------------------------------------------------

#[test]
fn row_08_snapshot_records_uuid_and_serial() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    let (uuid, serial, _) = fw(&w, "larry");
    let before = w.vm("larry");
    let position = w.position();
    // The user guide's snapshot of larry.
    let d = w.take(snippet("vmsnapshot-snap-larry.yaml")).unwrap();
    assert_eq!(types_of(&d), ["ObjectCreated", "SnapshotTaken"]);
    assert_eq!(d.outcome, Outcome::Created);
    assert!(d.claims.is_empty());
    let s = w.snapshot("snap-larry");
    let t = s.taken.clone().unwrap();
    assert_eq!(
        (t.firmware_uuid, t.firmware_serial.clone()),
        (Some(uuid), serial.clone())
    );
    assert_eq!(
        (
            t.source_uid,
            t.source_revision,
            t.source_generation,
            t.source_position
        ),
        (before.uid, before.revision, before.generation, position)
    );
    assert!(!t.online && !t.imported);
    // The stored VM at that revision, effective identity included.
    let vm = s.vm().unwrap();
    assert_eq!(vm, *before.vm.clone().unwrap());
    assert_eq!(vm.firmware().unwrap().uuid, Some(uuid.to_string()));
    // KubeVirt's status shape.
    let st = status_of(snapshot::render_snapshot(&s));
    assert_eq!(st["phase"], "Succeeded");
    assert_eq!(st["readyToUse"], true);
    assert_eq!(st["sourceUID"], before.uid.unwrap().to_string());
    assert_eq!(
        st["virtualMachineSnapshotContentName"],
        format!("vmsnapshot-content-{}", s.object.uid.unwrap())
    );
    assert_eq!(st["creationTime"], "2023-11-14T22:13:20Z");
    assert_eq!(condition(&st, "Ready")["status"], "True");
    assert_eq!(condition(&st, "Ready")["reason"], "Ready");
    assert_eq!(condition(&st, "Progressing")["status"], "False");
    assert_eq!(
        condition(&st, "Progressing")["reason"],
        "Operation complete"
    );
    assert_eq!(st["firmwareUUID"], uuid.to_string());
    assert_eq!(st["firmwareSerial"], serial.unwrap());
    // It is a capture at one position: later edits do not change it.
    let mut edited = small_vm("larry", "Halted");
    edited.vmi_spec_mut().domain.memory_mut().guest = Some("1Gi".parse().unwrap());
    w.vm_cmd("larry", apply_cmd(edited)).unwrap();
    assert_eq!(w.snapshot("snap-larry").vm().unwrap(), *before.vm.unwrap());
    // The whole object renders with the status.
    let m = snapshot::render(&w.snapshot("snap-larry")).unwrap();
    assert_eq!(m.to_value()["status"]["phase"], "Succeeded");
    assert_eq!(m.to_value()["metadata"]["generation"], 1);
}

#[test]
fn snapshot_records_instancetype_and_preference_revisions_and_online() {
    let mut w = World::new();
    let mut vm = small_vm("larry", "Always");
    vm.vmi_spec_mut().domain.memory_mut().guest = None;
    vm.spec.instancetype = Some(types::Matcher {
        name: Some("u1.medium".into()),
        ..Default::default()
    });
    let mut it = instancetype(CLUSTER_INSTANCETYPES, "u1.medium");
    it.metadata.generation = Some(3);
    w.vm_cmd(
        "larry",
        VmCommand::Create(Box::new(PutVm {
            instancetype: Some(it),
            ..PutVm::new(vm)
        })),
    )
    .unwrap();
    w.run_vm("larry");
    w.snapshot_of("larry", "snap");
    let s = w.snapshot("snap");
    let t = s.taken.as_ref().unwrap();
    let it = t.instancetype.as_ref().expect("captured instancetype");
    assert_eq!(
        (it.kind.as_str(), it.name.as_str(), it.source_generation),
        ("VirtualMachineClusterInstancetype", "u1.medium", 3)
    );
    assert!(t.preference.is_none());
    assert!(t.online);
    let st = status_of(snapshot::render_snapshot(&s));
    assert_eq!(st["indications"], serde_json::json!(["Online"]));
    assert_eq!(st["instancetypeRef"]["revision"], 3);
}

#[test]
fn snapshot_of_a_missing_vm_fails_with_kubevirts_reason() {
    let mut w = World::new();
    let d = w
        .take(snippet("vmsnapshot-snap-larry-failuredeadline.yaml"))
        .unwrap();
    assert_eq!(types_of(&d), ["ObjectCreated", "SnapshotFailed"]);
    let s = w.snapshot("snap-larry");
    assert!(!s.ready_to_use());
    let st = status_of(snapshot::render_snapshot(&s));
    assert_eq!(st["phase"], "Failed");
    assert_eq!(st["readyToUse"], false);
    assert_eq!(condition(&st, "Failure")["reason"], "Source does not exist");
    assert_eq!(condition(&st, "Progressing")["reason"], "Operation failed");
    assert_eq!(condition(&st, "Ready")["reason"], "Not ready");
    assert_eq!(
        st["error"]["message"],
        "VirtualMachine default/larry does not exist"
    );
    // failureDeadline is kept as written.
    let m = snapshot::render(&s).unwrap().to_value();
    assert_eq!(m["spec"]["failureDeadline"], "1m");
}

#[test]
fn snapshot_gate_disabled_is_failed_precondition_and_appends_nothing() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    w.snapshot_of("larry", "snap-larry");
    w.features = Features::with_disabled(&["Snapshot"]);
    let before = w.log.len();
    let r = w.take(snapshot_manifest("second", "larry"));
    let r = assert_rejected(r, Category::FailedPrecondition, codes::FEATURE_NOT_ENABLED);
    assert_eq!(r.causes[0].reason, "Snapshot feature gate is not enabled");
    let r = w.drive_restore("r", Some(restore_manifest("r", "snap-larry", "larry", "")));
    assert_eq!(r.unwrap_err().category, Category::FailedPrecondition);
    let r = w.drive_clone(
        "c",
        Some(clone_manifest("c", "VirtualMachine", "larry", "larry2", "")),
    );
    assert_eq!(r.unwrap_err().category, Category::FailedPrecondition);
    assert_eq!(w.log.len(), before, "a rejected command appends nothing");
    // Deleting a snapshot stays allowed.
    let d = snapshot::decide(
        &w.snapshot("snap-larry"),
        &SnapshotCommand::Delete {
            expected_generation: None,
        },
        &mut w.ctx,
    )
    .unwrap();
    assert_eq!(types_of(&d), ["ObjectDeleted"]);
}

#[test]
fn snapshot_validation_collects_every_cause_with_its_field() {
    let mut w = World::new();
    let bad = object_yaml(
        "apiVersion: snapshot.kubevirt.io/v1beta1\nkind: VirtualMachineSnapshot\nmetadata: {name: Bad_Name}\nspec:\n  source: {kind: VirtualMachineInstance}\n",
    );
    let r = assert_rejected(w.take(bad), Category::Invalid, codes::REQUIRED);
    let fields: Vec<&str> = r.causes.iter().map(|c| c.field.as_str()).collect();
    assert_eq!(
        fields,
        ["metadata.name", "spec.source.apiGroup", "spec.source.name"]
    );
    assert_eq!(r.causes[1].reason, "missing apiGroup");
    let wrong_kind = object_yaml(
        "apiVersion: snapshot.kubevirt.io/v1beta1\nkind: VirtualMachineSnapshot\nmetadata: {name: s}\nspec:\n  source: {apiGroup: kubevirt.io, kind: VirtualMachineInstance, name: x}\n",
    );
    let r = assert_rejected(w.take(wrong_kind), Category::Invalid, codes::INVALID_VALUE);
    assert_eq!(
        (r.causes[0].field.as_str(), r.causes[0].reason.as_str()),
        ("spec.source.kind", "invalid kind")
    );
    let wrong_group = object_yaml(
        "apiVersion: snapshot.kubevirt.io/v1beta1\nkind: VirtualMachineSnapshot\nmetadata: {name: s}\nspec:\n  source: {apiGroup: example.com, kind: VirtualMachine, name: x}\n",
    );
    let r = assert_rejected(w.take(wrong_group), Category::Invalid, codes::INVALID_VALUE);
    assert_eq!(r.causes[0].reason, "invalid apiGroup");
    assert!(w.log.is_empty());
}

#[test]
fn snapshot_spec_is_immutable_and_a_retried_create_is_unchanged() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    w.snapshot_of("larry", "snap");
    let again = w.take(snapshot_manifest("snap", "larry")).unwrap();
    assert_eq!(again, Decision::unchanged());
    let r = w.take(snapshot_manifest("snap", "other"));
    let r = assert_rejected(r, Category::Invalid, codes::SPEC_IMMUTABLE);
    assert_eq!(r.causes[0].reason, "spec is immutable after creation");
}

#[test]
fn snapshot_created_through_the_object_path_is_in_progress_until_taken() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    let m = snapshot_manifest("snap", "larry");
    let d = object::decide(
        &ObjectState::default(),
        &ObjectCommand::Create(Box::new(Manifest::Object(
            types::Kind::VirtualMachineSnapshot,
            Box::new(m),
        ))),
        &mut w.ctx,
    )
    .unwrap();
    w.append("snapshot/default/snap", &d).unwrap();
    let st = status_of(snapshot::render_snapshot(&w.snapshot("snap")));
    assert_eq!(
        (st["phase"].as_str(), st["readyToUse"].as_bool()),
        (Some("InProgress"), Some(false))
    );
    // The object aggregate still folds the stream (projections rely on it).
    let d = snapshot::decide(
        &w.snapshot("snap"),
        &SnapshotCommand::Take(Box::new(TakeSnapshot {
            manifest: None,
            source: w.vm("larry"),
            source_position: w.position(),
            features: Features::defaults(),
        })),
        &mut w.ctx,
    )
    .unwrap();
    assert_eq!(
        (types_of(&d), d.outcome),
        (vec!["SnapshotTaken"], Outcome::Recorded)
    );
    w.append("snapshot/default/snap", &d).unwrap();
    let folded = w
        .events("snapshot/default/snap")
        .iter()
        .fold(ObjectState::default(), object::evolve);
    assert_eq!((folded.revision, folded.is_live()), (2, true));
}

#[test]
fn a_snapshot_of_a_vm_being_deleted_is_refused_and_one_in_progress_fails_saying_why() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Always"));
    w.run_vm("larry");
    w.snapshot_in_progress("larry", "pending");
    w.vm_cmd(
        "larry",
        VmCommand::Delete {
            expected_generation: None,
        },
    )
    .unwrap();
    assert!(w.vm("larry").terminating().is_some());
    let before = w.position();
    let r = w
        .take(snapshot_manifest("snap", "larry"))
        .expect_err("refused");
    assert_eq!(r.category, Category::FailedPrecondition);
    assert!(r.has_code(codes::BEING_DELETED), "{r}");
    assert!(
        r.to_string().contains(
            "virtualmachines.kubevirt.io \"larry\" is being deleted (since \
             2023-11-14T22:13:20Z; it goes once its VMI has stopped): a snapshot of it is refused"
        ),
        "{r}"
    );
    assert_eq!(w.position(), before, "nothing appended");
    assert!(w.events("snapshot/default/snap").is_empty());
    // One created before the deletion was asked for ends failed, with the reason.
    w.take_pending("larry", "pending");
    let st = status_of(snapshot::render_snapshot(&w.snapshot("pending")));
    assert_eq!(st["phase"], "Failed");
    assert_eq!(
        condition(&st, "Failure")["reason"],
        "Source is being deleted"
    );
}

// ---------------------------------------------------------------------------------------------
// Restore (rows 9, 10, readiness policies)
// ---------------------------------------------------------------------------------------------

#[test]
fn row_09_restore_onto_same_vm_takes_the_snapshot_uuid_and_spec() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    let (uuid, serial, _) = fw(&w, "larry");
    w.snapshot_of("larry", "snap-larry");
    // Later the user changes the UUID and the memory.
    let mut edited = small_vm("larry", "Halted");
    edited.firmware_mut().uuid = Some("11111111-2222-4333-8444-555555555555".into());
    edited.vmi_spec_mut().domain.memory_mut().guest = Some("1Gi".parse().unwrap());
    w.vm_cmd("larry", apply_cmd(edited)).unwrap();
    let generation = w.vm("larry").generation;
    // The user guide's restore of larry.
    let trace = w
        .drive_restore(
            "restore-larry",
            Some(snippet("vmrestore-restore-larry.yaml")),
        )
        .unwrap();
    assert!(
        matches!(&trace[0], Next::ApplyToTarget { stream, command: VmCommand::Update(_) } if stream == "vm/default/larry")
    );
    assert_eq!(trace[1], Next::Done);
    assert_eq!(
        w.events("restore/default/restore-larry")
            .iter()
            .map(Event::type_name)
            .collect::<Vec<_>>(),
        ["ObjectCreated", "RestoreStarted", "RestoreCompleted"]
    );
    // The VM: the snapshot's UUID (origin Restored), serial and spec; one new generation.
    assert_eq!(fw(&w, "larry"), (uuid, serial, FirmwareOrigin::Restored));
    let st = w.vm("larry");
    assert_eq!(st.generation, generation + 1);
    let vm = st.vm.as_ref().unwrap();
    assert_eq!(
        vm.vmi_spec().unwrap().domain.memory.as_ref().unwrap().guest,
        Some("128Mi".parse().unwrap())
    );
    let r = w.restore("restore-larry");
    assert_eq!(
        vm.metadata.annotation(restore::LAST_RESTORE_ANNOTATION),
        Some(r.marker().as_str())
    );
    // The claim moved back in the same append as the UUID change.
    assert_eq!(
        w.claims.get(&claim_key(&uuid)).map(String::as_str),
        Some("vm/default/larry")
    );
    assert!(
        !w.claims
            .contains_key("firmware-uuid/11111111-2222-4333-8444-555555555555")
    );
    // KubeVirt's status.
    let s = status_of(restore::render_restore(&r));
    assert_eq!(s["complete"], true);
    assert_eq!(s["restoreTime"], "2023-11-14T22:13:20Z");
    assert_eq!(condition(&s, "Ready")["reason"], "Operation complete");
    assert_eq!(condition(&s, "Ready")["status"], "True");
    assert_eq!(condition(&s, "Progressing")["status"], "False");
    assert_eq!(s["targetIdentity"]["firmwareUUID"], uuid.to_string());
    assert_eq!(s["targetIdentity"]["regenerated"], false);
    assert_eq!(s["targetGeneration"], generation + 1);
    // Finished: running it again changes nothing.
    let d = w.restore_step("restore-larry", None).unwrap();
    assert_eq!((d.decision, d.next), (Decision::unchanged(), Next::Done));
}

#[test]
fn row_09_restore_of_snapshot_without_uuid_gives_legacy_value() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    // A snapshot imported from KubeVirt, its VM without a persisted UUID.
    let imported = small_vm("larry", "Halted");
    let cmd = SnapshotCommand::Import(Box::new(ImportSnapshot {
        manifest: snippet("vmsnapshot-snap-larry.yaml"),
        vm: imported,
        source_uid: None,
        instancetype: None,
        preference: None,
        features: Features::defaults(),
    }));
    let d = snapshot::decide(&w.snapshot("snap-larry"), &cmd, &mut w.ctx).unwrap();
    assert_eq!(types_of(&d), ["ObjectCreated", "SnapshotTaken"]);
    w.append("snapshot/default/snap-larry", &d).unwrap();
    assert_eq!(w.snapshot("snap-larry").identity().unwrap().uuid, None);
    w.drive_restore(
        "restore-larry",
        Some(snippet("vmrestore-restore-larry.yaml")),
    )
    .unwrap();
    let (uuid, _, origin) = fw(&w, "larry");
    assert_eq!(uuid, uuid!("7fc91a6e-3385-5749-addf-690bfd75fd60"));
    assert_eq!(uuid, legacy_firmware_uuid("larry"));
    assert_eq!(origin, FirmwareOrigin::Legacy);
    assert!(w.restore("restore-larry").completed.is_some());
}

#[test]
fn row_10_restore_as_new_vm_keeps_uuid_when_free() {
    let mut w = World::new();
    w.create_vm(vm_with_nics("larry", "Always"));
    let (uuid, serial, _) = fw(&w, "larry");
    w.snapshot_of("larry", "snap-larry");
    // Disaster: larry is deleted (its UUID is released).
    w.vm_cmd(
        "larry",
        VmCommand::Delete {
            expected_generation: None,
        },
    )
    .unwrap();
    assert!(!w.claims.contains_key(&claim_key(&uuid)));
    let trace = w
        .drive_restore(
            "dr",
            Some(restore_manifest("dr", "snap-larry", "larry-dr", "")),
        )
        .unwrap();
    assert!(matches!(
        &trace[0],
        Next::ApplyToTarget {
            command: VmCommand::Create(_),
            ..
        }
    ));
    let st = w.vm("larry-dr");
    assert_eq!(st.origin, Some(CreateOrigin::Restore));
    assert_eq!(fw(&w, "larry-dr"), (uuid, serial, FirmwareOrigin::Restored));
    let vm = st.vm.as_ref().unwrap();
    // Created stopped, with the snapshot's MACs and labels.
    assert_eq!(vm.spec.run_strategy.as_deref(), Some("Halted"));
    assert_eq!(
        macs(vm),
        [
            Some("02:aa:aa:aa:aa:01".into()),
            Some("02:aa:aa:aa:aa:02".into())
        ]
    );
    assert_eq!(vm.metadata.label("app"), Some("demo"));
    let s = status_of(restore::render_restore(&w.restore("dr")));
    assert_eq!(s["targetIdentity"]["regenerated"], false);
    assert_eq!(s["targetIdentity"]["origin"], "Restored");
    assert_eq!(s["complete"], true);
}

#[test]
fn row_10_restore_as_new_vm_gets_new_identity_when_held() {
    let mut w = World::new();
    w.create_vm(vm_with_nics("larry", "Halted"));
    let (uuid, serial, _) = fw(&w, "larry");
    w.snapshot_of("larry", "snap-larry");
    // larry lives and holds its UUID: the copy gets a new UUID, serial and MACs.
    w.drive_restore(
        "copy",
        Some(restore_manifest("copy", "snap-larry", "larry-copy", "")),
    )
    .unwrap();
    let (new_uuid, new_serial, origin) = fw(&w, "larry-copy");
    assert_ne!(new_uuid, uuid);
    assert_eq!(new_uuid.get_version_num(), 4);
    assert_ne!(new_serial, serial);
    assert_eq!(origin, FirmwareOrigin::Generated);
    let vm = w.vm("larry-copy").vm.unwrap();
    let new_macs = macs(&vm);
    assert!(new_macs.iter().all(|m| m.is_some()));
    assert_ne!(
        new_macs,
        [
            Some("02:aa:aa:aa:aa:01".into()),
            Some("02:aa:aa:aa:aa:02".into())
        ]
    );
    // Recorded and reported in the restore's status.
    let p = started(&w, "copy");
    assert!(p.identity_regenerated);
    let s = status_of(restore::render_restore(&w.restore("copy")));
    assert_eq!(s["targetIdentity"]["regenerated"], true);
    assert_eq!(s["targetIdentity"]["firmwareUUID"], new_uuid.to_string());
    assert_eq!(
        s["targetIdentity"]["macAddresses"]["interfaceName"],
        new_macs[1].clone().unwrap()
    );
    // Both VMs hold their own UUID.
    assert_eq!(
        w.claims.get(&claim_key(&uuid)).map(String::as_str),
        Some("vm/default/larry")
    );
    assert_eq!(
        w.claims.get(&claim_key(&new_uuid)).map(String::as_str),
        Some("vm/default/larry-copy")
    );
}

#[test]
fn row_10_a_stale_holder_read_is_settled_by_the_claim() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    let (uuid, _, _) = fw(&w, "larry");
    w.snapshot_of("larry", "snap-larry");
    w.vm_cmd(
        "larry",
        VmCommand::Delete {
            expected_generation: None,
        },
    )
    .unwrap();
    // The restore decides with "nobody holds it"…
    let d = w
        .restore_step(
            "dr",
            Some(restore_manifest("dr", "snap-larry", "larry-dr", "")),
        )
        .unwrap();
    let Next::ApplyToTarget { stream, command } = d.next else {
        panic!()
    };
    // …then, before the target append, another VM takes the UUID.
    let mut thief = small_vm("thief", "Halted");
    thief.firmware_mut().uuid = Some(uuid.to_string());
    w.create_vm(thief);
    let target = vm::fold(&w.events(&stream));
    let vd = vm::decide(&target, &command, &mut w.ctx).unwrap();
    let rejection = w.append(&stream, &vd).unwrap_err();
    assert!(rejection.has_code(codes::FIRMWARE_UUID_TAKEN));
    assert!(
        w.vm("larry-dr").vm.is_none(),
        "nothing appended to the target"
    );
    let r = restore::decide(
        &w.restore("dr"),
        &RestoreCommand::TargetRejected { rejection },
        &mut w.ctx,
    )
    .unwrap();
    assert_eq!(types_of(&r.decision), ["RestoreFailed"]);
    w.append("restore/default/dr", &r.decision).unwrap();
    let s = status_of(restore::render_restore(&w.restore("dr")));
    assert!(
        condition(&s, "Failure")["reason"]
            .as_str()
            .unwrap()
            .contains("vm/default/thief"),
        "{s}"
    );
    assert_eq!(s["complete"], false);
}

/// The `RestoreStarted` summary `audit` and `history` show for restore `name`.
fn started_summary(w: &World, name: &str) -> String {
    w.events(&format!("restore/default/{name}"))
        .iter()
        .find(|e| e.type_name() == "RestoreStarted")
        .expect("RestoreStarted")
        .summary()
}

#[test]
fn row_09_14_restore_putting_back_the_same_uuid_reports_the_vms_own_origin() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    let (uuid, serial, origin) = fw(&w, "larry");
    assert_eq!(origin, FirmwareOrigin::Generated);
    w.snapshot_of("larry", "snap-larry");
    // Only the memory changes: the UUID stays the one the snapshot holds.
    let mut edited = small_vm("larry", "Halted");
    edited.vmi_spec_mut().domain.memory_mut().guest = Some("1Gi".parse().unwrap());
    w.vm_cmd("larry", apply_cmd(edited)).unwrap();
    w.drive_restore(
        "restore-larry",
        Some(snippet("vmrestore-restore-larry.yaml")),
    )
    .unwrap();
    assert!(w.restore("restore-larry").completed.is_some());
    // Nothing about larry's identity changed: its UUID is still the one it was generated with.
    assert_eq!(fw(&w, "larry"), (uuid, serial, FirmwareOrigin::Generated));
    assert!(
        !w.events("vm/default/larry")
            .iter()
            .skip(1)
            .any(|e| e.type_name() == "FirmwareUuidAssigned"),
        "no new identity recorded"
    );
    // The restore says the same as the VM.
    let s = status_of(restore::render_restore(&w.restore("restore-larry")));
    assert_eq!(s["targetIdentity"]["firmwareUUID"], uuid.to_string());
    assert_eq!(s["targetIdentity"]["origin"], "Generated", "{s}");
    assert_eq!(
        started(&w, "restore-larry").firmware_origin,
        FirmwareOrigin::Generated
    );
    assert_eq!(
        started_summary(&w, "restore-larry"),
        format!("restoring snap-larry into larry (firmware {uuid} Generated)")
    );
}

#[test]
fn row_09_14_restore_putting_back_another_uuid_makes_both_say_restored() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    let (uuid, serial, _) = fw(&w, "larry");
    w.snapshot_of("larry", "snap-larry");
    // The user gives larry another UUID: its origin is theirs.
    let mut edited = small_vm("larry", "Halted");
    edited.firmware_mut().uuid = Some("11111111-2222-4333-8444-555555555555".into());
    w.vm_cmd("larry", apply_cmd(edited)).unwrap();
    assert_eq!(fw(&w, "larry").2, FirmwareOrigin::UserSpecified);
    w.drive_restore(
        "restore-larry",
        Some(snippet("vmrestore-restore-larry.yaml")),
    )
    .unwrap();
    // The snapshot's UUID is back: larry's origin is now the restore, and the restore agrees.
    assert_eq!(fw(&w, "larry"), (uuid, serial, FirmwareOrigin::Restored));
    let s = status_of(restore::render_restore(&w.restore("restore-larry")));
    assert_eq!(s["targetIdentity"]["firmwareUUID"], uuid.to_string());
    assert_eq!(s["targetIdentity"]["origin"], "Restored", "{s}");
    assert_eq!(
        started_summary(&w, "restore-larry"),
        format!("restoring snap-larry into larry (firmware {uuid} Restored)")
    );
}

#[test]
fn restore_onto_another_existing_vm_fails_as_in_kubevirt() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    w.create_vm(small_vm("moe", "Halted"));
    w.snapshot_of("larry", "snap-larry");
    let trace = w
        .drive_restore("r", Some(restore_manifest("r", "snap-larry", "moe", "")))
        .unwrap();
    assert_eq!(trace, [Next::Done]);
    let s = status_of(restore::render_restore(&w.restore("r")));
    assert_eq!(
        condition(&s, "Failure")["reason"],
        restore::RESTORE_TO_EXISTING_TARGET
    );
    assert_eq!(condition(&s, "Progressing")["reason"], "Operation failed");
    assert_eq!(w.vm("moe").generation, 1, "moe untouched");
}

#[test]
fn restore_of_a_missing_snapshot_fails() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    w.drive_restore(
        "restore-larry",
        Some(snippet("vmrestore-restore-larry.yaml")),
    )
    .unwrap();
    let r = w.restore("restore-larry");
    assert_eq!(
        r.failed.unwrap().reason,
        "VirtualMachineSnapshot snap-larry does not exist in namespace default"
    );
}

fn running_larry_with_snapshot() -> World {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Always"));
    w.snapshot_of("larry", "snap-larry");
    w.run_vm("larry");
    w
}

#[test]
fn readiness_wait_grace_period_is_the_default_and_fails_after_five_minutes() {
    let mut w = running_larry_with_snapshot();
    let trace = w
        .drive_restore(
            "restore-larry",
            Some(snippet("vmrestore-restore-larry.yaml")),
        )
        .unwrap();
    let start = w.ctx.now_ms();
    assert_eq!(
        trace,
        [Next::RetryAt {
            at_ms: start + 300_000
        }]
    );
    let r = w.restore("restore-larry");
    assert_eq!(r.found_running[0].policy, "WaitGracePeriod");
    // KubeVirt's reason (restore.go `waitGracePeriodMessage`), with the grace period.
    let s = status_of(restore::render_restore(&r));
    let waiting = "Waiting for target VM to be powered off. Please stop the restore target to \
                   proceed with restore, or the operation will fail after 5m0s";
    assert_eq!(condition(&s, "Progressing")["reason"], waiting);
    assert_eq!(condition(&s, "Progressing")["status"], "False");
    assert_eq!(condition(&s, "Ready")["reason"], waiting);
    // 299 s later: still waiting, nothing new recorded.
    w.ctx.advance_secs(299);
    let before = w.log.len();
    assert_eq!(
        w.drive_restore("restore-larry", None).unwrap(),
        [Next::RetryAt {
            at_ms: start + 300_000
        }]
    );
    assert_eq!(w.log.len(), before);
    // 300 s: failed with KubeVirt's reason.
    w.ctx.advance_secs(1);
    assert_eq!(
        w.drive_restore("restore-larry", None).unwrap(),
        [Next::Done]
    );
    let s = status_of(restore::render_restore(&w.restore("restore-larry")));
    assert_eq!(
        condition(&s, "Failure")["reason"],
        "Restore target failed to be ready within 5m0s. Please power off the target VM before \
         attempting restore"
    );
    assert_eq!(s["complete"], false);
}

#[test]
fn readiness_wait_grace_period_restores_once_the_target_stops_in_time() {
    let mut w = running_larry_with_snapshot();
    w.drive_restore(
        "restore-larry",
        Some(snippet("vmrestore-restore-larry.yaml")),
    )
    .unwrap();
    w.ctx.advance_secs(60);
    w.vm_cmd("larry", VmCommand::Stop).unwrap();
    w.vmi_stops("larry");
    let trace = w.drive_restore("restore-larry", None).unwrap();
    assert_eq!(trace.last(), Some(&Next::Done));
    assert!(w.restore("restore-larry").completed.is_some());
    // An existing VM keeps its run strategy (Halted after the user's stop).
    assert_eq!(w.vm("larry").run_strategy().unwrap().as_str(), "Halted");
}

#[test]
fn readiness_stop_target_stops_the_vm_then_restores() {
    let mut w = running_larry_with_snapshot();
    let m = restore_manifest(
        "r",
        "snap-larry",
        "larry",
        "  targetReadinessPolicy: StopTarget\n",
    );
    let trace = w.drive_restore("r", Some(m)).unwrap();
    assert_eq!(
        trace,
        [
            Next::ApplyToTarget {
                stream: "vm/default/larry".into(),
                command: VmCommand::Stop
            },
            Next::WaitForChange
        ]
    );
    assert!(
        w.events("vm/default/larry")
            .iter()
            .any(|e| e.type_name() == "VmStopRequested")
    );
    assert!(w.restore("r").found_running[0].stop_requested);
    // KubeVirt's reason while it stops the target (restore.go `stopTargetMessage`).
    let s = status_of(restore::render_restore(&w.restore("r")));
    for kind in ["Progressing", "Ready"] {
        assert_eq!(
            condition(&s, kind)["reason"],
            "Automatically stopping restore target for restore operation"
        );
    }
    // The reconciler stops it; the restore goes on.
    w.vmi_stops("larry");
    let trace = w.drive_restore("r", None).unwrap();
    assert_eq!(trace.last(), Some(&Next::Done));
    assert!(w.restore("r").completed.is_some());
    assert_eq!(w.vm("larry").run_strategy().unwrap().as_str(), "Halted");
}

#[test]
fn readiness_fail_immediate_fails_at_once() {
    let mut w = running_larry_with_snapshot();
    let m = restore_manifest(
        "r",
        "snap-larry",
        "larry",
        "  targetReadinessPolicy: FailImmediate\n",
    );
    assert_eq!(w.drive_restore("r", Some(m)).unwrap(), [Next::Done]);
    let s = status_of(restore::render_restore(&w.restore("r")));
    // KubeVirt's reason (restore.go `targetNotReadyFailureMessage`).
    assert_eq!(
        condition(&s, "Failure")["reason"],
        "Restore target VMI must be powered off before restore operation"
    );
    assert_eq!(condition(&s, "Ready")["reason"], "Operation failed");
    assert!(w.vm("larry").active_vmi().is_some(), "the VM keeps running");
}

#[test]
fn readiness_wait_eventually_never_gives_up() {
    let mut w = running_larry_with_snapshot();
    let m = restore_manifest(
        "r",
        "snap-larry",
        "larry",
        "  targetReadinessPolicy: WaitEventually\n",
    );
    assert_eq!(
        w.drive_restore("r", Some(m)).unwrap(),
        [Next::WaitForChange]
    );
    // KubeVirt's reason (restore.go `waitEventuallyMessage`): no deadline to announce.
    let s = status_of(restore::render_restore(&w.restore("r")));
    for kind in ["Progressing", "Ready"] {
        assert_eq!(
            condition(&s, kind)["reason"],
            "Waiting for target VM to be powered off. Please stop the restore target to proceed \
             with restore"
        );
    }
    w.ctx.advance_secs(24 * 3600);
    assert_eq!(w.drive_restore("r", None).unwrap(), [Next::WaitForChange]);
    assert!(w.restore("r").failed.is_none());
    w.vm_cmd("larry", VmCommand::Stop).unwrap();
    w.vmi_stops("larry");
    assert_eq!(
        w.drive_restore("r", None).unwrap().last(),
        Some(&Next::Done)
    );
    assert!(w.restore("r").completed.is_some());
}

#[test]
fn restore_saga_is_idempotent_across_a_crash_between_streams() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    w.snapshot_of("larry", "snap-larry");
    w.vm_cmd(
        "larry",
        VmCommand::Delete {
            expected_generation: None,
        },
    )
    .unwrap();
    // Step 1 recorded, then the gateway crashes before step 2.
    let first = w
        .restore_step(
            "dr",
            Some(restore_manifest("dr", "snap-larry", "larry-dr", "")),
        )
        .unwrap();
    // The retry returns the very same command (from the record, not fresh randomness).
    let retry = w.restore_step("dr", None).unwrap();
    assert_eq!(retry.decision, Decision::unchanged());
    assert_eq!(retry.next, first.next);
    // Step 2 applied, crash before step 3: the annotation shows it was applied.
    let Next::ApplyToTarget { stream, command } = retry.next else {
        panic!()
    };
    let vd = vm::decide(&vm::fold(&w.events(&stream)), &command, &mut w.ctx).unwrap();
    w.append(&stream, &vd).unwrap();
    let done = w.restore_step("dr", None).unwrap();
    assert_eq!(types_of(&done.decision), ["RestoreCompleted"]);
    assert_eq!(done.next, Next::Done);
}

#[test]
fn a_restore_is_undone_by_restoring_again() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    w.snapshot_of("larry", "before");
    let mut bigger = small_vm("larry", "Halted");
    bigger.vmi_spec_mut().domain.memory_mut().guest = Some("2Gi".parse().unwrap());
    w.vm_cmd("larry", apply_cmd(bigger)).unwrap();
    w.snapshot_of("larry", "after");
    let memory = |w: &World| {
        w.vm("larry")
            .vm
            .unwrap()
            .vmi_spec()
            .unwrap()
            .domain
            .memory
            .clone()
            .unwrap()
            .guest
    };
    w.drive_restore("r1", Some(restore_manifest("r1", "before", "larry", "")))
        .unwrap();
    assert_eq!(memory(&w), Some("128Mi".parse().unwrap()));
    w.drive_restore("r2", Some(restore_manifest("r2", "after", "larry", "")))
        .unwrap();
    assert_eq!(memory(&w), Some("2Gi".parse().unwrap()));
    // Audited: every step is an event with a summary.
    let summaries: Vec<String> = w
        .events("restore/default/r2")
        .iter()
        .map(Event::summary)
        .collect();
    assert!(
        summaries[1].starts_with("restoring after into larry"),
        "{summaries:?}"
    );
}

#[test]
fn restore_validation_collects_every_cause_with_its_field() {
    let mut w = World::new();
    let m = object_yaml(
        "apiVersion: snapshot.kubevirt.io/v1beta1\nkind: VirtualMachineRestore\nmetadata: {name: r}\nspec:\n  target: {apiGroup: kubevirt.io, kind: VirtualMachineInstance, name: larry}\n  patches:\n  - '{\"op\": \"replace\", \"path\": \"/metadata/name\", \"value\": \"x\"}'\n  - '{\"op\": \"move\", \"from\": \"/spec/a\", \"path\": \"/spec/b\"}'\n  - 'not json'\n",
    );
    let state = w.restore("r");
    let input = RestoreInput {
        manifest: Some(m),
        snapshot: SnapshotState::default(),
        target: VmState::default(),
        uuid_holder: None,
        features: Features::defaults(),
    };
    let r = restore::decide(
        &state,
        &RestoreCommand::Progress(Box::new(input)),
        &mut w.ctx,
    )
    .unwrap_err();
    let fields: Vec<&str> = r.causes.iter().map(|c| c.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.target.kind",
            "spec.virtualMachineSnapshotName",
            "spec.patches[0]",
            "spec.patches[1]",
            "spec.patches[2]"
        ]
    );
    assert!(
        r.causes[2]
            .reason
            .starts_with("patching is valid only for elements under /spec/ only")
    );
    assert!(r.causes[3].reason.contains("not supported by vmplane"));
    assert!(r.has_code(codes::PATCH_INVALID));
    let bad_policy = restore_manifest("r", "s", "larry", "  targetReadinessPolicy: Sometimes\n");
    let r = restore::validate(&bad_policy).unwrap_err();
    assert_eq!(r.causes[0].field, "spec.targetReadinessPolicy");
    assert!(w.log.is_empty());
    let _ = &mut w;
}

#[test]
fn restore_patches_apply_to_a_new_target_only() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    w.snapshot_of("larry", "snap-larry");
    let patches = "  patches:\n  - '{\"op\": \"replace\", \"path\": \"/metadata/labels/app\", \"value\": \"copy\"}'\n";
    w.drive_restore(
        "r",
        Some(restore_manifest("r", "snap-larry", "larry-copy", patches)),
    )
    .unwrap();
    assert_eq!(
        w.vm("larry-copy").vm.unwrap().metadata.label("app"),
        Some("copy")
    );
    w.drive_restore(
        "r2",
        Some(restore_manifest("r2", "snap-larry", "larry", patches)),
    )
    .unwrap();
    assert_eq!(
        w.vm("larry").vm.unwrap().metadata.label("app"),
        Some("demo")
    );
}

#[test]
fn restore_resumed_without_a_manifest_applies_the_stored_patches_to_the_new_vm() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    w.snapshot_in_progress("larry", "snap-larry");
    let patches = "  patches:\n  - '{\"op\": \"replace\", \"path\": \"/metadata/labels/app\", \"value\": \"copy\"}'\n";
    // The first step creates the restore and waits for the snapshot: no plan yet.
    let trace = w
        .drive_restore(
            "r",
            Some(restore_manifest("r", "snap-larry", "larry-copy", patches)),
        )
        .unwrap();
    assert_eq!(trace, [Next::WaitForChange]);
    assert!(w.restore("r").started.is_none());
    // The snapshot is taken; the gateway resumes the restore (as after a restart) without
    // the manifest: the patches come from the stored restore.
    w.take_pending("larry", "snap-larry");
    assert_eq!(
        w.drive_restore("r", None).unwrap().last(),
        Some(&Next::Done)
    );
    assert!(w.restore("r").completed.is_some());
    assert_eq!(
        w.vm("larry-copy").vm.unwrap().metadata.label("app"),
        Some("copy")
    );
}

#[test]
fn restore_target_rejected_fails_the_restore_only_while_its_plan_is_pending() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    w.snapshot_of("larry", "snap-larry");
    let rejected = |holder: &str| RestoreCommand::TargetRejected {
        rejection: Rejection::firmware_uuid_taken("u", holder),
    };
    // Before the plan (a refused Stop under StopTarget): nothing recorded, Progress again.
    w.create_object(
        types::Kind::VirtualMachineRestore,
        restore_manifest("idle", "snap-larry", "idle-copy", ""),
    );
    let idle = restore::decide(&w.restore("idle"), &rejected("vm/default/x"), &mut w.ctx).unwrap();
    assert_eq!(
        (idle.decision, idle.next),
        (Decision::unchanged(), Next::WaitForChange)
    );
    // With the plan recorded, a refused target command fails the restore when refused, naming
    // no holder outside the restore's namespace.
    let d = w
        .restore_step(
            "r",
            Some(restore_manifest("r", "snap-larry", "larry-copy", "")),
        )
        .unwrap();
    assert!(matches!(d.next, Next::ApplyToTarget { .. }), "{:?}", d.next);
    w.ctx.advance_secs(7);
    let r = restore::decide(&w.restore("r"), &rejected("vm/other/y"), &mut w.ctx).unwrap();
    assert_eq!(types_of(&r.decision), ["RestoreFailed"]);
    assert_eq!(r.decision.outcome, Outcome::Recorded);
    assert_eq!(r.next, Next::Done);
    w.append("restore/default/r", &r.decision).unwrap();
    let failed = w.restore("r").failed.unwrap();
    assert_eq!(
        failed.reason,
        "target VirtualMachine update failed: spec.template.spec.domain.firmware.uuid: firmware UUID u is already used by another object"
    );
    assert_eq!(failed.at_ms, w.ctx.now_ms(), "recorded when rejected");
    assert!(failed.at_ms > started(&w, "r").at_ms);
    // Finished: a late rejection changes nothing.
    let late = restore::decide(&w.restore("r"), &rejected("vm/default/x"), &mut w.ctx).unwrap();
    assert_eq!(
        (late.decision, late.next),
        (Decision::unchanged(), Next::Done)
    );
}

/// `spec.patches` that a restore's and a clone's admission refuse (a path outside `/spec/`).
/// Stored through the object path ([`World::create_object`], which checks metadata only), it
/// makes a saga object that no longer validates, as one admitted by older, looser rules would.
fn bad_patch() -> &'static str {
    "  patches:\n  - '{\"op\": \"replace\", \"path\": \"/metadata/name\", \"value\": \"x\"}'\n"
}

#[test]
fn restore_whose_stored_object_no_longer_validates_fails_with_the_reason() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    w.snapshot_of("larry", "snap-larry");
    let m = restore_manifest("r", "snap-larry", "larry-copy", bad_patch());
    let why = restore::validate(&m).unwrap_err().to_string();
    assert!(
        why.starts_with("spec.patches[0]: patching is valid only for elements under /spec/"),
        "{why}"
    );
    w.create_object(types::Kind::VirtualMachineRestore, m);
    let d = w.restore_step("r", None).unwrap();
    assert_eq!(types_of(&d.decision), ["RestoreFailed"]);
    assert_eq!(d.decision.outcome, Outcome::Recorded);
    assert_eq!(d.next, Next::Done);
    let failed = w.restore("r").failed.unwrap();
    assert_eq!(failed.reason, why);
    assert_eq!(failed.at_ms, w.ctx.now_ms());
    let s = status_of(restore::render_restore(&w.restore("r")));
    assert_eq!(condition(&s, "Failure")["reason"], why.as_str());
    assert!(!w.vm("larry-copy").is_live(), "no target created");
    // Finished: the next step has nothing to do.
    let again = w.restore_step("r", None).unwrap();
    assert_eq!(
        (again.decision, again.next),
        (Decision::unchanged(), Next::Done)
    );
}

// ---------------------------------------------------------------------------------------------
// Clone (row 11, filters, patches)
// ---------------------------------------------------------------------------------------------

#[test]
fn row_11_clone_always_new_identity() {
    let mut w = World::new();
    w.create_vm(vm_with_nics("larry", "Always"));
    let (uuid, serial, _) = fw(&w, "larry");
    // From a VM…
    let trace = w
        .drive_clone(
            "c1",
            Some(clone_manifest(
                "c1",
                "VirtualMachine",
                "larry",
                "larry-c1",
                "",
            )),
        )
        .unwrap();
    assert!(
        matches!(&trace[0], Next::ApplyToTarget { command: VmCommand::Create(_), stream } if stream == "vm/default/larry-c1")
    );
    assert_eq!(trace[1], Next::Done);
    // …and from a snapshot.
    w.snapshot_of("larry", "snap");
    w.drive_clone(
        "c2",
        Some(clone_manifest(
            "c2",
            "VirtualMachineSnapshot",
            "snap",
            "larry-c2",
            "",
        )),
    )
    .unwrap();
    let source_macs = macs(&w.vm("larry").vm.unwrap());
    let mut seen = vec![uuid];
    for name in ["larry-c1", "larry-c2"] {
        let (u, s, origin) = fw(&w, name);
        assert!(!seen.contains(&u), "{name} has a new UUID");
        seen.push(u);
        assert_ne!(s, serial);
        assert!(s.is_some());
        assert_eq!(origin, FirmwareOrigin::Cloned);
        let st = w.vm(name);
        assert_eq!(st.origin, Some(CreateOrigin::Clone));
        let vm = st.vm.unwrap();
        assert_eq!(vm.spec.run_strategy.as_deref(), Some("Halted"));
        let m = macs(&vm);
        assert!(m.iter().all(Option::is_some));
        assert!(
            m.iter().zip(&source_macs).all(|(a, b)| a != b),
            "new MACs for {name}"
        );
    }
    for c in ["c1", "c2"] {
        let st = status_of(clone::render_clone(&w.clone_state(c)));
        assert_eq!(st["phase"], "Succeeded");
        assert_eq!(condition(&st, "Ready")["status"], "True");
        assert_eq!(condition(&st, "Ready")["reason"], "Ready");
        assert_eq!(condition(&st, "Progressing")["reason"], "Ready");
    }
    assert_eq!(
        w.events("clone/default/c1")
            .iter()
            .map(Event::type_name)
            .collect::<Vec<_>>(),
        ["ObjectCreated", "CloneStarted", "CloneSucceeded"]
    );
}

fn cirros_with_metadata() -> VirtualMachine {
    let mut vm = load_vm("examples/vm-cirros.yaml");
    vm.metadata.namespace = Some("default".into());
    // No `someKey/…` label: a label key's prefix is a lowercase DNS subdomain, so the
    // snippet's `!someKey/*` can match no label of a valid object (the negation itself:
    // `clone_filter_negations_win_whatever_their_position`). Annotation keys are compared in
    // lower case, so `anotherKey/…` annotations are valid.
    let labels = serde_json::json!({"kubevirt.io/vm": "vm-cirros", "other": "x"});
    let annotations = serde_json::json!({"anotherKey/a": "1", "anotherKeyX": "2", "note": "n", "restore.kubevirt.io/lastRestoreUID": "old-1"});
    vm.metadata.labels = serde_json::from_value(labels.clone()).unwrap();
    vm.metadata.annotations = serde_json::from_value(annotations.clone()).unwrap();
    let tm = vm
        .spec
        .template
        .as_mut()
        .unwrap()
        .metadata
        .get_or_insert_with(Default::default);
    tm.labels = serde_json::from_value(labels).unwrap();
    tm.annotations =
        serde_json::from_value(serde_json::json!({"anotherKey/t": "1", "note": "n"})).unwrap();
    let ifaces: Vec<types::Interface> = serde_json::from_value(serde_json::json!([
        {"name": "interfaceName", "masquerade": {}},
    ]))
    .unwrap();
    vm.vmi_spec_mut().domain.devices_mut().interfaces = Some(ifaces);
    vm.vmi_spec_mut().networks = Some(
        serde_json::from_value(serde_json::json!([{"name": "interfaceName", "pod": {}}])).unwrap(),
    );
    vm
}

#[test]
fn clone_filters_follow_the_user_guide_snippet() {
    let mut w = World::new();
    w.create_vm(cirros_with_metadata());
    // The snippet as published: its MAC is a placeholder, and KubeVirt's admitter refuses it.
    let published = snippet("vmclone-testclone-filters.yaml");
    let r = w
        .drive_clone("testclone", Some(published.clone()))
        .unwrap_err();
    assert_eq!(r.category, Category::Invalid);
    assert_eq!(r.causes.len(), 1, "{r}");
    assert_eq!(r.causes[0].field, "spec.newMacAddresses.interfaceName");
    assert_eq!(
        r.causes[0].reason,
        "interface interfaceName has malformed MAC address (00-11-22)."
    );
    assert!(w.events("clone/default/testclone").is_empty());
    // With a real MAC, the filters decide.
    let mut fixed = published;
    fixed.spec.as_mut().unwrap()["newMacAddresses"]["interfaceName"] = "02-11-22-33-44-55".into();
    let trace = w.drive_clone("testclone", Some(fixed)).unwrap();
    assert_eq!(trace.last(), Some(&Next::Done));
    let target = w.vm("vm-clone-target");
    let vm = target.vm.unwrap();
    let keys = |m: &Option<types::JsonMap>| {
        m.as_ref()
            .map(|m| m.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    // labelFilters ["*", "!someKey/*"]: everything but someKey/*.
    assert_eq!(keys(&vm.metadata.labels), ["kubevirt.io/vm", "other"]);
    // annotationFilters ["anotherKey/*"]: only anotherKey/… (lastRestoreUID always kept).
    assert_eq!(
        keys(&vm.metadata.annotations),
        ["anotherKey/a", "restore.kubevirt.io/lastRestoreUID"]
    );
    let tm = vm
        .spec
        .template
        .as_ref()
        .unwrap()
        .metadata
        .as_ref()
        .unwrap();
    assert_eq!(keys(&tm.labels), ["kubevirt.io/vm", "other"]);
    assert_eq!(keys(&tm.annotations), ["anotherKey/t"]);
    // newMacAddresses and newSMBiosSerial.
    assert_eq!(macs(&vm), [Some("02-11-22-33-44-55".into())]);
    assert_eq!(vm.firmware().unwrap().serial.as_deref(), Some("new-serial"));
    assert_eq!(target.firmware.unwrap().origin, FirmwareOrigin::Cloned);
}

#[test]
fn clone_filter_negations_win_whatever_their_position() {
    let map: types::JsonMap =
        serde_json::from_value(serde_json::json!({"a/1": "", "a/2": "", "b": ""})).unwrap();
    let f = |filters: &[&str]| {
        let v: Vec<String> = filters.iter().map(|s| (*s).to_owned()).collect();
        clone::filter_keys(&map, Some(&v), &[])
            .keys()
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(f(&["*", "!a/*"]), ["b"]);
    assert_eq!(
        f(&["!a/*", "*"]),
        ["b"],
        "a negation listed first still wins"
    );
    assert_eq!(f(&["a/1"]), ["a/1"]);
    assert_eq!(f(&["a/*", "!a/2"]), ["a/1"]);
    assert!(f(&[]).is_empty(), "an empty list keeps nothing");
    assert_eq!(
        clone::filter_keys(&map, None, &[]).len(),
        3,
        "no list keeps all"
    );
}

#[test]
fn clone_volume_name_policy_snippet_and_v1alpha1_are_accepted() {
    let mut w = World::new();
    let mut vm = load_vm("examples/vm-cirros.yaml");
    vm.metadata.namespace = Some("default".into());
    w.create_vm(vm);
    let trace = w
        .drive_clone(
            "testclone",
            Some(snippet("vmclone-testclone-volumenamepolicy.yaml")),
        )
        .unwrap();
    assert_eq!(trace.last(), Some(&Next::Done));
    assert!(w.vm("vm-clone-target").is_live());
    let mut old = clone_manifest("c2", "VirtualMachine", "vm-cirros", "c2-target", "");
    old.api_version = "clone.kubevirt.io/v1alpha1".into();
    assert_eq!(
        w.drive_clone("c2", Some(old)).unwrap().last(),
        Some(&Next::Done)
    );
}

#[test]
fn clone_into_an_existing_vm_fails_with_a_kubevirt_like_reason() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    w.create_vm(small_vm("taken", "Halted"));
    let trace = w
        .drive_clone(
            "c",
            Some(clone_manifest("c", "VirtualMachine", "larry", "taken", "")),
        )
        .unwrap();
    assert_eq!(trace, [Next::Done]);
    let st = status_of(clone::render_clone(&w.clone_state("c")));
    assert_eq!(st["phase"], "Failed");
    assert_eq!(condition(&st, "Ready")["reason"], "Failed");
    assert_eq!(
        condition(&st, "Ready")["message"],
        "VirtualMachine taken already exists in namespace default"
    );
    // A missing source fails too, with KubeVirt's message.
    w.drive_clone(
        "c3",
        Some(clone_manifest("c3", "VirtualMachine", "ghost", "g2", "")),
    )
    .unwrap();
    assert_eq!(
        w.clone_state("c3").failed.unwrap().reason,
        "VirtualMachine ghost does not exist in namespace default"
    );
}

#[test]
fn clone_without_target_generates_a_name_and_waits_for_a_snapshot_in_progress() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    // A snapshot created through the object path, not taken yet.
    w.snapshot_in_progress("larry", "snap");
    let m = object_yaml(
        "apiVersion: clone.kubevirt.io/v1beta1\nkind: VirtualMachineClone\nmetadata: {name: c}\nspec:\n  source: {apiGroup: snapshot.kubevirt.io, kind: VirtualMachineSnapshot, name: snap}\n",
    );
    assert_eq!(w.drive_clone("c", Some(m)).unwrap(), [Next::WaitForChange]);
    let st = status_of(clone::render_clone(&w.clone_state("c")));
    assert_eq!(st["phase"], "SnapshotInProgress");
    assert_eq!(condition(&st, "Progressing")["reason"], "Still processing");
    // The snapshot is taken; the clone goes on under a generated name.
    w.take_pending("larry", "snap");
    assert_eq!(w.drive_clone("c", None).unwrap().last(), Some(&Next::Done));
    let name = w.clone_state("c").started.unwrap().target_name;
    assert!(
        name.starts_with("snap-clone-") && name.len() == "snap-clone-".len() + 5,
        "{name}"
    );
    assert!(w.vm(&name).is_live());
}

#[test]
fn clone_validation_collects_every_cause_with_its_field() {
    let mut w = World::new();
    let m = object_yaml(
        "apiVersion: clone.kubevirt.io/v1beta1\nkind: VirtualMachineClone\nmetadata: {name: c}\nspec:\n  source: {apiGroup: kubevirt.io, kind: VirtualMachine, name: larry}\n  target: {apiGroup: kubevirt.io, kind: VirtualMachine, name: larry}\n  labelFilters: ['!', 'a*b', 'x!y']\n  newMacAddresses: {eth0: zz}\n  patches: ['{\"op\": \"copy\", \"from\": \"/spec/a\", \"path\": \"/spec/b\"}']\n",
    );
    let r = w.drive_clone("c", Some(m)).unwrap_err();
    let fields: Vec<&str> = r.causes.iter().map(|c| c.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.target.name",
            "spec.labelFilters[0]",
            "spec.labelFilters[1]",
            "spec.labelFilters[2]",
            "spec.newMacAddresses.eth0",
            "spec.patches[0]"
        ]
    );
    assert_eq!(
        r.causes[0].reason,
        "Target name cannot be equal to source name when both are VirtualMachines"
    );
    assert_eq!(
        r.causes[1].reason,
        "a negation character is not a valid filter"
    );
    let kinds = object_yaml(
        "apiVersion: clone.kubevirt.io/v1beta1\nkind: VirtualMachineClone\nmetadata: {name: c}\nspec:\n  source: {apiGroup: kubevirt.io, kind: VirtualMachineInstance, name: larry}\n  target: {apiGroup: kubevirt.io, kind: VirtualMachinePool, name: p}\n",
    );
    let r = clone::validate(&kinds).unwrap_err();
    assert_eq!(
        r.causes
            .iter()
            .map(|c| (c.field.as_str(), c.reason.as_str()))
            .collect::<Vec<_>>(),
        [
            ("spec.source.kind", "Source kind is not supported"),
            ("spec.target.kind", "Target kind is not supported")
        ]
    );
    let none = object_yaml(
        "apiVersion: clone.kubevirt.io/v1beta1\nkind: VirtualMachineClone\nmetadata: {name: c}\nspec: {}\n",
    );
    assert_eq!(
        clone::validate(&none).unwrap_err().causes[0].reason,
        "Source cannot be nil"
    );
    assert!(w.log.is_empty());
}

#[test]
fn clone_patches_apply_last_and_a_failing_patch_fails_the_clone() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    let patches = "  patches:\n  - '{\"op\": \"add\", \"path\": \"/metadata/labels/tier\", \"value\": \"web\"}'\n  - '{\"op\": \"replace\", \"path\": \"/spec/template/spec/domain/memory/guest\", \"value\": \"256Mi\"}'\n  - '{\"op\": \"remove\", \"path\": \"/metadata/labels/app\"}'\n";
    w.drive_clone(
        "c",
        Some(clone_manifest(
            "c",
            "VirtualMachine",
            "larry",
            "copy",
            patches,
        )),
    )
    .unwrap();
    let vm = w.vm("copy").vm.unwrap();
    assert_eq!(vm.metadata.label("tier"), Some("web"));
    assert_eq!(vm.metadata.label("app"), None);
    assert_eq!(
        vm.vmi_spec().unwrap().domain.memory.as_ref().unwrap().guest,
        Some("256Mi".parse().unwrap())
    );
    let bad =
        "  patches:\n  - '{\"op\": \"replace\", \"path\": \"/spec/nothing/here\", \"value\": 1}'\n";
    w.drive_clone(
        "c2",
        Some(clone_manifest(
            "c2",
            "VirtualMachine",
            "larry",
            "copy2",
            bad,
        )),
    )
    .unwrap();
    let reason = w.clone_state("c2").failed.unwrap().reason;
    assert!(
        reason.starts_with("error patching VM copy2: replace operation does not apply"),
        "{reason}"
    );
    assert!(!w.vm("copy2").is_live());
}

#[test]
fn clone_resumed_without_a_manifest_applies_the_stored_patches() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    w.snapshot_in_progress("larry", "snap");
    let patches = "  patches:\n  - '{\"op\": \"add\", \"path\": \"/metadata/labels/tier\", \"value\": \"web\"}'\n";
    // The first step creates the clone and waits for the snapshot: no plan yet.
    let trace = w
        .drive_clone(
            "c",
            Some(clone_manifest(
                "c",
                "VirtualMachineSnapshot",
                "snap",
                "copy",
                patches,
            )),
        )
        .unwrap();
    assert_eq!(trace, [Next::WaitForChange]);
    assert!(w.clone_state("c").started.is_none());
    // The snapshot is taken; the gateway resumes the clone without the manifest: the patches
    // come from the stored clone.
    w.take_pending("larry", "snap");
    assert_eq!(w.drive_clone("c", None).unwrap().last(), Some(&Next::Done));
    assert!(w.clone_state("c").succeeded.is_some());
    let vm = w.vm("copy").vm.unwrap();
    assert_eq!(vm.metadata.label("tier"), Some("web"));
    assert_eq!(vm.metadata.label("app"), Some("demo"), "the rest is copied");
}

#[test]
fn clone_whose_stored_object_no_longer_validates_fails_with_the_reason() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    let m = clone_manifest("c", "VirtualMachine", "larry", "copy", bad_patch());
    let why = clone::validate(&m).unwrap_err().to_string();
    assert!(
        why.starts_with("spec.patches[0]: patching is valid only for elements under /spec/"),
        "{why}"
    );
    w.create_object(types::Kind::VirtualMachineClone, m);
    let d = w.clone_step("c", None).unwrap();
    assert_eq!(types_of(&d.decision), ["CloneFailed"]);
    assert_eq!(d.decision.outcome, Outcome::Recorded);
    assert_eq!(d.next, Next::Done);
    let failed = w.clone_state("c").failed.unwrap();
    assert_eq!(failed.reason, why);
    assert_eq!(failed.at_ms, w.ctx.now_ms());
    let st = status_of(clone::render_clone(&w.clone_state("c")));
    assert_eq!(st["phase"], "Failed");
    assert_eq!(condition(&st, "Ready")["message"], why.as_str());
    assert!(!w.vm("copy").is_live(), "no target created");
    let again = w.clone_step("c", None).unwrap();
    assert_eq!(
        (again.decision, again.next),
        (Decision::unchanged(), Next::Done)
    );
}

#[test]
fn clone_target_rejected_fails_the_clone_naming_only_holders_in_its_namespace() {
    let mut w = World::new();
    w.create_vm(small_vm("larry", "Halted"));
    // Before it starts there is nothing to fail.
    w.create_object(
        types::Kind::VirtualMachineClone,
        clone_manifest("idle", "VirtualMachine", "larry", "idle-copy", ""),
    );
    let idle = clone::decide(
        &w.clone_state("idle"),
        &CloneCommand::TargetRejected {
            rejection: Rejection::firmware_uuid_taken("u", "vm/default/x"),
        },
        &mut w.ctx,
    )
    .unwrap();
    assert_eq!(
        (idle.decision, idle.next),
        (Decision::unchanged(), Next::Done)
    );
    // Step 1 records the plan…
    let d = w
        .clone_step(
            "c",
            Some(clone_manifest("c", "VirtualMachine", "larry", "copy", "")),
        )
        .unwrap();
    let Next::ApplyToTarget { stream, command } = d.next else {
        panic!("{:?}", d.next)
    };
    // …then, before the target append, another VM takes the planned UUID.
    let planned = w.clone_state("c").started.unwrap().firmware_uuid;
    let mut thief = small_vm("thief", "Halted");
    thief.firmware_mut().uuid = Some(planned.to_string());
    w.create_vm(thief);
    let vd = vm::decide(&vm::fold(&w.events(&stream)), &command, &mut w.ctx).unwrap();
    let rejection = w.append(&stream, &vd).unwrap_err();
    assert!(rejection.has_code(codes::FIRMWARE_UUID_TAKEN));
    w.ctx.advance_secs(7);
    let state = w.clone_state("c");
    let elsewhere = clone::decide(
        &state,
        &CloneCommand::TargetRejected {
            rejection: Rejection::firmware_uuid_taken(&planned.to_string(), "vm/other/y"),
        },
        &mut w.ctx,
    )
    .unwrap();
    let Event::CloneFailed(f) = &elsewhere.decision.events[0] else {
        panic!("{:?}", elsewhere.decision)
    };
    assert!(
        f.reason.contains("already used by another object"),
        "{}",
        f.reason
    );
    assert!(!f.reason.contains("vm/other/y"), "{}", f.reason);
    let r = clone::decide(
        &state,
        &CloneCommand::TargetRejected { rejection },
        &mut w.ctx,
    )
    .unwrap();
    assert_eq!(types_of(&r.decision), ["CloneFailed"]);
    assert_eq!(r.decision.outcome, Outcome::Recorded);
    assert_eq!(r.next, Next::Done);
    w.append("clone/default/c", &r.decision).unwrap();
    let failed = w.clone_state("c").failed.unwrap();
    assert_eq!(
        failed.reason,
        format!(
            "creating the target VirtualMachine failed: spec.template.spec.domain.firmware.uuid: firmware UUID {planned} is already used by vm/default/thief"
        )
    );
    assert_eq!(failed.at_ms, w.ctx.now_ms(), "recorded when rejected");
    assert!(failed.at_ms > w.clone_state("c").started.unwrap().at_ms);
    assert!(!w.vm("copy").is_live());
    // Finished: a late rejection changes nothing.
    let late = clone::decide(
        &w.clone_state("c"),
        &CloneCommand::TargetRejected {
            rejection: Rejection::firmware_uuid_taken("u", "vm/default/x"),
        },
        &mut w.ctx,
    )
    .unwrap();
    assert_eq!(
        (late.decision, late.next),
        (Decision::unchanged(), Next::Done)
    );
}

#[test]
fn restore_onto_same_vm_puts_back_the_snapshots_instancetype_revision() {
    let mut w = World::new();
    let with_it = |name: &str| {
        let mut vm = small_vm("larry", "Halted");
        vm.vmi_spec_mut().domain.memory_mut().guest = None;
        vm.spec.instancetype = Some(types::Matcher {
            name: Some(name.into()),
            ..Default::default()
        });
        vm
    };
    let it = |name: &str, generation: i64| {
        let mut o = instancetype(CLUSTER_INSTANCETYPES, name);
        o.metadata.generation = Some(generation);
        o
    };
    let put = |vm, o| {
        VmCommand::Apply(Box::new(PutVm {
            instancetype: Some(o),
            ..PutVm::new(vm)
        }))
    };
    w.vm_cmd("larry", put(with_it("u1.medium"), it("u1.medium", 3)))
        .unwrap();
    w.snapshot_of("larry", "snap");
    // The VM moves on: another instancetype, then back to a newer revision of the first.
    w.vm_cmd("larry", put(with_it("u1.large"), it("u1.large", 1)))
        .unwrap();
    w.vm_cmd("larry", put(with_it("u1.medium"), it("u1.medium", 4)))
        .unwrap();
    assert_eq!(w.vm("larry").instancetype.unwrap().source_generation, 4);
    w.drive_restore("r", Some(restore_manifest("r", "snap", "larry", "")))
        .unwrap();
    let captured = w.vm("larry").instancetype.unwrap();
    assert_eq!(
        (captured.name.as_str(), captured.source_generation),
        ("u1.medium", 3)
    );
    assert!(w.restore("r").completed.is_some());
}
