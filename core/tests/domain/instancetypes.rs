//! Instancetypes and preferences: capture, conflicts, requirements, topology, expand.

use vmplane_core::instancetype::{self, expand};
use vmplane_core::types::{Instancetype, Manifest, Preference, VirtualMachine};
use vmplane_core::*;

use crate::support::*;

fn u1(size: &str) -> Instancetype {
    instancetype(CLUSTER_INSTANCETYPES, &format!("u1.{size}"))
}

fn cluster_pref(name: &str) -> Preference {
    preference(CLUSTER_PREFERENCES, name)
}

/// A VM referencing cluster instancetype `it` and cluster preference `pref`, with two volumes
/// and no disks or interfaces (defaults add them).
fn referencing(it: &str, pref: Option<&str>) -> VirtualMachine {
    let pref = pref
        .map(|p| format!("  preference: {{name: {p}}}\n"))
        .unwrap_or_default();
    vm_from(&format!(
        r##"
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {{name: example, namespace: default}}
spec:
  instancetype: {{name: {it}}}
{pref}  runStrategy: Halted
  template:
    spec:
      domain:
        devices: {{}}
      volumes:
      - name: containerdisk
        containerDisk: {{image: quay.io/containerdisks/fedora:latest}}
      - name: cloudinit
        cloudInitNoCloud: {{userData: "#cloud-config"}}
"##
    ))
}

fn put(vm: VirtualMachine, it: Option<Instancetype>, pref: Option<Preference>) -> VmCommand {
    VmCommand::Apply(Box::new(PutVm {
        instancetype: it,
        preference: pref,
        ..PutVm::new(vm)
    }))
}

#[test]
fn common_instancetypes_bundles_load_and_validate() {
    for m in load(CLUSTER_INSTANCETYPES)
        .iter()
        .chain(load(CLUSTER_PREFERENCES).iter())
    {
        let r = match m {
            Manifest::Instancetype(o) => validate::instancetype(o),
            Manifest::Preference(o) => validate::preference(o),
            _ => panic!("unexpected kind"),
        };
        assert!(r.is_ok(), "{}: {}", m.metadata().name_str(), r.unwrap_err());
    }
    assert_eq!(u1("medium").spec.cpu.guest, 1);
    assert_eq!(u1("medium").spec.memory.guest, "4Gi".parse().unwrap());
}

#[test]
fn u1_medium_with_fedora_expands_to_1_vcpu_4gi_virtio_disks_and_interfaces() {
    let mut s = Scenario::new();
    let d = s.ok(put(
        referencing("u1.medium", Some("fedora")),
        Some(u1("medium")),
        Some(cluster_pref("fedora")),
    ));
    assert_eq!(
        types_of(&d),
        [
            "VmCreated",
            "InstancetypeRevisionCaptured",
            "PreferenceRevisionCaptured"
        ]
    );
    let expanded = s.state().expand().unwrap();
    let spec = expanded.vmi_spec().unwrap();
    let cpu = spec.domain.cpu.as_ref().unwrap();
    assert_eq!(
        (cpu.sockets, cpu.cores, cpu.threads),
        (Some(1), Some(1), Some(1))
    );
    assert_eq!(cpu.vcpus(), Some(1));
    assert_eq!(
        spec.domain
            .memory
            .as_ref()
            .unwrap()
            .guest
            .as_ref()
            .unwrap()
            .to_string(),
        "4Gi"
    );
    let devices = spec.domain.devices.as_ref().unwrap();
    let disks = devices.disks.as_ref().unwrap();
    assert_eq!(disks.len(), 2);
    assert!(
        disks
            .iter()
            .all(|d| d.disk.as_ref().unwrap().bus.as_deref() == Some("virtio"))
    );
    let ifaces = devices.interfaces.as_ref().unwrap();
    assert_eq!(ifaces.len(), 1);
    assert_eq!(ifaces[0].model.as_deref(), Some("virtio"));
    assert_eq!(spec.architecture.as_deref(), Some("amd64"));
    assert!(devices.rng.is_some(), "preferredRng");
    assert!(spec.domain.features.as_ref().unwrap().contains_key("smm"));
    assert_eq!(
        spec.domain
            .firmware
            .as_ref()
            .unwrap()
            .bootloader
            .as_ref()
            .unwrap()["efi"]["secureBoot"],
        true
    );
    assert!(expanded.spec.instancetype.is_none() && expanded.spec.preference.is_none());
    // The effective firmware identity is part of the rendering.
    assert_eq!(
        spec.domain.firmware.as_ref().unwrap().uuid.as_deref(),
        Some(s.state().firmware.unwrap().uuid.to_string().as_str())
    );
    let ann = expanded
        .spec
        .template
        .as_ref()
        .unwrap()
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .as_ref()
        .unwrap();
    assert_eq!(ann["vm.kubevirt.io/os"], "linux");
}

#[test]
fn user_guide_vm_with_namespaced_cmedium_and_fedora_expands() {
    let f = "user-guide-snippets/instancetype-cmedium-preference-fedora-vm.yaml";
    let vm = load_vm(f);
    let it = load(f)
        .into_iter()
        .find_map(|m| {
            if let Manifest::Instancetype(o) = m {
                Some(*o)
            } else {
                None
            }
        })
        .unwrap();
    let pref = load(f)
        .into_iter()
        .find_map(|m| {
            if let Manifest::Preference(o) = m {
                Some(*o)
            } else {
                None
            }
        })
        .unwrap();
    // The matcher says `virtualMachineInstancetype`: kinds match case-insensitively.
    let mut s = Scenario::new();
    s.ok(put(vm, Some(it), Some(pref)));
    let e = s.state().expand().unwrap();
    let spec = e.vmi_spec().unwrap();
    assert_eq!(
        spec.domain
            .memory
            .as_ref()
            .unwrap()
            .guest
            .as_ref()
            .unwrap()
            .to_string(),
        "1Gi"
    );
    // Deprecated preferredUseEfi + preferredUseSecureBoot.
    assert_eq!(
        spec.domain
            .firmware
            .as_ref()
            .unwrap()
            .bootloader
            .as_ref()
            .unwrap()["efi"]["secureBoot"],
        true
    );
    assert!(spec.domain.features.as_ref().unwrap().contains_key("acpi"));
}

#[test]
fn memory_guest_with_an_instancetype_conflicts_with_kubevirts_message() {
    let vm = load_vm("examples/vm-cirros-csmall.yaml");
    let it = load("examples/csmall.yaml")
        .into_iter()
        .find_map(|m| {
            if let Manifest::Instancetype(o) = m {
                Some(*o)
            } else {
                None
            }
        })
        .unwrap();
    let r = assert_rejected(
        Scenario::new().when(put(vm, Some(it.clone()), None)),
        Category::Invalid,
        codes::INSTANCETYPE_CONFLICT,
    );
    // KubeVirt's message, as its webhook says it, once.
    assert_eq!(
        r.to_string(),
        "VM field(s) spec.template.spec.domain.memory.guest conflicts with selected instance type"
    );
    // The variant from before memory defaults is valid.
    let ok = load_vm("examples-2025-05-pre-memory-default/vm-cirros-csmall.yaml");
    assert!(Scenario::new().when(put(ok, Some(it), None)).is_ok());
}

#[test]
fn every_conflicting_field_is_named() {
    let mut vm = referencing("u1.medium", None);
    let d = &mut vm.vmi_spec_mut().domain;
    d.cpu_mut().sockets = Some(2);
    d.memory_mut().guest = Some("1Gi".parse().unwrap());
    let r = Scenario::new()
        .when(put(vm, Some(u1("medium")), None))
        .unwrap_err();
    assert_eq!(r.causes.len(), 1, "{r}");
    assert_eq!(
        r.causes[0].reason,
        "VM field(s) spec.template.spec.domain.cpu.sockets, spec.template.spec.domain.memory.guest conflicts with selected instance type"
    );
    let vm_fields = {
        let mut vm = referencing("u1.medium", None);
        let d = &mut vm.vmi_spec_mut().domain;
        d.cpu_mut().sockets = Some(2);
        d.memory_mut().guest = Some("1Gi".parse().unwrap());
        instancetype::conflicts(&vm, &u1("medium").spec)
    };
    assert_eq!(
        vm_fields,
        [
            "spec.template.spec.domain.cpu.sockets",
            "spec.template.spec.domain.memory.guest"
        ]
    );
}

#[test]
fn a_referenced_instancetype_that_was_not_loaded_is_not_found() {
    let r = assert_rejected(
        Scenario::new().when(put(referencing("u1.medium", None), None, None)),
        Category::NotFound,
        codes::INSTANCETYPE_NOT_FOUND,
    );
    assert_eq!(r.causes[0].field, "spec.instancetype.name");
    // A loaded object of another name does not count.
    assert_rejected(
        Scenario::new().when(put(referencing("u1.medium", None), Some(u1("large")), None)),
        Category::NotFound,
        codes::INSTANCETYPE_NOT_FOUND,
    );
}

#[test]
fn preference_memory_requirement_uses_kubevirts_message() {
    let r = Scenario::new()
        .when(put(
            referencing("u1.micro", Some("fedora")),
            Some(u1("micro")),
            Some(cluster_pref("fedora")),
        ))
        .unwrap_err();
    assert!(r.has_code(codes::PREFERENCE_REQUIREMENT));
    assert_eq!(r.causes[0].field, "spec.instancetype");
    assert_eq!(
        r.causes[0].reason,
        "failure checking preference requirements: insufficient Memory resources of 1Gi provided by instance type, preference requires 2Gi"
    );
}

#[test]
fn preference_cpu_requirement_without_instancetype_checks_the_vm_topology() {
    // windows.11 requires 2 vCPUs as sockets.
    let mut vm = small_vm("win", "Halted");
    vm.spec.preference = Some(types::Matcher {
        name: Some("windows.11".into()),
        ..Default::default()
    });
    vm.vmi_spec_mut().domain.cpu_mut().sockets = Some(1);
    vm.vmi_spec_mut().domain.memory_mut().guest = Some("8Gi".parse().unwrap());
    let cmd = |vm| {
        VmCommand::Apply(Box::new(PutVm {
            preference: Some(cluster_pref("windows.11")),
            ..PutVm::new(vm)
        }))
    };
    let r = Scenario::new().when(cmd(vm.clone())).unwrap_err();
    assert_eq!(r.causes[0].field, "spec.template.spec.domain.cpu.sockets");
    assert_eq!(
        r.causes[0].reason,
        "failure checking preference requirements: insufficient CPU resources of 1 vCPU provided by VirtualMachine, preference requires 2 vCPU provided as sockets"
    );
    vm.vmi_spec_mut().domain.cpu_mut().sockets = Some(2);
    assert!(Scenario::new().when(cmd(vm)).is_ok());
}

#[test]
fn preference_architecture_requirement_uses_kubevirts_message() {
    let mut vm = referencing("u1.medium", Some("fedora"));
    vm.vmi_spec_mut().architecture = Some("arm64".into());
    let r = Scenario::new()
        .when(put(vm, Some(u1("medium")), Some(cluster_pref("fedora"))))
        .unwrap_err();
    assert_eq!(r.causes[0].field, "spec.template.spec.architecture");
    assert_eq!(
        r.causes[0].reason,
        "failure checking preference requirements: preference requires architecture amd64 but arm64 is being requested"
    );
}

#[test]
fn preferences_fill_only_unset_fields() {
    let mut vm = referencing("u1.medium", Some("fedora"));
    let spec = vm.vmi_spec_mut();
    spec.domain.devices_mut().disks = Some(vec![types::Disk {
        name: "containerdisk".into(),
        disk: Some(types::DiskTarget {
            bus: Some("sata".into()),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    let e = expand(
        &vm,
        Some(&u1("medium").spec),
        Some(&cluster_pref("fedora").spec),
    )
    .unwrap();
    let disks = e
        .vmi_spec()
        .unwrap()
        .domain
        .devices
        .as_ref()
        .unwrap()
        .disks
        .clone()
        .unwrap();
    assert_eq!(
        disks[0].disk.as_ref().unwrap().bus.as_deref(),
        Some("sata"),
        "the VM's choice stays"
    );
    assert_eq!(
        disks[1].disk.as_ref().unwrap().bus.as_deref(),
        Some("virtio"),
        "the preference fills the rest"
    );
}

#[test]
fn cpu_topology_follows_the_preference() {
    let mut pref = cluster_pref("fedora").spec;
    let it = u1("2xlarge").spec; // 8 vCPUs
    let topo = |pref: &types::PreferenceSpec| {
        instancetype::cpu_topology(it.cpu.guest, Some(pref)).unwrap()
    };
    assert_eq!(topo(&pref), (8, 1, 1), "sockets by default");
    let cpu = pref.cpu.get_or_insert_with(Default::default);
    cpu.preferred_cpu_topology = Some("cores".into());
    assert_eq!(topo(&pref), (1, 8, 1));
    pref.cpu.as_mut().unwrap().preferred_cpu_topology = Some("threads".into());
    assert_eq!(topo(&pref), (1, 1, 8));
    pref.cpu.as_mut().unwrap().preferred_cpu_topology = Some("spread".into());
    assert_eq!(topo(&pref), (4, 2, 1), "spread: SocketsCores, ratio 2");
    pref.cpu.as_mut().unwrap().spread_options = Some(types::SpreadOptions {
        across: Some("CoresThreads".into()),
        ratio: Some(2),
        ..Default::default()
    });
    assert_eq!(topo(&pref), (1, 4, 2));
    pref.cpu.as_mut().unwrap().spread_options = Some(types::SpreadOptions {
        ratio: Some(3),
        ..Default::default()
    });
    assert!(
        instancetype::cpu_topology(8, Some(&pref))
            .unwrap_err()
            .contains("not divisible")
    );
}

#[test]
fn autoattach_input_device_from_preference_and_vm() {
    // windows.11 prefers an input device; sata disks and e1000e NICs.
    let vm = referencing("u1.large", Some("windows.11"));
    let e = expand(
        &vm,
        Some(&u1("large").spec),
        Some(&cluster_pref("windows.11").spec),
    )
    .unwrap();
    let devices = e.vmi_spec().unwrap().domain.devices.clone().unwrap();
    assert_eq!(devices.autoattach_input_device, Some(true));
    let inputs = devices.inputs.unwrap();
    assert_eq!(
        (
            inputs[0].name.as_str(),
            inputs[0].kind.as_deref(),
            inputs[0].bus.as_deref()
        ),
        ("default-0", Some("tablet"), Some("usb"))
    );
    assert_eq!(
        devices.interfaces.unwrap()[0].model.as_deref(),
        Some("e1000e")
    );
    assert!(devices.extra.contains_key("tpm"));
    // The VM's own `autoattachInputDevice: false` wins over the preference.
    let mut vm = referencing("u1.large", Some("windows.11"));
    vm.vmi_spec_mut()
        .domain
        .devices_mut()
        .autoattach_input_device = Some(false);
    let e = expand(
        &vm,
        Some(&u1("large").spec),
        Some(&cluster_pref("windows.11").spec),
    )
    .unwrap();
    assert!(
        e.vmi_spec()
            .unwrap()
            .domain
            .devices
            .as_ref()
            .unwrap()
            .inputs
            .is_none()
    );
    // And without any preference, `autoattachInputDevice: true` adds the default tablet.
    let mut vm = small_vm("plain", "Halted");
    vm.vmi_spec_mut()
        .domain
        .devices_mut()
        .autoattach_input_device = Some(true);
    let e = expand(&vm, None, None).unwrap();
    assert_eq!(
        e.vmi_spec()
            .unwrap()
            .domain
            .devices
            .as_ref()
            .unwrap()
            .inputs
            .as_ref()
            .unwrap()[0]
            .name,
        "default-0"
    );
}

#[test]
fn the_vm_moves_to_a_newer_revision_only_when_the_reference_changes() {
    let mut s = Scenario::new();
    let mut it_v1 = u1("medium");
    it_v1.metadata.generation = Some(1);
    s.ok(put(referencing("u1.medium", None), Some(it_v1), None));
    assert_eq!(
        s.state().instancetype.as_ref().unwrap().source_generation,
        1
    );
    // The instancetype changed (generation 2, 8Gi): re-applying the VM does not pick it up.
    let mut it_v2 = u1("medium");
    it_v2.metadata.generation = Some(2);
    it_v2.spec.memory.guest = "8Gi".parse().unwrap();
    let d = s.ok(put(referencing("u1.medium", None), Some(it_v2), None));
    assert_eq!(d.outcome, Outcome::Unchanged);
    let e = s.state().expand().unwrap();
    assert_eq!(
        e.vmi_spec()
            .unwrap()
            .domain
            .memory
            .as_ref()
            .unwrap()
            .guest
            .as_ref()
            .unwrap()
            .to_string(),
        "4Gi"
    );
    // The user points at another instancetype: captured now.
    let d = s.ok(put(referencing("u1.large", None), Some(u1("large")), None));
    assert_eq!(
        types_of(&d),
        ["VmSpecEdited", "InstancetypeRevisionCaptured"]
    );
    let e = s.state().expand().unwrap();
    assert_eq!(
        e.vmi_spec().unwrap().domain.cpu.as_ref().unwrap().vcpus(),
        Some(2)
    );
    // Dropping the reference drops the capture.
    let mut plain = referencing("u1.large", None);
    plain.spec.instancetype = None;
    plain.vmi_spec_mut().domain.memory_mut().guest = Some("1Gi".parse().unwrap());
    s.ok(put(plain, None, None));
    assert!(s.state().instancetype.is_none());
}

#[test]
fn the_gateway_is_told_which_references_to_load() {
    let mut s = Scenario::new();
    let vm = referencing("u1.medium", Some("fedora"));
    let needs = vm::needs(&s.state(), &vm);
    assert_eq!(
        needs.instancetype,
        Some((
            types::Kind::VirtualMachineClusterInstancetype,
            "u1.medium".into()
        ))
    );
    assert_eq!(
        needs.preference,
        Some((
            types::Kind::VirtualMachineClusterPreference,
            "fedora".into()
        ))
    );
    s.ok(put(
        vm.clone(),
        Some(u1("medium")),
        Some(cluster_pref("fedora")),
    ));
    assert_eq!(
        vm::needs(&s.state(), &vm),
        instancetype::References::default()
    );
    assert!(
        vm::needs(&s.state(), &referencing("u1.large", Some("fedora")))
            .instancetype
            .is_some()
    );
}

#[test]
fn overcommit_percent_sets_the_memory_request() {
    let o1 = instancetype(CLUSTER_INSTANCETYPES, "o1.medium");
    let e = expand(&referencing("o1.medium", None), Some(&o1.spec), None).unwrap();
    let req = e
        .vmi_spec()
        .unwrap()
        .domain
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap();
    assert_eq!(req["memory"], "2Gi");
}

#[test]
fn kubevirt_examples_with_instancetypes_conflict_now_and_were_valid_before_memory_defaults() {
    let it = |file: &str| {
        load(file)
            .into_iter()
            .find_map(|m| {
                if let Manifest::Instancetype(o) = m {
                    Some(*o)
                } else {
                    None
                }
            })
            .unwrap()
    };
    let pref = |file: &str| {
        load(file)
            .into_iter()
            .find_map(|m| {
                if let Manifest::Preference(o) = m {
                    Some(*o)
                } else {
                    None
                }
            })
            .unwrap()
    };
    let cases = [
        (
            "vm-cirros-csmall.yaml",
            Some(it("examples/csmall.yaml")),
            None,
        ),
        (
            "vm-windows-clarge-windows.yaml",
            Some(it("examples/clarge.yaml")),
            Some(pref("examples/windows.yaml")),
        ),
    ];
    for (file, it, pref) in cases {
        let current = load_vm(&format!("examples/{file}"));
        let r = Scenario::new().when(put(current, it.clone(), pref.clone()));
        assert_rejected(r, Category::Invalid, codes::INSTANCETYPE_CONFLICT);
        let before = load_vm(&format!("examples-2025-05-pre-memory-default/{file}"));
        let r = Scenario::new().when(put(before, it, pref));
        assert!(r.is_ok(), "{file}: {}", r.unwrap_err());
    }
}

#[test]
fn the_vmi_of_a_run_carries_the_expanded_spec() {
    let mut s = Scenario::new();
    let mut vm = referencing("u1.medium", Some("fedora"));
    vm.spec.run_strategy = Some("Always".into());
    s.ok(put(vm, Some(u1("medium")), Some(cluster_pref("fedora"))));
    s.ok(launch());
    let uid = s.state().run.vmi.as_ref().unwrap().uid;
    s.ok(VmCommand::ObserveVmi {
        vmi_uid: uid,
        observation: VmiObservation::Scheduled {
            node: "node-1".into(),
        },
    });
    let vmi = lifecycle::render_vmi(&s.state()).unwrap();
    assert_eq!(vmi.metadata.name.as_deref(), Some("example"));
    assert_eq!(
        vmi.spec
            .domain
            .memory
            .as_ref()
            .unwrap()
            .guest
            .as_ref()
            .unwrap()
            .to_string(),
        "4Gi"
    );
    assert_eq!(vmi.status.as_ref().unwrap()["nodeName"], "node-1");
    assert_eq!(vmi.status.as_ref().unwrap()["phase"], "Scheduled");
}

#[test]
fn a_vm_status_text_lists_kubevirts_keys_in_order_then_vmplanes() {
    let mut s = Scenario::new();
    s.ok(put(
        referencing("u1.medium", Some("fedora")),
        Some(u1("medium")),
        Some(cluster_pref("fedora")),
    ));
    s.ok(VmCommand::Start { paused: false });
    s.ok(launch());
    s.observe(event::VmiPhase::Failed);
    let uid = s.state().run.vmi.as_ref().expect("a VMI").uid;
    s.ok(VmCommand::ObserveVmi {
        vmi_uid: uid,
        observation: VmiObservation::Removed,
    });
    let (state, features, now) = (s.state(), Features::defaults(), s.ctx.now_ms());
    let typed = lifecycle::vm_status(&state, &features, now).expect("live");
    let text = serde_json::to_string(&typed).expect("serializes");
    let retry = state.run.backoff_until_ms.expect("a backoff");
    let uuid_origin = state.firmware.as_ref().expect("firmware").origin.as_str();
    assert_eq!(
        text,
        format!(
            concat!(
                r#"{{"printableStatus":"CrashLoopBackOff","ready":false,"created":false,"#,
                r#""runStrategy":"Always","conditions":[{{"type":"Ready","status":"False","#,
                r#""reason":"VMINotExists","message":"VMI does not exist"}},"#,
                r#"{{"type":"Failure","status":"True","reason":"CrashLoopBackOff","#,
                r#""message":"1 VMI(s) in a row ended before running; next start in {secs} s"}}],"#,
                r#""firmwareUUIDOrigin":"{origin}","#,
                r#""instancetypeRef":{{"name":"u1.medium","kind":"VirtualMachineClusterInstancetype","revision":0}},"#,
                r#""preferenceRef":{{"name":"fedora","kind":"VirtualMachineClusterPreference","revision":0}},"#,
                r#""desiredGeneration":2,"startFailure":{{"consecutiveFailCount":1,"#,
                r#""retryAfterTimestamp":"{retry_at}"}}}}"#
            ),
            secs = (retry - now) / 1000,
            origin = uuid_origin,
            retry_at = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(retry)
                .expect("in range")
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        )
    );
    // The tree the other renderings use is the same JSON, keys in the same order.
    let tree = lifecycle::render_status(&state, &features, now).expect("live");
    assert_eq!(tree.to_string(), text);
}

#[test]
fn the_expanded_vmi_spec_alone_is_the_expanded_vms_for_every_testdata_vm_and_matcher() {
    // `expand_vmi_spec` (what a VM's requested features are read from on every create) must
    // give exactly the template spec of `expand`'s VM, and refuse exactly what it refuses.
    let same = |vm: &VirtualMachine, it: Option<&Instancetype>, pref: Option<&Preference>| {
        let (it, pref) = (it.map(|i| &i.spec), pref.map(|p| &p.spec));
        match (
            instancetype::expand_vmi_spec(vm, it, pref),
            expand(vm, it, pref),
        ) {
            (Ok(spec), Ok(full)) => assert_eq!(Some(&spec), full.vmi_spec()),
            (Err(a), Err(b)) => assert_eq!(a, b),
            (a, b) => panic!("{:?} against {:?}", a.map(|_| ()), b.map(|_| ())),
        }
    };
    let mut vms = 0;
    for path in testdata_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        for m in types::parse_manifests(text.as_bytes()).unwrap() {
            if let Manifest::VirtualMachine(vm) = m {
                same(&vm, None, None);
                vms += 1;
            }
        }
    }
    assert!(vms >= 10, "{vms} VMs");
    let prefs = ["fedora", "windows.11", "rhel.9"].map(cluster_pref);
    for size in ["nano", "medium", "2xlarge"] {
        let it = u1(size);
        same(&referencing(&format!("u1.{size}"), None), Some(&it), None);
        for pref in &prefs {
            let vm = referencing(&format!("u1.{size}"), Some(pref.metadata.name_str()));
            same(&vm, Some(&it), Some(pref));
            // Refused alike: a matcher without its object.
            same(&vm, None, Some(pref));
            same(&vm, Some(&it), None);
        }
    }
}

/// The audit's case (D11): `u1.small` with sockets, cores and a memory request. The rejection
/// is one line naming every field once, KubeVirt's message (its `Conflicts.Error()`), not that
/// whole message once per field.
#[test]
fn several_conflicting_fields_make_one_clear_line_naming_each_once() {
    let mut vm = referencing("u1.small", None);
    let d = &mut vm.vmi_spec_mut().domain;
    d.cpu_mut().sockets = Some(2);
    d.cpu_mut().cores = Some(1);
    d.resources
        .get_or_insert_with(Default::default)
        .requests
        .get_or_insert_with(Default::default)
        .insert("memory".into(), "1Gi".into());
    let r = assert_rejected(
        Scenario::new().when(put(vm, Some(u1("small")), None)),
        Category::Invalid,
        codes::INSTANCETYPE_CONFLICT,
    );
    let fields = [
        "spec.template.spec.domain.resources.requests.memory",
        "spec.template.spec.domain.cpu.sockets",
        "spec.template.spec.domain.cpu.cores",
    ];
    assert_eq!(r.codes(), [codes::INSTANCETYPE_CONFLICT], "{r}");
    let line = r.to_string();
    for f in fields {
        assert_eq!(line.matches(f).count(), 1, "{f} once in: {line}");
    }
    assert_eq!(
        line,
        format!(
            "VM field(s) {} conflicts with selected instance type",
            fields.join(", ")
        )
    );
}

// ---------------------------------------------------------------------------------------------
// `revisionName` (kubevirt.md §2.3-2.4): vmplane names no revisions, it captures the referenced
// object at creation. A user-supplied `revisionName` is refused, not silently replaced by the
// current revision (audit: the VM got the current revision).

/// `referencing` with `revisionName`s on the matchers (`None`: no such key).
fn pinned(it: &str, it_rev: Option<&str>, pref: Option<(&str, Option<&str>)>) -> VirtualMachine {
    let mut vm = referencing(it, pref.map(|(p, _)| p));
    if let Some(m) = vm.spec.instancetype.as_mut() {
        m.revision_name = it_rev.map(str::to_owned);
    }
    if let (Some(m), Some((_, rev))) = (vm.spec.preference.as_mut(), pref) {
        m.revision_name = rev.map(str::to_owned);
    }
    vm
}

const REV_MEDIUM: &str = "example-u1.medium-v1beta1-0444161e-f8d6-4461-808d-5481dc4f3348-1";
const REV_FEDORA: &str = "example-fedora-v1beta1-77e5a0b6-2f9b-4c4b-9a4f-0f4f1a7c1f0e-1";

#[test]
fn a_revision_name_is_refused_at_its_path_and_nothing_is_appended() {
    let mut s = Scenario::new();
    let r = assert_rejected(
        s.when(put(
            pinned(
                "u1.medium",
                Some(REV_MEDIUM),
                Some(("fedora", Some(REV_FEDORA))),
            ),
            Some(u1("medium")),
            Some(cluster_pref("fedora")),
        )),
        Category::Invalid,
        codes::UNSUPPORTED,
    );
    let fields: Vec<&str> = r.causes.iter().map(|c| c.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.instancetype.revisionName",
            "spec.preference.revisionName"
        ],
        "{r}"
    );
    assert_eq!(
        r.causes[0].reason,
        "revisionName is not supported by vmplane: vmplane captures the revision at creation, \
         see status.instancetypeRef.revision; remove revisionName to use the object's current revision"
    );
    assert!(
        r.causes[1]
            .reason
            .contains("see status.preferenceRef.revision"),
        "{r}"
    );
    assert!(s.events.is_empty(), "nothing appended");
}

#[test]
fn a_revision_name_is_refused_on_an_update_too_and_an_empty_one_is_none() {
    let mut s = Scenario::new();
    // Empty is unset (as KubeVirt reads it).
    s.ok(put(
        pinned("u1.medium", Some(""), Some(("fedora", Some("")))),
        Some(u1("medium")),
        Some(cluster_pref("fedora")),
    ));
    let before = s.state();
    let r = assert_rejected(
        s.when(put(
            pinned("u1.medium", Some(REV_MEDIUM), Some(("fedora", None))),
            None,
            None,
        )),
        Category::Invalid,
        codes::UNSUPPORTED,
    );
    assert_eq!(r.causes.len(), 1, "{r}");
    assert_eq!(r.causes[0].field, "spec.instancetype.revisionName");
    assert_eq!(s.state(), before, "nothing appended");
}

/// A VM stored with a `revisionName` before vmplane refused them (its `VmCreated` carries it).
fn stored_with_revision_name() -> Scenario {
    let mut fresh = Scenario::new();
    let d = fresh.ok(put(
        pinned("u1.medium", None, None),
        Some(u1("medium")),
        None,
    ));
    let mut events = d.events.clone();
    let Some(Event::VmCreated(created)) = events.first_mut() else {
        panic!("a creation first: {:?}", types_of(&d));
    };
    let mut manifest: serde_json::Value = serde_json::from_str(&created.manifest_json).unwrap();
    manifest["spec"]["instancetype"]["revisionName"] = REV_MEDIUM.into();
    created.manifest_json = manifest.to_string();
    Scenario::given(events)
}

#[test]
fn a_vm_stored_with_a_revision_name_is_reapplied_without_it() {
    let mut s = stored_with_revision_name();
    assert_eq!(
        s.state()
            .vm
            .as_deref()
            .and_then(|vm| vm.spec.instancetype.as_ref())
            .and_then(|m| m.revision_name.clone())
            .as_deref(),
        Some(REV_MEDIUM)
    );
    // Its manifest as stored is refused (the revisionName) ...
    let r = assert_rejected(
        s.when(put(pinned("u1.medium", Some(REV_MEDIUM), None), None, None)),
        Category::Invalid,
        codes::UNSUPPORTED,
    );
    assert_eq!(r.causes[0].field, "spec.instancetype.revisionName");
    // ... and renaming the matcher keeping it says both rules at the same path (KubeVirt's
    // "Matcher Name has been updated without updating the RevisionName" too).
    let r = s
        .when(put(
            pinned("u1.large", Some(REV_MEDIUM), None),
            Some(u1("large")),
            None,
        ))
        .unwrap_err();
    let reasons: Vec<&str> = r.causes.iter().map(|c| c.reason.as_str()).collect();
    assert!(
        reasons.contains(&"the Matcher Name has been updated without updating the RevisionName"),
        "{r}"
    );
    assert!(
        r.causes
            .iter()
            .all(|c| c.field == "spec.instancetype.revisionName"),
        "{r}"
    );
    // Without it, the edit is taken: the captured revision stays.
    let d = s.ok(put(pinned("u1.medium", None, None), None, None));
    assert_eq!(types_of(&d), ["VmSpecEdited"]);
}
