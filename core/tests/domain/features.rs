//! Cluster feature configuration (issue 8): the registry and its stages, KubeVirt's
//! `IsEnabled`, validation of the `KubeVirt` object, what a VM requests, and the lifecycle
//! rules (no launch, conditions, disable-while-running, re-enable), given/when/then where a
//! decide is involved.

use vmplane_core::event::VmiPhase;
use vmplane_core::features::*;
use vmplane_core::lifecycle::{self, DesiredAction, PrintableStatus};
use vmplane_core::types::{GenericObject, Kind, Manifest, VirtualMachineInstance, parse_manifest};
use vmplane_core::*;

use crate::support::*;

// ---------------------------------------------------------------------------------------------
// Helpers

/// A `KubeVirt` manifest with this `spec.configuration` (YAML flow text).
fn kubevirt(configuration: &str) -> GenericObject {
    let yaml = format!(
        "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {{name: kubevirt, namespace: kubevirt}}\nspec:\n  configuration: {configuration}\n"
    );
    match parse_manifest(yaml.as_bytes()).expect("KubeVirt manifest") {
        Manifest::Object(Kind::KubeVirt, o) => *o,
        other => panic!("not a KubeVirt: {:?}", other.kind()),
    }
}

fn gates(enabled: &[&str], disabled: &[&str]) -> GenericObject {
    kubevirt(&format!(
        "{{developerConfiguration: {{featureGates: {enabled:?}, disabledFeatureGates: {disabled:?}}}}}"
    ))
}

fn features(o: &GenericObject) -> Features {
    Features::from_config(Some(o))
}

/// Decides a command on the `cluster/config` stream.
fn decide_config(state: &ObjectState, cmd: ObjectCommand) -> Result<Decision, Rejection> {
    object::decide(state, &cmd, &mut ctx())
}

fn create_config(o: GenericObject) -> Result<Decision, Rejection> {
    decide_config(
        &ObjectState::default(),
        ObjectCommand::Create(Box::new(Manifest::Object(Kind::KubeVirt, Box::new(o)))),
    )
}

#[track_caller]
fn invalid_config(o: GenericObject) -> Rejection {
    match create_config(o) {
        Ok(d) => panic!("expected a rejection, got {:?}", types_of(&d)),
        Err(r) => {
            assert_eq!(r.category, Category::Invalid, "{r}");
            r
        }
    }
}

/// A VM with run strategy `rs` whose template also carries `devices_extra` (YAML lines under
/// `devices:`, indented 10) and `spec_extra` (lines under the template spec, indented 6).
fn vm_with(rs: &str, devices_extra: &str, spec_extra: &str) -> types::VirtualMachine {
    vm_from(&format!(
        r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {{name: demo, namespace: default}}
spec:
  runStrategy: {rs}
  template:
    spec:
      domain:
        memory: {{guest: 128Mi}}
        devices:
          disks:
          - name: root
            disk: {{bus: virtio}}
{devices_extra}
      volumes:
      - name: root
        containerDisk: {{image: quay.io/containerdisks/cirros}}
{spec_extra}
"#
    ))
}

fn downward_vm(rs: &str) -> types::VirtualMachine {
    vm_with(rs, "          downwardMetrics: {}", "")
}

fn cond<'a>(conds: &'a [lifecycle::Condition], kind: &str) -> Option<&'a lifecycle::Condition> {
    conds.iter().find(|c| c.kind == kind)
}

fn on() -> Features {
    Features::with_enabled(&[DOWNWARD_METRICS])
}

fn off() -> Features {
    Features::defaults()
}

// ---------------------------------------------------------------------------------------------
// Registry and stages

#[test]
fn registry_names_are_unique_and_carry_kubevirts_stages() {
    let mut names: Vec<&str> = GATES.iter().map(|g| g.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), GATES.len(), "duplicate gate");
    let stage = |n: &str| gate(n).map(|g| g.stage);
    assert_eq!(stage("DownwardMetrics"), Some(Stage::Alpha));
    assert_eq!(stage("HostDevices"), Some(Stage::Alpha));
    assert_eq!(stage("Snapshot"), Some(Stage::Beta));
    assert_eq!(stage("GPU"), Some(Stage::Ga));
    assert_eq!(stage("VMPersistentState"), Some(Stage::Ga));
    assert_eq!(stage("PersistentReservation"), Some(Stage::Ga));
    assert_eq!(stage("HotplugVolumes"), Some(Stage::Deprecated));
    assert_eq!(stage("Macvtap"), Some(Stage::Discontinued));
    assert_eq!(stage("downwardmetrics"), None, "names are case-sensitive");
    for g in GATES {
        let has_message = !g.message.is_empty();
        let needs_message = matches!(g.stage, Stage::Deprecated | Stage::Discontinued);
        assert_eq!(has_message, needs_message, "{}", g.name);
    }
}

#[test]
fn each_stage_has_kubevirts_default() {
    let f = Features::defaults();
    for g in GATES {
        let s = f.status(g.name).unwrap();
        assert_eq!(s.source, Source::Default, "{}", g.name);
        let expected = matches!(g.stage, Stage::Beta | Stage::Ga);
        assert_eq!(s.enabled, expected, "{} ({})", g.name, g.stage.as_str());
    }
    assert!(!f.is_enabled(DOWNWARD_METRICS));
    assert!(f.is_enabled(SNAPSHOT));
    assert!(f.is_enabled(GPU));
    assert!(!f.is_enabled("MultiArchitecture"));
    assert!(!f.is_enabled("Passt"));
}

#[test]
fn effective_features_lists_every_gate_with_stage_and_source() {
    let o = gates(&[DOWNWARD_METRICS], &[SNAPSHOT]);
    let all = effective_features(Some(&o));
    assert_eq!(all.len(), GATES.len());
    let find = |n: &str| *all.iter().find(|s| s.name == n).unwrap();
    assert_eq!(
        find(DOWNWARD_METRICS),
        FeatureStatus {
            name: DOWNWARD_METRICS,
            enabled: true,
            source: Source::Explicit,
            stage: Stage::Alpha
        }
    );
    assert_eq!(
        (find(SNAPSHOT).enabled, find(SNAPSHOT).source),
        (false, Source::Explicit)
    );
    assert_eq!(
        (find(HOST_DEVICES).enabled, find(HOST_DEVICES).source),
        (false, Source::Default)
    );
    assert_eq!(effective_features(None), Features::defaults().statuses());
    assert_eq!(Source::Explicit.as_str(), "explicit");
    assert_eq!(Stage::Ga.as_str(), "GA");
}

// ---------------------------------------------------------------------------------------------
// IsEnabled edge cases

#[test]
fn alpha_is_on_only_when_listed() {
    assert!(features(&gates(&["HostDevices"], &[])).is_enabled(HOST_DEVICES));
    assert!(!features(&gates(&[], &["HostDevices"])).is_enabled(HOST_DEVICES));
    assert!(!features(&gates(&["CPUManager"], &[])).is_enabled(HOST_DEVICES));
}

#[test]
fn beta_is_on_unless_disabled() {
    assert!(features(&gates(&[], &[])).is_enabled(SNAPSHOT));
    assert!(features(&gates(&["Snapshot"], &[])).is_enabled(SNAPSHOT));
    let f = features(&gates(&[], &["Snapshot"]));
    assert!(!f.is_enabled(SNAPSHOT));
    assert_eq!(f.status(SNAPSHOT).unwrap().source, Source::Explicit);
}

#[test]
fn ga_listed_in_disabled_stays_on_and_listing_it_is_a_no_op() {
    let o = gates(&["NUMA"], &["GPU", "VMPersistentState"]);
    let f = features(&o);
    for n in [GPU, VM_PERSISTENT_STATE, "NUMA"] {
        let s = f.status(n).unwrap();
        assert!(s.enabled, "{n}");
        assert_eq!(
            s.source,
            Source::Default,
            "{n}: listing a GA gate decides nothing"
        );
    }
    // Accepted, with KubeVirt-style warnings naming the entries.
    assert!(create_config(o.clone()).is_ok());
    let w = config_warnings(&o);
    let fields: Vec<&str> = w.iter().map(|c| c.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.configuration.developerConfiguration.featureGates[0]",
            "spec.configuration.developerConfiguration.disabledFeatureGates[0]",
            "spec.configuration.developerConfiguration.disabledFeatureGates[1]",
        ]
    );
}

#[test]
fn deprecated_is_off_unless_listed_and_warns() {
    assert!(!Features::defaults().is_enabled("HotplugVolumes"));
    let o = gates(&["HotplugVolumes"], &[]);
    let f = features(&o);
    assert!(f.is_enabled("HotplugVolumes"));
    assert_eq!(f.status("HotplugVolumes").unwrap().source, Source::Explicit);
    assert!(create_config(o.clone()).is_ok());
    let w = config_warnings(&o);
    assert_eq!(w.len(), 1);
    assert!(
        w[0].reason.contains("DeclarativeHotplugVolumes"),
        "{}",
        w[0]
    );
    assert!(!features(&gates(&[], &["HotplugVolumes"])).is_enabled("HotplugVolumes"));
}

#[test]
fn unknown_and_discontinued_names_are_never_enabled() {
    // `from_config` is total even for a configuration validation would refuse.
    let f = features(&gates(&["Passt", "NoSuchGate"], &[]));
    assert!(!f.is_enabled("Passt"));
    assert!(!f.is_enabled("NoSuchGate"));
    assert!(f.status("NoSuchGate").is_none());
}

#[test]
fn no_or_deleted_configuration_means_defaults() {
    assert_eq!(Features::from_config(None), Features::defaults());
    let o = gates(&[DOWNWARD_METRICS], &[]);
    let d = create_config(o).unwrap();
    let state = d.events.iter().fold(ObjectState::default(), object::evolve);
    assert!(Features::from_cluster(&state).is_enabled(DOWNWARD_METRICS));
    let d = decide_config(&state, ObjectCommand::Delete(None)).unwrap();
    let state = d.events.iter().fold(state, object::evolve);
    assert_eq!(Features::from_cluster(&state), Features::defaults());
    assert_eq!(
        Features::from_cluster(&ObjectState::default()),
        Features::defaults()
    );
}

// ---------------------------------------------------------------------------------------------
// Configurables

#[test]
fn downward_metrics_configurable_forms() {
    for (form, expected) in [
        ("{}", true),
        ("Enabled", true),
        ("Disabled", false),
        ("{enabled: true}", true),
        ("{enabled: false}", false),
    ] {
        let o = kubevirt(&format!("{{downwardMetrics: {form}}}"));
        create_config(o.clone()).unwrap_or_else(|r| panic!("{form}: {r}"));
        let s = *features(&o).status(DOWNWARD_METRICS).unwrap();
        assert_eq!(
            (s.enabled, s.source),
            (expected, Source::Explicit),
            "{form}"
        );
    }
    let r = invalid_config(kubevirt("{downwardMetrics: maybe}"));
    assert_eq!(r.causes[0].field, "spec.configuration.downwardMetrics");
    assert_eq!(r.causes[0].code, codes::INVALID_VALUE);
}

#[test]
fn configurable_contradicting_a_gate_list_is_rejected() {
    let r = invalid_config(kubevirt(
        "{downwardMetrics: Disabled, developerConfiguration: {featureGates: [DownwardMetrics]}}",
    ));
    assert_eq!(r.codes(), [codes::FEATURE_GATE_CONFLICT]);
    assert_eq!(r.causes[0].field, "spec.configuration.downwardMetrics");
    // Agreeing with the list is fine.
    create_config(kubevirt(
        "{downwardMetrics: {}, developerConfiguration: {featureGates: [DownwardMetrics]}}",
    ))
    .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Validation of the KubeVirt object: every cause, with its field path; nothing appended

#[test]
fn a_gate_in_both_lists_is_rejected() {
    let r = invalid_config(gates(&["CPUManager", "Snapshot"], &["Snapshot"]));
    assert_eq!(r.category, Category::Invalid);
    assert_eq!(r.codes(), [codes::FEATURE_GATE_CONFLICT]);
    assert_eq!(
        r.causes[0].field,
        "spec.configuration.developerConfiguration.featureGates[1]"
    );
    assert!(r.causes[0].reason.contains("Snapshot"), "{r}");
    assert!(
        r.causes[0].reason.contains("disabledFeatureGates[0]"),
        "{r}"
    );
}

/// D7: KubeVirt's KubeVirt-CR admitter only warns about names it does not register and about
/// Discontinued gates (`warnDeprecatedFeatureGates`): a CR exported from a real cluster applies
/// unchanged. Such names are never enabled, and each gets a warning naming its entry.
#[test]
fn unknown_and_discontinued_gates_are_accepted_never_enabled_and_warned_about() {
    let o = gates(
        &["CPUManager", "Snapshot", "NoSuchGate", "Macvtap"],
        &[
            "ExperimentalVirtiofsSupport",
            "snapshot",
            "HostDisk",
            "HostDisk",
        ],
    );
    let d = create_config(o.clone()).unwrap_or_else(|r| panic!("refused: {r}"));
    assert_eq!(types_of(&d), ["ObjectCreated"]);
    // Stored as written: the manifest in the event keeps every entry.
    let state = d.events.iter().fold(ObjectState::default(), object::evolve);
    let f = Features::from_cluster(&state);
    assert!(!f.is_enabled("NoSuchGate"));
    assert!(f.status("NoSuchGate").is_none(), "not a registered feature");
    let macvtap = *f.status("Macvtap").unwrap();
    assert_eq!(
        (macvtap.enabled, macvtap.source, macvtap.stage),
        (false, Source::Default, Stage::Discontinued),
        "listing a Discontinued gate decides nothing"
    );
    assert!(!f.is_enabled("ExperimentalVirtiofsSupport"));
    // `snapshot` is not `Snapshot` (names are exact): Snapshot stays on, as listed.
    assert_eq!(
        f.status(SNAPSHOT).map(|s| (s.enabled, s.source)),
        Some((true, Source::Explicit))
    );
    assert!(f.is_enabled("CPUManager"));
    assert_eq!(f, features(&o));

    let w = config_warnings(&o);
    let got: Vec<(&str, &str)> = w.iter().map(|c| (c.field.as_str(), c.code)).collect();
    let dev = "spec.configuration.developerConfiguration";
    assert_eq!(
        got,
        [
            (
                format!("{dev}.featureGates[2]").as_str(),
                codes::FEATURE_GATE_UNKNOWN
            ),
            (
                format!("{dev}.featureGates[3]").as_str(),
                codes::FEATURE_GATE_DISCONTINUED
            ),
            (
                format!("{dev}.disabledFeatureGates[0]").as_str(),
                codes::FEATURE_GATE_DISCONTINUED
            ),
            (
                format!("{dev}.disabledFeatureGates[1]").as_str(),
                codes::FEATURE_GATE_UNKNOWN
            ),
        ]
    );
    assert_eq!(
        w[0].reason,
        "unknown feature gate \"NoSuchGate\": ignored (never enabled)"
    );
    assert!(
        w[1].reason
            .starts_with("feature gate Macvtap is discontinued and never enabled"),
        "{}",
        w[1]
    );
    assert!(
        w[1].reason
            .contains("Macvtap network binding is discontinued since v1.3. Please refer to Kubevirt user guide for alternatives."),
        "{}",
        w[1]
    );
    assert_eq!(
        w[3].reason,
        "unknown feature gate \"snapshot\": ignored (never enabled); names are case-sensitive: did you mean \"Snapshot\"?"
    );
}

#[test]
fn a_name_in_both_lists_is_refused_even_when_unknown_or_discontinued() {
    let r = invalid_config(gates(
        &["Macvtap", "NoSuchGate"],
        &["NoSuchGate", "Macvtap"],
    ));
    assert_eq!(
        r.codes(),
        [codes::FEATURE_GATE_CONFLICT, codes::FEATURE_GATE_CONFLICT]
    );
    let fields: Vec<&str> = r.causes.iter().map(|c| c.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.configuration.developerConfiguration.featureGates[0]",
            "spec.configuration.developerConfiguration.featureGates[1]",
        ]
    );
    assert!(
        r.causes[0].reason.contains("disabledFeatureGates[1]"),
        "{r}"
    );
}

#[test]
fn malformed_lists_are_rejected() {
    let r = invalid_config(kubevirt(
        "{developerConfiguration: {featureGates: Snapshot, disabledFeatureGates: [1]}}",
    ));
    let fields: Vec<&str> = r.causes.iter().map(|c| c.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.configuration.developerConfiguration.featureGates",
            "spec.configuration.developerConfiguration.disabledFeatureGates[0]",
        ]
    );
}

#[test]
fn gate_list_limit_edge() {
    let at_limit = vec!["CPUManager"; vmplane_core::limits::FEATURE_GATES_PER_LIST_MAX];
    create_config(gates(&at_limit, &[])).unwrap();
    let over = vec!["CPUManager"; vmplane_core::limits::FEATURE_GATES_PER_LIST_MAX + 1];
    let r = invalid_config(gates(&over, &[]));
    assert_eq!(r.codes(), [codes::TOO_MANY]);
}

#[test]
fn invalid_update_appends_nothing_and_valid_update_is_recorded() {
    let d = create_config(gates(&[], &[])).unwrap();
    assert_eq!(types_of(&d), ["ObjectCreated"]);
    let state = d.events.iter().fold(ObjectState::default(), object::evolve);
    let bad = Manifest::Object(
        Kind::KubeVirt,
        Box::new(gates(&["Snapshot"], &["Snapshot"])),
    );
    let r = decide_config(&state, ObjectCommand::Update(Box::new(bad), None));
    assert_rejected(r, Category::Invalid, codes::FEATURE_GATE_CONFLICT);
    let good = Manifest::Object(Kind::KubeVirt, Box::new(gates(&[], &["Snapshot"])));
    let d = decide_config(&state, ObjectCommand::Update(Box::new(good), None)).unwrap();
    assert_eq!(types_of(&d), ["ObjectUpdated"]);
}

#[test]
fn one_configuration_per_cluster() {
    let d = create_config(gates(&[], &[])).unwrap();
    let state = d.events.iter().fold(ObjectState::default(), object::evolve);
    let mut other = gates(&[], &[]);
    other.metadata.name = Some("second".into());
    let r = decide_config(
        &state,
        ObjectCommand::Apply(
            Box::new(Manifest::Object(Kind::KubeVirt, Box::new(other))),
            None,
        ),
    );
    assert_rejected(r, Category::Invalid, codes::NAME_MISMATCH);
}

// ---------------------------------------------------------------------------------------------
// What a VM requests, at its field

#[test]
fn each_feature_is_detected_at_its_field() {
    let vm = vm_from(
        r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: demo, namespace: default}
spec:
  runStrategy: Halted
  template:
    spec:
      domain:
        memory: {guest: 128Mi}
        firmware:
          bootloader:
            efi: {persistent: true}
        devices:
          downwardMetrics: {}
          tpm: {persistent: true}
          hostDevices:
          - {name: hd, deviceName: vendor.com/dev}
          gpus:
          - {name: gpu1, deviceName: nvidia.com/GP102GL}
          disks:
          - name: root
            disk: {bus: virtio}
          - name: shared
            lun: {bus: scsi, reservation: true}
      volumes:
      - name: root
        containerDisk: {image: quay.io/containerdisks/cirros}
      - name: metrics
        downwardMetrics: {}
      - name: shared
        persistentVolumeClaim: {claimName: shared}
"#,
    );
    let got: Vec<(&str, String)> = vm_features_requested(&vm)
        .into_iter()
        .map(|u| (u.feature, u.field))
        .collect();
    let p = "spec.template.spec";
    assert_eq!(
        got,
        [
            (
                DOWNWARD_METRICS,
                format!("{p}.domain.devices.downwardMetrics")
            ),
            (
                VM_PERSISTENT_STATE,
                format!("{p}.domain.devices.tpm.persistent")
            ),
            (
                VM_PERSISTENT_STATE,
                format!("{p}.domain.firmware.bootloader.efi.persistent")
            ),
            (
                PERSISTENT_RESERVATION,
                format!("{p}.domain.devices.disks[1].lun.reservation")
            ),
            (HOST_DEVICES, format!("{p}.domain.devices.hostDevices")),
            (GPU, format!("{p}.domain.devices.gpus")),
            (DOWNWARD_METRICS, format!("{p}.volumes[1].downwardMetrics")),
        ]
    );
    assert!(
        got.iter().all(|(f, _)| *f != SNAPSHOT),
        "Snapshot gates commands, not specs"
    );
}

#[test]
fn plain_vm_and_non_persistent_devices_request_nothing() {
    assert!(vm_features_requested(&small_vm("demo", "Always")).is_empty());
    let vm = vm_with(
        "Halted",
        "          tpm: {persistent: false}\n          gpus: []",
        "",
    );
    assert!(vm_features_requested(&vm).is_empty());
}

#[test]
fn vmi_fields_are_under_spec() {
    let vmi = standalone_vmi();
    let uses = vmi_features_requested(&vmi);
    assert_eq!(
        uses,
        [FeatureUse {
            feature: DOWNWARD_METRICS,
            field: "spec.domain.devices.downwardMetrics".into()
        }]
    );
}

// ---------------------------------------------------------------------------------------------
// Rules through desired_action / conditions / render

#[test]
fn starting_a_vm_that_requests_a_disabled_feature_creates_no_vmi() {
    let mut s = Scenario::new();
    s.create(downward_vm("Always"));
    let st = s.state();
    assert_eq!(
        lifecycle::desired_action(&st, &off(), 0),
        DesiredAction::FeatureNotEnabled {
            feature: DOWNWARD_METRICS
        }
    );
    assert_eq!(
        lifecycle::printable_status(&st, &off(), 0),
        PrintableStatus::Stopped
    );
    // The reconciler's launch is refused, and appends nothing.
    let before = s.events.len();
    let r = assert_rejected(
        s.when(launch_with(off())),
        Category::FailedPrecondition,
        codes::FEATURE_NOT_ENABLED,
    );
    assert!(r.causes[0].reason.contains("DownwardMetrics"), "{r}");
    assert_eq!(s.events.len(), before);
    // The VM says why, naming the feature and the field.
    let conds = lifecycle::conditions(&st, &off(), 0);
    let failure = cond(&conds, "Failure").expect("Failure condition");
    assert_eq!(failure.reason, "FeatureNotEnabled");
    assert!(
        failure.message.contains("DownwardMetrics"),
        "{}",
        failure.message
    );
    assert!(
        failure
            .message
            .contains("spec.template.spec.domain.devices.downwardMetrics"),
        "{}",
        failure.message
    );
    let rendered = serde_json::to_value(lifecycle::render(&st, &off(), 0).unwrap()).unwrap();
    let reasons: Vec<&str> = rendered["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["reason"].as_str())
        .collect();
    assert!(reasons.contains(&"FeatureNotEnabled"), "{reasons:?}");
    // Enabled, the same VM launches.
    assert_eq!(
        lifecycle::desired_action(&st, &on(), 0),
        DesiredAction::Launch
    );
    assert!(cond(&lifecycle::conditions(&st, &on(), 0), "Failure").is_none());
    s.ok(launch_with(on()));
    assert!(s.state().active_vmi().is_some());
}

#[test]
fn a_vm_s_requested_features_are_derived_when_asked_and_follow_its_edits() {
    let gates = |uses: &[FeatureUse]| uses.iter().map(|u| u.feature).collect::<Vec<_>>();
    let mut s = Scenario::new();
    let created = s.create(downward_vm("Halted"));
    let after = created
        .vm_after
        .as_deref()
        .expect("the state after the create");
    // The decided state and the fold of the stream derive the same.
    assert_eq!(after.requested(), s.state().requested());
    assert_eq!(gates(after.requested()), [DOWNWARD_METRICS]);
    assert_eq!(
        after.requested()[0].field,
        "spec.template.spec.domain.devices.downwardMetrics"
    );
    // An edit that drops the device, decided on a state that has derived its features: the
    // state after requests nothing, while the state before it (as time travel keeps it)
    // still requests what it did.
    let before = s.state();
    assert_eq!(gates(before.requested()), [DOWNWARD_METRICS]);
    let edited = vm::decide(&before, &apply_cmd(vm_with("Halted", "", "")), &mut ctx())
        .expect("the edit is accepted");
    let after = edited
        .vm_after
        .as_deref()
        .expect("the state after the edit");
    assert!(after.requested().is_empty(), "{:?}", after.requested());
    assert_eq!(gates(before.requested()), [DOWNWARD_METRICS]);
    let edited = s.apply(vm_with("Halted", "", ""));
    let after = edited
        .vm_after
        .as_deref()
        .expect("the state after the edit");
    assert!(after.requested().is_empty(), "{:?}", after.requested());
    assert!(s.state().requested().is_empty());
    // And back: the device again, the feature again.
    let edited = s.apply(downward_vm("Halted"));
    let after = edited
        .vm_after
        .as_deref()
        .expect("the state after the edit");
    assert_eq!(gates(after.requested()), [DOWNWARD_METRICS]);
    assert_eq!(
        lifecycle::feature_blockers(after, &off()),
        after.requested().to_vec()
    );
    assert!(lifecycle::feature_blockers(after, &on()).is_empty());
}

#[test]
fn manual_start_is_recorded_but_no_vmi_follows_while_disabled() {
    let mut s = Scenario::new();
    s.create(downward_vm("Manual"));
    s.ok(VmCommand::Start { paused: false });
    let st = s.state();
    assert!(st.run.start_requested);
    assert!(matches!(
        lifecycle::desired_action(&st, &off(), 0),
        DesiredAction::FeatureNotEnabled { .. }
    ));
    assert_rejected(
        s.when(launch_with(off())),
        Category::FailedPrecondition,
        codes::FEATURE_NOT_ENABLED,
    );
}

#[test]
fn stopped_vm_shows_the_mismatch_in_its_status() {
    let mut s = Scenario::new();
    s.create(downward_vm("Halted"));
    let st = s.state();
    assert_eq!(
        lifecycle::desired_action(&st, &off(), 0),
        DesiredAction::Nothing
    );
    let conds = lifecycle::conditions(&st, &off(), 0);
    let m = cond(&conds, "FeatureMismatch").expect("FeatureMismatch");
    assert_eq!(m.reason, "FeatureNotEnabled");
    assert!(m.message.contains("DownwardMetrics"), "{}", m.message);
    assert!(
        cond(&conds, "Failure").is_none(),
        "a halted VM is not failing"
    );
    assert!(cond(&lifecycle::conditions(&st, &on(), 0), "FeatureMismatch").is_none());
}

#[test]
fn disabling_while_running_keeps_the_vm_running_then_blocks_the_next_start_until_reenabled() {
    let mut s = Scenario::new();
    s.create(downward_vm("Always"));
    s.ok(launch_with(on()));
    s.observe(VmiPhase::Running);
    // The admin disables the gate: the configuration change itself is accepted.
    create_config(gates(&[], &[DOWNWARD_METRICS])).unwrap();
    let disabled = features(&gates(&[], &[DOWNWARD_METRICS]));
    let st = s.state();
    assert_eq!(
        lifecycle::desired_action(&st, &disabled, 0),
        DesiredAction::Nothing,
        "never killed"
    );
    assert_eq!(
        lifecycle::printable_status(&st, &disabled, 0),
        PrintableStatus::Running
    );
    let conds = lifecycle::conditions(&st, &disabled, 0);
    let m = cond(&conds, "FeatureMismatch").expect("FeatureMismatch");
    assert_eq!(m.reason, "FeatureDisabledWhileRunning");
    assert!(m.message.contains("DownwardMetrics"), "{}", m.message);
    assert!(cond(&conds, "Failure").is_none());
    // It stops (the guest shut down); Always wants a new VMI, which is held back.
    s.observe(VmiPhase::Succeeded);
    let uid = s.state().run.vmi.as_ref().unwrap().uid;
    s.ok(VmCommand::ObserveVmi {
        vmi_uid: uid,
        observation: VmiObservation::Removed,
    });
    let st = s.state();
    assert_eq!(
        lifecycle::desired_action(&st, &disabled, 0),
        DesiredAction::FeatureNotEnabled {
            feature: DOWNWARD_METRICS
        }
    );
    assert_rejected(
        s.when(launch_with(disabled.clone())),
        Category::FailedPrecondition,
        codes::FEATURE_NOT_ENABLED,
    );
    let conds = lifecycle::conditions(&st, &disabled, 0);
    assert_eq!(cond(&conds, "Failure").unwrap().reason, "FeatureNotEnabled");
    assert_eq!(
        cond(&conds, "FeatureMismatch").unwrap().reason,
        "FeatureNotEnabled"
    );
    // Re-enabled: everything clears and the VM launches.
    let conds = lifecycle::conditions(&st, &on(), 0);
    assert!(cond(&conds, "Failure").is_none());
    assert!(cond(&conds, "FeatureMismatch").is_none());
    assert_eq!(
        lifecycle::desired_action(&st, &on(), 0),
        DesiredAction::Launch
    );
    s.ok(launch_with(on()));
}

#[test]
fn reenabling_while_running_clears_the_mismatch() {
    let mut s = Scenario::new();
    s.create(downward_vm("Always"));
    s.ok(launch_with(on()));
    s.observe(VmiPhase::Running);
    let st = s.state();
    assert!(cond(&lifecycle::conditions(&st, &off(), 0), "FeatureMismatch").is_some());
    assert!(cond(&lifecycle::conditions(&st, &on(), 0), "FeatureMismatch").is_none());
}

#[test]
fn host_devices_follow_the_same_rules_and_ga_features_never_block() {
    let mut s = Scenario::new();
    s.create(vm_with(
        "Always",
        "          hostDevices:\n          - {name: hd, deviceName: vendor.com/dev}\n          gpus:\n          - {name: g, deviceName: nvidia.com/x}\n          tpm: {persistent: true}",
        "",
    ));
    let st = s.state();
    assert_eq!(
        lifecycle::desired_action(&st, &off(), 0),
        DesiredAction::FeatureNotEnabled {
            feature: HOST_DEVICES
        }
    );
    // GA gates (GPU, VMPersistentState) cannot be disabled, even by listing them.
    let f = features(&gates(&[HOST_DEVICES], &[GPU, VM_PERSISTENT_STATE]));
    assert_eq!(lifecycle::desired_action(&st, &f, 0), DesiredAction::Launch);
}

// ---------------------------------------------------------------------------------------------
// Standalone VMIs

fn standalone_vmi() -> VirtualMachineInstance {
    let yaml = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: solo, namespace: default}
spec:
  domain:
    memory: {guest: 128Mi}
    devices:
      downwardMetrics: {}
"#;
    match parse_manifest(yaml.as_bytes()).unwrap() {
        Manifest::VirtualMachineInstance(v) => *v,
        other => panic!("not a VMI: {:?}", other.kind()),
    }
}

#[test]
fn standalone_vmi_requesting_a_disabled_feature_stays_pending_not_synchronized() {
    let d = vmi::decide(
        &VmiState::default(),
        &VmiCommand::Create(Box::new(standalone_vmi())),
        &mut ctx(),
    )
    .unwrap();
    let st = d.events.iter().fold(VmiState::default(), vmi::evolve);
    assert_eq!(st.phase, Some(VmiPhase::Pending));
    let blocked = lifecycle::vmi_blocked_by(&st, &off());
    assert_eq!(blocked.len(), 1);
    assert_eq!(blocked[0].field, "spec.domain.devices.downwardMetrics");
    let conds = lifecycle::vmi_conditions(&st, &off());
    assert_eq!(conds.len(), 1);
    assert_eq!(
        (conds[0].kind, conds[0].status, conds[0].reason.as_str()),
        ("Synchronized", false, "FeatureNotEnabled")
    );
    assert!(
        conds[0]
            .message
            .starts_with("virtual machine is requesting the disabled feature: DownwardMetrics"),
        "{}",
        conds[0].message
    );
    assert!(lifecycle::vmi_blocked_by(&st, &on()).is_empty());
    assert!(lifecycle::vmi_conditions(&st, &on()).is_empty());
    // Once it runs (enabled at the time), disabling the feature only adds a mismatch.
    let mut c = ctx();
    let d = vmi::decide(
        &st,
        &VmiCommand::Observe(VmiObservation::Phase {
            phase: VmiPhase::Running,
            reason: None,
            message: None,
        }),
        &mut c,
    )
    .unwrap();
    let st = d.events.iter().fold(st, vmi::evolve);
    assert!(lifecycle::vmi_blocked_by(&st, &off()).is_empty());
    let conds = lifecycle::vmi_conditions(&st, &off());
    assert_eq!(
        (conds[0].kind, conds[0].reason.as_str()),
        ("FeatureMismatch", "FeatureDisabledWhileRunning")
    );
}

// ---------------------------------------------------------------------------------------------
// Commands gated by a feature

#[test]
fn snapshot_commands_require_the_snapshot_gate() {
    assert_eq!(require_feature(&Features::defaults(), SNAPSHOT), Ok(()));
    let f = features(&gates(&[], &[SNAPSHOT]));
    let r = require_feature(&f, SNAPSHOT).unwrap_err();
    assert_eq!(r.category, Category::FailedPrecondition);
    assert_eq!(r.codes(), [codes::FEATURE_NOT_ENABLED]);
    assert_eq!(r.causes[0].reason, "Snapshot feature gate is not enabled");
    assert!(require_feature(&Features::defaults(), "NoSuchGate").is_err());
}
