//! The VM aggregate's create/update/delete semantics and validation.

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
