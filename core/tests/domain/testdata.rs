//! The real KubeVirt manifests parse and round-trip without loss.

use serde::Deserialize;
use serde_json::Value;
use vmplane_core::types::{Kind, Manifest, ParseError, parse_manifest, parse_manifests};

use crate::support::*;

#[test]
fn every_testdata_yaml_parses_and_round_trips_without_loss() {
    let files = testdata_files();
    assert!(
        files.len() >= 40,
        "found only {} YAML files under {:?}",
        files.len(),
        testdata_dir()
    );
    let mut documents = 0;
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let manifests =
            parse_manifests(text.as_bytes()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // The reference: each document read straight into a JSON value.
        let originals: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
            .map(|d| Value::deserialize(d).unwrap())
            .filter(|v| !v.is_null())
            .collect();
        assert_eq!(manifests.len(), originals.len(), "{}", path.display());
        for (m, original) in manifests.iter().zip(&originals) {
            let back = m.to_value();
            assert_eq!(
                &back,
                original,
                "{} ({} {}) lost data",
                path.display(),
                m.kind(),
                m.metadata().name_str()
            );
            // Typed again from the written form: stable.
            let again = Manifest::from_value(back.clone()).unwrap();
            assert_eq!(again.to_value(), back);
        }
        documents += manifests.len();
    }
    assert!(documents >= 150, "{documents} documents");
}

#[test]
fn every_testdata_document_sent_as_json_reads_as_its_yaml_does() {
    // A gRPC client sends one JSON object per request; `parse_manifest` reads small ones
    // straight into their type. Whatever it reads must be what the YAML gives.
    let mut documents = 0;
    for path in testdata_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        let manifests = parse_manifests(text.as_bytes()).unwrap();
        for (i, from_yaml) in manifests.iter().enumerate() {
            let value = from_yaml.to_value();
            for json in [
                serde_json::to_string(&value).unwrap(),
                serde_json::to_string_pretty(&value).unwrap(),
            ] {
                let from_json = parse_manifest(json.as_bytes())
                    .unwrap_or_else(|e| panic!("{} #{i}: {e}", path.display()));
                assert_eq!(&from_json, from_yaml, "{} #{i}", path.display());
            }
            documents += 1;
        }
    }
    assert!(documents >= 150, "{documents} documents");
}

#[test]
fn kinds_in_testdata_are_dispatched() {
    let it = load(CLUSTER_INSTANCETYPES);
    assert_eq!(it.len(), 65);
    assert!(
        it.iter()
            .all(|m| m.kind() == Kind::VirtualMachineClusterInstancetype)
    );
    let prefs = load(CLUSTER_PREFERENCES);
    assert_eq!(prefs.len(), 54);
    assert!(
        prefs
            .iter()
            .all(|m| m.kind() == Kind::VirtualMachineClusterPreference)
    );
    assert_eq!(
        load("user-guide-snippets/vmsnapshot-snap-larry.yaml")[0].kind(),
        Kind::VirtualMachineSnapshot
    );
    assert_eq!(
        load("user-guide-snippets/vmrestore-restore-larry.yaml")[0].kind(),
        Kind::VirtualMachineRestore
    );
    assert_eq!(
        load("user-guide-snippets/vmclone-testclone-filters.yaml")[0].kind(),
        Kind::VirtualMachineClone
    );
    assert_eq!(
        load("examples/vm-pool-cirros.yaml")[0].kind(),
        Kind::VirtualMachinePool
    );
    let mixed = load("user-guide-snippets/instancetype-cmedium-preference-fedora-vm.yaml");
    let kinds: Vec<Kind> = mixed.iter().map(Manifest::kind).collect();
    assert_eq!(
        kinds,
        [
            Kind::VirtualMachineInstancetype,
            Kind::VirtualMachinePreference,
            Kind::VirtualMachine
        ]
    );
}

#[test]
fn unknown_fields_and_their_order_are_kept() {
    let yaml = br#"
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: keep
  zeta: 1
  alpha: 2
spec:
  runStrategy: Halted
  futureField: {b: 1, a: 2}
  template:
    spec:
      domain:
        devices: {}
        somethingNew: [3, 2, 1]
"#;
    let m = parse_manifest(yaml).unwrap();
    let text = serde_json::to_string(&m.to_value()).unwrap();
    assert!(text.contains(r#""zeta":1,"alpha":2"#), "{text}");
    assert!(text.contains(r#""futureField":{"b":1,"a":2}"#), "{text}");
    assert!(text.contains(r#""somethingNew":[3,2,1]"#), "{text}");
}

#[test]
fn unknown_kind_is_a_clear_error() {
    let e = parse_manifest(b"apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n").unwrap_err();
    assert_eq!(
        e,
        ParseError::UnknownKind {
            document: 0,
            api_version: "v1".into(),
            kind: "Pod".into()
        }
    );
    assert!(
        e.to_string()
            .contains(r#"no kind "Pod" is registered for version "v1""#)
    );
    let e = parse_manifest(b"kind: VirtualMachine\n").unwrap_err();
    assert!(matches!(
        e,
        ParseError::Missing {
            field: "apiVersion",
            ..
        }
    ));
}

#[test]
fn a_bad_quantity_names_its_field_path() {
    let yaml = br#"
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: bad}
spec:
  runStrategy: Halted
  template:
    spec:
      domain:
        memory: {guest: 2Gx}
"#;
    let e = parse_manifest(yaml).unwrap_err();
    assert_eq!(e.field(), "spec.template.spec.domain.memory.guest");
    assert!(e.to_string().contains(r#""2Gx" is not a quantity"#), "{e}");
    let r: vmplane_core::Rejection = e.into();
    assert!(r.has_code(vmplane_core::codes::BAD_QUANTITY));
}

#[test]
fn json_input_and_multi_document_yaml_both_parse() {
    let json = br#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"j"},"spec":{"runStrategy":"Halted"}}"#;
    assert_eq!(parse_manifest(json).unwrap().kind(), Kind::VirtualMachine);
    let yaml = b"---\napiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: kubevirt, namespace: kubevirt}\nspec: {}\n---\n---\napiVersion: snapshot.kubevirt.io/v1beta1\nkind: VirtualMachineSnapshot\nmetadata: {name: s}\nspec: {source: {kind: VirtualMachine, name: x}}\n";
    let all = parse_manifests(yaml).unwrap();
    assert_eq!(
        all.iter().map(Manifest::kind).collect::<Vec<_>>(),
        [Kind::KubeVirt, Kind::VirtualMachineSnapshot]
    );
}

#[test]
fn kubectl_names_map_to_kinds() {
    for (name, kind) in [
        ("vm", Kind::VirtualMachine),
        ("VMs", Kind::VirtualMachine),
        ("virtualmachines", Kind::VirtualMachine),
        ("vmi", Kind::VirtualMachineInstance),
        ("vmis", Kind::VirtualMachineInstance),
        ("instancetype", Kind::VirtualMachineInstancetype),
        (
            "clusterinstancetypes",
            Kind::VirtualMachineClusterInstancetype,
        ),
        ("preference", Kind::VirtualMachinePreference),
        ("clusterpreference", Kind::VirtualMachineClusterPreference),
        ("snapshot", Kind::VirtualMachineSnapshot),
        ("restore", Kind::VirtualMachineRestore),
        ("clone", Kind::VirtualMachineClone),
        ("kubevirt", Kind::KubeVirt),
        ("vmirs", Kind::VirtualMachineInstanceReplicaSet),
    ] {
        assert_eq!(Kind::from_cli_name(name), Some(kind), "{name}");
    }
    assert_eq!(Kind::from_cli_name("pods"), None);
}
