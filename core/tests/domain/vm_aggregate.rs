//! The VM aggregate's create/update/delete semantics and validation.

use vmplane_core::types::VirtualMachine;
use vmplane_core::validate::RUNNING_AND_RUN_STRATEGY_MESSAGE;
use vmplane_core::*;

use crate::support::*;

#[test]
fn create_then_update_then_delete_then_create_again_continues_the_stream_as_a_new_object() {
    let mut s = Scenario::new();
    let d = s.create(small_vm("demo", "Halted"));
    assert_eq!(d.outcome, Outcome::Created);
    let first_uid = s.state().uid.unwrap();
    assert_eq!(s.state().generation, 1);

    let mut bigger = small_vm("demo", "Halted");
    bigger.vmi_spec_mut().domain.memory_mut().guest = Some("1Gi".parse().unwrap());
    let d = s.apply(bigger);
    assert_eq!(
        (d.outcome, types_of(&d)),
        (Outcome::Configured, vec!["VmSpecEdited"])
    );
    assert_eq!(s.state().generation, 2);

    let d = s.ok(VmCommand::Delete {
        expected_generation: Some(2),
    });
    assert_eq!(
        (d.outcome, types_of(&d)),
        (Outcome::Deleted, vec!["VmDeleted"])
    );
    assert!(!s.state().is_live());
    assert_eq!(d.claims.len(), 1, "the firmware UUID is released");

    let d = s.create(small_vm("demo", "Halted"));
    assert_eq!(d.outcome, Outcome::Created);
    let st = s.state();
    assert_ne!(st.uid.unwrap(), first_uid, "a new life has a new uid");
    assert_eq!(
        st.generation, 1,
        "a new object has generation 1, as in KubeVirt and INTERFACE.md"
    );
    assert_eq!(st.revision, 4, "the stream keeps counting");
}

#[test]
fn identical_reapply_yields_no_events() {
    let mut s = Scenario::new();
    s.create(small_vm("demo", "Halted"));
    let n = s.events.len();
    let d = s.apply(small_vm("demo", "Halted"));
    assert_eq!(d, Decision::unchanged());
    assert_eq!(s.events.len(), n);
    // Server-set metadata and status on input do not count as changes.
    let mut vm = small_vm("demo", "Halted");
    vm.metadata.uid = Some("whatever".into());
    vm.metadata.generation = Some(42);
    vm.metadata
        .extra
        .insert("creationTimestamp".into(), serde_json::Value::Null);
    vm.status = Some(serde_json::json!({"printableStatus": "Running"}));
    assert_eq!(s.apply(vm).outcome, Outcome::Unchanged);
}

#[test]
fn expected_generation_mismatch_is_a_conflict_carrying_the_actual_generation() {
    let mut s = Scenario::new();
    s.create(small_vm("demo", "Halted"));
    let mut put = PutVm::new(small_vm("demo", "Manual"));
    put.expected_generation = Some(7);
    let r = assert_rejected(
        s.when(VmCommand::Update(Box::new(put))),
        Category::Conflict,
        codes::GENERATION_CONFLICT,
    );
    assert_eq!(r.actual_generation, Some(1));
    assert_eq!(r.category.grpc_code_name(), "Aborted");
    let r = assert_rejected(
        s.when(VmCommand::Delete {
            expected_generation: Some(0),
        }),
        Category::Conflict,
        codes::GENERATION_CONFLICT,
    );
    assert_eq!(r.actual_generation, Some(1));
    let mut put = PutVm::new(small_vm("demo", "Manual"));
    put.expected_generation = Some(1);
    assert_eq!(
        s.ok(VmCommand::Update(Box::new(put))).outcome,
        Outcome::Configured
    );
}

#[test]
fn create_of_a_live_name_and_update_of_a_missing_one_are_rejected() {
    let mut s = Scenario::new();
    assert_rejected(
        s.when(VmCommand::Update(Box::new(PutVm::new(small_vm(
            "demo", "Halted",
        ))))),
        Category::NotFound,
        codes::NOT_FOUND,
    );
    assert_rejected(
        s.when(VmCommand::Delete {
            expected_generation: None,
        }),
        Category::NotFound,
        codes::NOT_FOUND,
    );
    s.create(small_vm("demo", "Halted"));
    assert_rejected(
        s.when(VmCommand::Create(Box::new(PutVm::new(small_vm(
            "demo", "Halted",
        ))))),
        Category::AlreadyExists,
        codes::ALREADY_EXISTS,
    );
    assert_rejected(
        s.when(apply_cmd(small_vm("other", "Halted"))),
        Category::Invalid,
        codes::NAME_MISMATCH,
    );
}

#[test]
fn running_and_run_strategy_both_set_is_rejected_as_kubevirt_does() {
    let mut vm = small_vm("demo", "Always");
    vm.spec.running = Some(true);
    let r = assert_rejected(
        Scenario::new().when(apply_cmd(vm)),
        Category::Invalid,
        codes::RUNNING_AND_RUN_STRATEGY,
    );
    assert_eq!(r.causes[0].field, "spec.running");
    assert_eq!(r.causes[0].reason, RUNNING_AND_RUN_STRATEGY_MESSAGE);
}

#[test]
fn run_strategy_missing_or_unknown_is_rejected() {
    let mut vm = small_vm("demo", "Always");
    vm.spec.run_strategy = None;
    assert_rejected(
        Scenario::new().when(apply_cmd(vm)),
        Category::Invalid,
        codes::RUN_STRATEGY_REQUIRED,
    );
    let r = assert_rejected(
        Scenario::new().when(apply_cmd(small_vm("demo", "Sometimes"))),
        Category::Invalid,
        codes::RUN_STRATEGY_INVALID,
    );
    assert_eq!(r.causes[0].reason, "Invalid RunStrategy (Sometimes)");
    // Legacy running: false is Halted.
    let mut vm = small_vm("demo", "Always");
    vm.spec.run_strategy = None;
    vm.spec.running = Some(false);
    let mut s = Scenario::new();
    s.create(vm);
    assert_eq!(
        s.state().run_strategy(),
        Some(lifecycle::RunStrategy::Halted)
    );
}

#[test]
fn validation_reports_every_cause_with_its_field_path_and_appends_nothing() {
    let mut vm = small_vm("Bad_Name", "Always");
    vm.spec.running = Some(true);
    vm.firmware_mut().uuid = Some("not-a-uuid".into());
    let spec = vm.vmi_spec_mut();
    spec.domain.devices_mut().disks.as_mut().unwrap()[0].name = "missing".into();
    let mut s = Scenario::new();
    let r = s.when(apply_cmd(vm)).unwrap_err();
    let fields: Vec<&str> = r.causes.iter().map(|c| c.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "metadata.name",
            "spec.running",
            "spec.template.spec.domain.devices.disks[0].name",
            "spec.template.spec.domain.firmware.uuid",
        ],
        "{r}"
    );
    assert_eq!(
        r.causes[2].reason,
        "spec.template.spec.domain.devices.disks[0].name 'missing' not found."
    );
    assert!(r.has_code(codes::FIRMWARE_UUID_INVALID));
    assert!(s.events.is_empty(), "a rejected command appends nothing");
}

#[test]
fn duplicate_names_and_dangling_interfaces_are_reported() {
    let mut vm = load_vm("examples/vm-cirros.yaml");
    let spec = vm.vmi_spec_mut();
    let disks = spec.domain.devices_mut().disks.as_mut().unwrap();
    disks[1].name = "containerdisk".into();
    spec.domain.devices_mut().interfaces = Some(vec![types::Interface {
        name: "nic0".into(),
        ..Default::default()
    }]);
    let r = validate::vm(&vm).unwrap_err();
    assert!(
        r.causes.iter().any(|c| c.code == codes::DUPLICATE
            && c.field == "spec.template.spec.domain.devices.disks[1].name"
            && c.reason
                == "spec.template.spec.domain.devices.disks[0] and \
                    spec.template.spec.domain.devices.disks[1] must not have the same Name."),
        "{r}"
    );
    assert!(
        r.causes.iter().any(|c| c.reason
            == "spec.template.spec.domain.devices.interfaces[0].name 'nic0' not found."),
        "{r}"
    );
}

#[test]
fn every_plain_example_vm_is_accepted() {
    for f in [
        "examples/vm-cirros.yaml",
        "examples/vm-alpine-multipvc.yaml",
        "examples/vm-alpine-datavolume.yaml",
        "examples/vm-cirros-sata.yaml",
        "examples/vm-priorityclass.yaml",
    ] {
        let d = Scenario::new().when(apply_cmd(load_vm(f)));
        assert!(d.is_ok(), "{f}: {}", d.unwrap_err());
    }
}

#[test]
fn given_when_then_on_a_created_vm() {
    let given = Scenario::new().create(small_vm("demo", "Manual")).events;
    check_decide(
        given.clone(),
        apply_cmd(small_vm("demo", "Manual")),
        Then::Unchanged,
    );
    check_decide(
        given.clone(),
        apply_cmd(small_vm("demo", "Halted")),
        Then::Events(&["VmSpecEdited"]),
    );
    check_decide(
        given.clone(),
        VmCommand::Start { paused: false },
        Then::Events(&["VmStartRequested"]),
    );
    check_decide(
        given.clone(),
        VmCommand::Stop,
        Then::Rejected(Category::FailedPrecondition, codes::STOP_NOT_ALLOWED),
    );
    check_decide(
        given.clone(),
        VmCommand::Create(Box::new(PutVm::new(small_vm("demo", "Manual")))),
        Then::Rejected(Category::AlreadyExists, codes::ALREADY_EXISTS),
    );
    let deleted = check_decide(
        given,
        VmCommand::Delete {
            expected_generation: Some(1),
        },
        Then::Events(&["VmDeleted"]),
    )
    .events;
    check_decide(
        deleted,
        apply_cmd(small_vm("demo", "Manual")),
        Then::Events(&["VmCreated"]),
    );
}

/// Every JSON object of `v` with its keys in the reverse order.
fn keys_reversed(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(map) => {
            let entries: Vec<_> = map.into_iter().collect();
            serde_json::Value::Object(
                entries
                    .into_iter()
                    .rev()
                    .map(|(k, v)| (k, keys_reversed(v)))
                    .collect(),
            )
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(keys_reversed).collect())
        }
        other => other,
    }
}

/// `vm` as the decision compares it with the stored `stored`: normalized, named as it, and
/// with its firmware UUID and serial where the manifest gives none (semantics.md, row 6).
fn as_compared(mut vm: VirtualMachine, stored: &VirtualMachine) -> serde_json::Value {
    vm.metadata.name.clone_from(&stored.metadata.name);
    vm.metadata.namespace.clone_from(&stored.metadata.namespace);
    defaults::normalize_vm(&mut vm);
    let kept = stored.firmware().cloned().unwrap_or_default();
    let f = vm.firmware_mut();
    if f.uuid.is_none() {
        f.uuid = kept.uuid;
    }
    if f.serial.is_none() {
        f.serial = kept.serial;
    }
    serde_json::to_value(&vm).expect("a VM serializes")
}

#[test]
fn a_reapply_is_unchanged_exactly_when_equal_as_json_quantities_by_value_over_the_test_data() {
    // Every VM of the test data that is created without its instancetype or preference, under
    // one name; then, over each, every other one applied, the same with every key in the reverse
    // order, with a label or an unknown template field added, and with its guest memory written
    // in KiB. The decision compares typed objects (no JSON trees); the answer must be the JSON
    // comparison's, except that a quantity written another way with the same value is no
    // change (as in Kubernetes, which stores a quantity by its value).
    let mut vms: Vec<VirtualMachine> = Vec::new();
    for file in testdata_files() {
        let Ok(manifests) = types::parse_manifests(&std::fs::read(&file).expect("read")) else {
            continue;
        };
        for m in manifests {
            let types::Manifest::VirtualMachine(vm) = m else {
                continue;
            };
            let mut vm = *vm;
            vm.metadata.name = Some("same".into());
            vm.metadata.namespace = Some("default".into());
            // Their instancetype and preference are not what is compared here.
            vm.spec.instancetype = None;
            vm.spec.preference = None;
            if Scenario::new()
                .when(VmCommand::Create(Box::new(PutVm::new(vm.clone()))))
                .is_ok()
            {
                vms.push(vm);
            }
        }
    }
    assert!(vms.len() >= 10, "the test data's VMs: {}", vms.len());
    let mut candidates: Vec<(VirtualMachine, Option<&VirtualMachine>)> = Vec::new();
    for vm in &vms {
        candidates.push((vm.clone(), None));
        let reversed = keys_reversed(serde_json::to_value(vm).expect("serializes"));
        candidates.push((serde_json::from_value(reversed).expect("reads back"), None));
        let mut labelled = vm.clone();
        labelled
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("edited".into(), "yes".into());
        candidates.push((labelled, None));
        let mut unknown = vm.clone();
        unknown
            .vmi_spec_mut()
            .extra
            .insert("x-note".into(), serde_json::json!({"b": 1, "a": [1, 2]}));
        candidates.push((unknown, None));
        // The guest memory in KiB: the same value written another way, no change over `vm`.
        let guest = vm
            .vmi_spec()
            .and_then(|s| s.domain.memory.as_ref()?.guest.clone());
        if let Some(guest) = guest.filter(|g| g.units_ceil() % 1024 == 0) {
            let kib = format!("{}Ki", guest.units_ceil() / 1024);
            let mut respelled = vm.clone();
            respelled.vmi_spec_mut().domain.memory_mut().guest =
                Some(kib.parse().expect("a quantity"));
            assert_ne!(
                serde_json::to_value(&respelled).ok(),
                serde_json::to_value(vm).ok()
            );
            candidates.push((respelled, Some(vm)));
        }
    }
    assert!(
        candidates.iter().any(|(_, same)| same.is_some()),
        "some VM gives its guest memory"
    );
    let (mut unchanged, mut configured) = (0, 0);
    for base in &vms {
        let mut s = Scenario::new();
        s.create(base.clone());
        let stored = s.state().vm.as_deref().expect("created").clone();
        let stored_json = serde_json::to_value(&stored).expect("serializes");
        for (candidate, same_value_as) in &candidates {
            let equal = as_compared(candidate.clone(), &stored) == stored_json
                || same_value_as.is_some_and(|o| as_compared(o.clone(), &stored) == stored_json);
            let before = s.events.len();
            let d = s.apply(candidate.clone());
            if equal {
                unchanged += 1;
                assert_eq!(d.outcome, Outcome::Unchanged, "{candidate:?} over {base:?}");
            } else {
                configured += 1;
                assert_eq!(
                    d.outcome,
                    Outcome::Configured,
                    "{candidate:?} over {base:?}"
                );
                // Back to the base for the next candidate.
                s.events.truncate(before);
            }
        }
    }
    // Each base is unchanged by itself and its reordered copy, at least.
    assert!(unchanged >= 2 * vms.len(), "unchanged: {unchanged}");
    assert!(configured >= 2 * vms.len(), "configured: {configured}");
}
