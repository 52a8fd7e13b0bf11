//! KubeVirt's admission rules for VM templates and VMIs (its `ValidateVirtualMachineInstanceSpec`
//! and the metadata rules of the Kubernetes API server), and what vmplane refuses because it
//! would accept and then ignore or crash-loop on it. Every refusal names its field path, and
//! nothing is appended.

use vmplane_core::features::{self, Features};
use vmplane_core::types::{self, Kind, Manifest, VirtualMachine, parse_manifest};
use vmplane_core::*;

use crate::support::*;

/// The audit's minimal VM (`runStrategy: Halted`, `memory.guest: 64Mi`, no devices) with
/// `domain` lines added under `domain:` and `spec` lines under the template's `spec:` (each
/// already indented for its place).
fn vm_with(domain: &str, spec: &str) -> VirtualMachine {
    vm_from(&format!(
        "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {{name: q, namespace: default}}
spec:
  runStrategy: Halted
  template:
    spec:
{spec}      domain:
        memory: {{guest: 64Mi}}
        devices: {{}}
{domain}"
    ))
}

/// The causes' fields of a refused apply of `vm` (asserting that nothing was appended).
#[track_caller]
fn refused(vm: VirtualMachine, code: &str) -> Rejection {
    let mut s = Scenario::new();
    let r = assert_rejected(s.when(apply_cmd(vm)), Category::Invalid, code);
    assert!(s.events.is_empty(), "nothing appended");
    r
}

#[track_caller]
fn accepted(vm: VirtualMachine) {
    Scenario::new().apply(vm);
}

fn fields(r: &Rejection) -> Vec<&str> {
    r.causes.iter().map(|c| c.field.as_str()).collect()
}

fn reason<'a>(r: &'a Rejection, field: &str) -> &'a str {
    r.causes
        .iter()
        .find(|c| c.field == field)
        .map(|c| c.reason.as_str())
        .unwrap_or_else(|| panic!("no cause at {field}: {r}"))
}

const D: &str = "spec.template.spec.domain";

// ---------------------------------------------------------------------------------------------
// The real KubeVirt manifests

#[test]
fn every_testdata_vm_and_vmi_still_validates() {
    let mut checked = 0;
    for path in testdata_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        for m in types::parse_manifests(text.as_bytes()).unwrap() {
            let r = match &m {
                Manifest::VirtualMachine(vm) => {
                    let mut vm = (**vm).clone();
                    defaults::normalize_vm(&mut vm);
                    validate::vm(&vm)
                }
                Manifest::VirtualMachineInstance(vmi) => validate::vmi(vmi),
                _ => continue,
            };
            assert!(r.is_ok(), "{}: {}", path.display(), r.unwrap_err());
            checked += 1;
        }
    }
    assert!(checked >= 25, "{checked} VMs and VMIs");
}

// ---------------------------------------------------------------------------------------------
// Resources

#[test]
fn negative_requests_and_limits_are_refused_in_kubevirts_words() {
    let r = refused(
        vm_with(
            "        resources:\n          requests: {memory: -64Mi, cpu: '-1'}\n          limits: {memory: -1Gi, cpu: -500m}\n",
            "",
        ),
        codes::INVALID_VALUE,
    );
    for (what, key, value) in [
        ("requests", "memory", "-64Mi"),
        ("limits", "memory", "-1Gi"),
        ("requests", "cpu", "-1"),
        ("limits", "cpu", "-500m"),
    ] {
        let field = format!("{D}.resources.{what}.{key}");
        assert_eq!(
            reason(&r, &field),
            format!("'{value}': must be greater than or equal to 0.")
        );
    }
}

#[test]
fn a_memory_limit_below_the_guest_memory_is_refused() {
    let r = refused(
        vm_with("        resources: {limits: {memory: 32Mi}}\n", ""),
        codes::INVALID_VALUE,
    );
    assert_eq!(fields(&r), [format!("{D}.memory.guest")]);
    assert_eq!(
        r.causes[0].reason,
        format!(
            "'64Mi' must be equal to or less than the memory limit {D}.resources.limits.memory '32Mi'"
        )
    );
    accepted(vm_with("        resources: {limits: {memory: 64Mi}}\n", ""));
}

#[test]
fn a_request_above_its_limit_is_refused_and_one_above_the_guest_memory_is_not() {
    let r = refused(
        vm_with(
            "        resources:\n          requests: {memory: 2Gi, cpu: '2'}\n          limits: {memory: 1Gi, cpu: 1500m}\n",
            "",
        ),
        codes::INVALID_VALUE,
    );
    assert_eq!(
        reason(&r, &format!("{D}.resources.requests.memory")),
        format!("'2Gi' is greater than {D}.resources.limits.memory '1Gi'")
    );
    assert_eq!(
        reason(&r, &format!("{D}.resources.requests.cpu")),
        format!("'2' is greater than {D}.resources.limits.cpu '1500m'")
    );
    // KubeVirt has no rule against a request above the guest memory (it covers overhead).
    accepted(vm_with(
        "        resources: {requests: {memory: 1Gi}}\n",
        "",
    ));
    // A request under 1M cannot be a VM's memory.
    let r = refused(
        vm_with("        resources: {requests: {memory: 1Ki}}\n", ""),
        codes::INVALID_VALUE,
    );
    assert!(
        reason(&r, &format!("{D}.resources.requests.memory"))
            .ends_with("'1Ki': must be greater than or equal to 1M."),
        "{r}"
    );
}

#[test]
fn a_vm_without_memory_is_refused_unless_its_instancetype_gives_it() {
    let no_memory = |extra: &str| {
        vm_from(&format!(
            "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {{name: q, namespace: default}}
spec:
  runStrategy: Halted
{extra}  template:
    spec:
      domain:
        devices: {{}}
"
        ))
    };
    let r = refused(no_memory(""), codes::REQUIRED);
    assert_eq!(fields(&r), [format!("{D}.memory.guest")]);
    assert_eq!(
        r.causes[0].reason,
        "no memory requested, at least one of 'spec.template.spec.domain.memory.guest', \
         'spec.template.spec.domain.memory.hugepages.size' or \
         'spec.template.spec.domain.resources.requests.memory' must be set"
    );
    // The expanded spec has the instancetype's memory: accepted.
    let mut s = Scenario::new();
    s.ok(VmCommand::Apply(Box::new(vm::PutVm {
        instancetype: Some(instancetype(CLUSTER_INSTANCETYPES, "u1.small")),
        ..vm::PutVm::new(no_memory("  instancetype: {name: u1.small}\n"))
    })));
    // A memory request or limit alone is memory.
    let mut requested = no_memory("");
    requested.vmi_spec_mut().domain.resources =
        Some(serde_json::from_str(r#"{"requests": {"memory": "64Mi"}}"#).unwrap());
    accepted(requested);
    // Hugepages alone give the page size, not the amount.
    let mut pages = no_memory("");
    pages.vmi_spec_mut().domain.memory =
        Some(serde_json::from_str(r#"{"hugepages": {"pageSize": "2Mi"}}"#).unwrap());
    let r = refused(pages, codes::REQUIRED);
    assert!(
        r.causes[0].reason.contains("hugepages give the page size"),
        "{r}"
    );
}

#[test]
fn a_standalone_vmi_without_memory_is_refused() {
    let vmi = match parse_manifest(
        b"apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: q}\nspec:\n  domain:\n    devices: {}\n",
    )
    .unwrap()
    {
        Manifest::VirtualMachineInstance(v) => v,
        _ => unreachable!(),
    };
    let r = validate::vmi(&vmi).unwrap_err();
    assert_eq!(fields(&r), ["spec.domain.memory.guest"]);
    assert!(
        r.causes[0].reason.contains("'spec.domain.memory.guest'"),
        "{r}"
    );
}

// ---------------------------------------------------------------------------------------------
// Firmware serial, machine type, interface models, host names

#[test]
fn a_firmware_serial_with_other_characters_is_refused() {
    let r = refused(
        vm_with("        firmware: {serial: 'has space/slash'}\n", ""),
        codes::INVALID_VALUE,
    );
    assert_eq!(fields(&r), [format!("{D}.firmware.serial")]);
    assert_eq!(
        r.causes[0].reason,
        format!("must be made up of the following characters [A-Za-z0-9_.+-], if specified")
    );
    accepted(vm_with("        firmware: {serial: Serial_1.2+3-4}\n", ""));
}

#[test]
fn only_the_machine_types_vmplane_runs_are_accepted() {
    for ok in ["q35", "pc-q35-7.2", "pc-q35-rhel9.4.0", "''"] {
        accepted(vm_with(&format!("        machine: {{type: {ok}}}\n"), ""));
    }
    for bad in ["pc-i440fx-7.2", "pc", "virt", "pc-q35-"] {
        let r = refused(
            vm_with(&format!("        machine: {{type: {bad}}}\n"), ""),
            codes::UNSUPPORTED,
        );
        assert_eq!(fields(&r), [format!("{D}.machine.type")]);
        assert!(
            r.causes[0].reason.contains("is not supported by vmplane"),
            "{r}"
        );
    }
    // An empty type is the default, as in KubeVirt.
    let mut vm = vm_with("        machine: {type: ''}\n", "");
    let expanded = instancetype::expand(&vm, None, None).unwrap();
    assert_eq!(
        expanded
            .vmi_spec()
            .unwrap()
            .domain
            .machine
            .as_ref()
            .unwrap()["type"],
        "q35"
    );
    vm.spec.run_strategy = Some("Always".into());
}

fn with_interface(model: &str) -> VirtualMachine {
    vm_from(&format!(
        "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {{name: q, namespace: default}}
spec:
  runStrategy: Halted
  template:
    spec:
      networks: [{{name: default, pod: {{}}}}]
      domain:
        memory: {{guest: 64Mi}}
        devices:
          interfaces: [{{name: default, masquerade: {{}}, model: {model}}}]
"
    ))
}

#[test]
fn interface_models_are_kubevirts_and_those_vmplane_renders() {
    for ok in ["virtio", "e1000", "e1000e", "rtl8139", "''"] {
        accepted(with_interface(ok));
    }
    let field = format!("{D}.devices.interfaces[0].model");
    let r = refused(with_interface("virtio-net"), codes::INVALID_VALUE);
    assert_eq!(fields(&r), [field.as_str()]);
    assert_eq!(
        r.causes[0].reason,
        format!(
            "interface {D}.devices.interfaces[0].name uses model \"virtio-net\" that is not supported."
        )
    );
    for kubevirts_only in ["ne2k_pci", "pcnet", "igb"] {
        let r = refused(with_interface(kubevirts_only), codes::UNSUPPORTED);
        assert_eq!(fields(&r), [field.as_str()]);
        assert!(
            r.causes[0].reason.contains("is not supported by vmplane"),
            "{r}"
        );
    }
    // An empty model is the default model.
    let expanded = instancetype::expand(&with_interface("''"), None, None).unwrap();
    let ifaces = expanded
        .vmi_spec()
        .unwrap()
        .domain
        .devices
        .as_ref()
        .unwrap()
        .interfaces
        .clone()
        .unwrap();
    assert_eq!(ifaces[0].model.as_deref(), Some("virtio"));
}

#[test]
fn a_preferences_machine_type_or_interface_model_vmplane_cannot_run_is_refused() {
    let vm = vm_from(
        "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: q, namespace: default}
spec:
  runStrategy: Halted
  preference: {name: odd}
  template:
    spec:
      domain:
        memory: {guest: 64Mi}
        devices: {}
",
    );
    let pref = match parse_manifest(
        b"apiVersion: instancetype.kubevirt.io/v1beta1
kind: VirtualMachineClusterPreference
metadata: {name: odd}
spec:
  machine: {preferredMachineType: pc-i440fx-8.0}
  devices: {preferredInterfaceModel: ne2k_pci}
",
    )
    .unwrap()
    {
        Manifest::Preference(p) => *p,
        _ => unreachable!(),
    };
    let mut s = Scenario::new();
    let r = assert_rejected(
        s.when(VmCommand::Apply(Box::new(vm::PutVm {
            preference: Some(pref),
            ..vm::PutVm::new(vm)
        }))),
        Category::Invalid,
        codes::UNSUPPORTED,
    );
    assert_eq!(fields(&r), ["spec.preference", "spec.preference"], "{r}");
    assert!(s.events.is_empty());
}

#[test]
fn a_hostname_must_be_a_dns_label() {
    let r = refused(
        vm_with("", "      hostname: Bad_Host\n"),
        codes::INVALID_VALUE,
    );
    assert_eq!(fields(&r), ["spec.template.spec.hostname"]);
    assert!(
        r.causes[0]
            .reason
            .starts_with("does not conform to the kubernetes DNS_LABEL rules : "),
        "{r}"
    );
    accepted(vm_with("", "      hostname: good-host-1\n"));
    let r = refused(
        vm_with("", "      subdomain: Not_One\n"),
        codes::INVALID_VALUE,
    );
    assert_eq!(fields(&r), ["spec.template.spec.subdomain"]);
}

// ---------------------------------------------------------------------------------------------
// Fields vmplane would accept and ignore

#[test]
fn start_strategy_paused_is_refused_as_vmplane_would_run_the_vm_unpaused() {
    let r = refused(
        vm_with("", "      startStrategy: Paused\n"),
        codes::UNSUPPORTED,
    );
    assert_eq!(fields(&r), ["spec.template.spec.startStrategy"]);
    assert!(
        r.causes[0]
            .reason
            .starts_with("startStrategy Paused is not supported by vmplane"),
        "{r}"
    );
    let r = refused(
        vm_with("", "      startStrategy: Later\n"),
        codes::INVALID_VALUE,
    );
    assert_eq!(
        r.causes[0].reason,
        "is set with an unrecognized option: \"Later\""
    );
}

#[test]
fn required_affinity_is_refused_and_preferred_affinity_accepted() {
    let required = "      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions: [{key: zone, operator: In, values: [nowhere]}]
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - labelSelector: {matchLabels: {app: db}}
            topologyKey: kubernetes.io/hostname
";
    let r = refused(vm_with("", required), codes::UNSUPPORTED);
    assert_eq!(
        fields(&r),
        [
            "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution",
            "spec.template.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution",
        ]
    );
    assert!(
        r.causes[0]
            .reason
            .contains("use spec.template.spec.nodeSelector, which vmplane honours"),
        "{r}"
    );
    let preferred = "      affinity:
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 1
            preference:
              matchExpressions: [{key: zone, operator: In, values: [a]}]
        podAffinity:
          requiredDuringSchedulingIgnoredDuringExecution: []
";
    accepted(vm_with("", preferred));
}

// ---------------------------------------------------------------------------------------------
// Discontinued feature gates (kubevirt.md §6)

fn kubevirt_cr(gates: &str) -> types::GenericObject {
    match parse_manifest(
        format!(
            "apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata: {{name: kubevirt, namespace: kubevirt}}
spec:
  configuration:
    developerConfiguration: {{featureGates: [{gates}]}}
"
        )
        .as_bytes(),
    )
    .unwrap()
    {
        Manifest::Object(Kind::KubeVirt, o) => *o,
        _ => unreachable!(),
    }
}

fn with_binding(binding: &str) -> VirtualMachine {
    vm_from(&format!(
        "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {{name: q, namespace: default}}
spec:
  runStrategy: Halted
  template:
    spec:
      networks: [{{name: net, multus: {{networkName: n}}}}]
      domain:
        memory: {{guest: 64Mi}}
        devices:
          interfaces: [{{name: net, {binding}: {{}}}}]
"
    ))
}

#[test]
fn a_listed_discontinued_gate_refuses_a_vm_using_its_api_with_the_gates_message() {
    let listed = Features::from_config(Some(&kubevirt_cr("Macvtap, Passt")));
    assert_eq!(listed.listed_discontinued(), ["Passt", "Macvtap"]);
    let r = features::check_vm_discontinued(&listed, &with_binding("macvtap")).unwrap_err();
    assert_eq!(r.category, Category::Invalid);
    assert_eq!(
        fields(&r),
        ["spec.template.spec.domain.devices.interfaces[0].macvtap"]
    );
    assert_eq!(r.causes[0].code, codes::FEATURE_GATE_DISCONTINUED);
    assert_eq!(
        r.causes[0].reason,
        "Macvtap network binding is discontinued since v1.3. Please refer to Kubevirt user guide for alternatives."
    );
    let r = features::check_vm_discontinued(&listed, &with_binding("passt")).unwrap_err();
    assert_eq!(
        r.causes[0].reason,
        "Passt network binding is discontinued since v1.3. Please refer to Kubevirt user guide for alternatives."
    );
    // Not listed, or not used: nothing to refuse.
    let unlisted = Features::from_config(Some(&kubevirt_cr("Snapshot")));
    assert!(features::check_vm_discontinued(&unlisted, &with_binding("macvtap")).is_ok());
    assert!(
        features::check_vm_discontinued(&Features::defaults(), &with_binding("macvtap")).is_ok()
    );
    assert!(features::check_vm_discontinued(&listed, &with_binding("masquerade")).is_ok());
}

/// The VM decision runs the rule on creation when the command carries the cluster's features
/// (the command path passes them), and never on an update: KubeVirt's VM admitter checks on
/// CREATE only, so a VM created before the gate was listed stays editable.
#[test]
fn a_vm_create_carrying_the_cluster_features_is_refused_and_an_update_is_not() {
    let listed = Features::from_config(Some(&kubevirt_cr("Macvtap")));
    let put = |vm: VirtualMachine, features: Option<Features>| {
        let mut put = PutVm::new(vm);
        put.features = features;
        VmCommand::Apply(Box::new(put))
    };
    let mut s = Scenario::new();
    let r = assert_rejected(
        s.when(put(with_binding("macvtap"), Some(listed.clone()))),
        Category::Invalid,
        codes::FEATURE_GATE_DISCONTINUED,
    );
    assert_eq!(
        fields(&r),
        ["spec.template.spec.domain.devices.interfaces[0].macvtap"]
    );
    assert!(s.events.is_empty(), "nothing appended");
    // Created while the gate was not listed; edited after it was: accepted.
    s.when(put(with_binding("macvtap"), None)).expect("created");
    let mut edited = with_binding("macvtap");
    edited.metadata.labels = Some(serde_json::Map::from_iter([(
        "edited".to_owned(),
        serde_json::Value::from("yes"),
    )]));
    s.when(put(edited, Some(listed)))
        .expect("an update is not checked");
}

// ---------------------------------------------------------------------------------------------
// Metadata

#[test]
fn labels_and_annotations_follow_the_rules_vmplane_label_checks() {
    let mut vm = vm_with("", "");
    vm.metadata.labels = Some(
        serde_json::from_str(
            r#"{"ok": "", "example.com/ok": "v-1", "Bad Key": "x", "Upper.Example/x": "y", "good": "no spaces allowed"}"#,
        )
        .unwrap(),
    );
    vm.metadata.annotations = Some(
        serde_json::from_str(r#"{"Upper.Example.com/ok": "any text at all", "no way": "x"}"#)
            .unwrap(),
    );
    vm.spec.template.as_mut().unwrap().metadata =
        Some(serde_json::from_str(r#"{"labels": {"app": "-bad-"}}"#).unwrap());
    let r = refused(vm, codes::INVALID_VALUE);
    assert_eq!(
        fields(&r),
        [
            "metadata.labels.Bad Key",
            "metadata.labels.Upper.Example/x",
            "metadata.labels.good",
            "metadata.annotations.no way",
            "spec.template.metadata.labels.app",
        ]
    );
    // One rule, one place: each reason is what `vmplane label` says for the same key or value.
    let key_why = selector::check_label_key("Bad Key").unwrap_err();
    assert_eq!(
        reason(&r, "metadata.labels.Bad Key"),
        format!("Invalid value: \"Bad Key\": {key_why}")
    );
    let value_why = selector::check_label_value("no spaces allowed").unwrap_err();
    assert_eq!(
        reason(&r, "metadata.labels.good"),
        format!("Invalid value: \"no spaces allowed\": {value_why}")
    );
}

#[test]
fn labels_are_checked_on_every_kind() {
    let snapshot = parse_manifest(
        b"apiVersion: snapshot.kubevirt.io/v1beta1
kind: VirtualMachineSnapshot
metadata: {name: s, namespace: default, labels: {'a b': c}}
spec: {source: {apiGroup: kubevirt.io, kind: VirtualMachine, name: q}}
",
    )
    .unwrap();
    let Manifest::Object(_, o) = snapshot else {
        unreachable!()
    };
    let r = validate::object(&o, true).unwrap_err();
    assert_eq!(fields(&r), ["metadata.labels.a b"]);
    let it = instancetype(CLUSTER_INSTANCETYPES, "u1.small");
    let mut bad = it.clone();
    bad.metadata.labels = Some(serde_json::from_str(r#"{"k": "a value"}"#).unwrap());
    assert!(validate::instancetype(&it).is_ok());
    assert_eq!(
        fields(&validate::instancetype(&bad).unwrap_err()),
        ["metadata.labels.k"]
    );
}

#[test]
fn generate_name_alone_is_refused_as_apply_cannot_use_it() {
    let vm = vm_from(
        "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {generateName: q-}
spec:
  runStrategy: Halted
  template: {spec: {domain: {memory: {guest: 64Mi}, devices: {}}}}
",
    );
    let r = refused(vm, codes::UNSUPPORTED);
    assert_eq!(fields(&r), ["metadata.generateName"]);
    assert_eq!(
        r.causes[0].reason,
        "generateName is not supported by apply: cannot use generate name with apply; give the object a metadata.name"
    );
    let mut unnamed = vm_with("", "");
    unnamed.metadata.name = None;
    let r = validate::vm(&unnamed).unwrap_err();
    assert_eq!(fields(&r), ["metadata.name"]);
    assert_eq!(r.causes[0].reason, "Required value: name is required");
}

// ---------------------------------------------------------------------------------------------
// Firmware UUID written in upper case

#[test]
fn an_upper_case_firmware_uuid_applied_again_changes_nothing() {
    let upper = "6A1A24A1-4061-4607-8BF4-A3963D0C5895";
    let vm = vm_with(&format!("        firmware: {{uuid: {upper}}}\n"), "");
    let mut s = Scenario::new();
    let d = s.apply(vm.clone());
    assert_eq!(
        created(&d).firmware_uuid.to_string(),
        upper.to_ascii_lowercase()
    );
    let stored = s.state().vm.as_deref().unwrap().clone();
    assert_eq!(
        stored.firmware().unwrap().uuid.as_deref(),
        Some(upper.to_ascii_lowercase().as_str())
    );
    // The same file again, and again: unchanged, no generation bump.
    for _ in 0..2 {
        let d = s.apply(vm.clone());
        assert_eq!(d.outcome, Outcome::Unchanged, "{:?}", types_of(&d));
        assert!(d.events.is_empty());
    }
}

// ---------------------------------------------------------------------------------------------
// kubevirt.io/v1alpha3

#[test]
fn kubevirt_io_v1alpha3_is_read_as_v1_and_says_it_is_deprecated() {
    let text = "apiVersion: kubevirt.io/v1alpha3
kind: VirtualMachine
metadata: {name: q, namespace: default}
spec:
  runStrategy: Halted
  template: {spec: {domain: {memory: {guest: 64Mi}, devices: {}}}}
";
    let m = parse_manifest(text.as_bytes()).unwrap();
    assert_eq!(m.kind(), Kind::VirtualMachine);
    assert_eq!(m.to_value()["apiVersion"], "kubevirt.io/v1");
    // JSON (the fast path) reads the same.
    let json = serde_json::to_string(
        &serde_json::to_value(serde_yaml::from_str::<serde_json::Value>(text).unwrap()).unwrap(),
    )
    .unwrap();
    assert_eq!(parse_manifest(json.as_bytes()).unwrap(), m);
    // The same VM in v1 is the same object: applied after it, nothing changes.
    let v1 = parse_manifest(text.replace("v1alpha3", "v1").as_bytes()).unwrap();
    assert_eq!(v1, m);
    let warning = "kubevirt.io/v1alpha3 is now deprecated and will be removed in a future release.";
    assert_eq!(
        types::deprecated_api_version("kubevirt.io/v1alpha3").as_deref(),
        Some(warning)
    );
    assert_eq!(types::deprecated_api_version("kubevirt.io/v1"), None);
    let doc = |t: &str| types::parse_documents(t.as_bytes()).unwrap().remove(0);
    assert_eq!(vmplane_core::schema::warnings(&doc(text)), [warning]);
    assert!(vmplane_core::schema::warnings(&doc(&text.replace("v1alpha3", "v1"))).is_empty());
    // Every kubevirt.io kind; no other group's v1alpha3.
    for kind in ["VirtualMachineInstance", "KubeVirt"] {
        let doc =
            format!("apiVersion: kubevirt.io/v1alpha3\nkind: {kind}\nmetadata: {{name: x}}\n");
        assert_eq!(
            parse_manifest(doc.as_bytes()).unwrap().to_value()["apiVersion"],
            "kubevirt.io/v1"
        );
    }
    let other = "apiVersion: instancetype.kubevirt.io/v1alpha3\nkind: VirtualMachineClusterInstancetype\nmetadata: {name: x}\n";
    assert!(parse_manifest(other.as_bytes()).is_err());
}
