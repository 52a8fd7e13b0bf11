//! The unknown-field table ([`vmplane_core::schema`]) against real KubeVirt manifests: not one
//! warning on any manifest of the shared test data (KubeVirt's generated examples, the
//! common-instancetypes bundles, the user guide's snippets), and the one-pass check of a JSON
//! text against the walk of its tree. Its cost: `cargo bench -p vmplane-benches --bench
//! unknown_fields`.

use std::path::{Path, PathBuf};

use vmplane_core::schema::{self, unknown_fields};
use vmplane_core::types::{Kind, parse_documents};

#[path = "../../tests/testdata_dir.rs"]
mod testdata_dir;

/// Manifests of the test data that really carry a field KubeVirt does not know: (file relative
/// to the test data, the field's path, why). None so far.
const KNOWN_MISSPELLINGS: &[(&str, &str, &str)] = &[];

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir)
        .expect("the test data directory")
        .flatten()
    {
        let path = entry.path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            out.push(path);
        }
    }
}

#[test]
fn no_real_kubevirt_manifest_gets_a_warning() {
    let dir = testdata_dir::kubevirt_testdata();
    let mut files = Vec::new();
    yaml_files(&dir, &mut files);
    files.sort();
    assert!(
        files.len() >= 40,
        "the test data is there: {}",
        dir.display()
    );
    let mut documents = 0;
    let mut unexpected = Vec::new();
    for file in &files {
        let rel = file
            .strip_prefix(&dir)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let bytes = std::fs::read(file).unwrap();
        for doc in parse_documents(&bytes).unwrap_or_else(|e| panic!("{rel}: {e}")) {
            documents += 1;
            let api_version = doc["apiVersion"].as_str().unwrap_or_default();
            let kind = doc["kind"].as_str().unwrap_or_default();
            let kind = schema::kind_of(api_version, kind)
                .unwrap_or_else(|| panic!("{rel}: {api_version} {kind} is not a known kind"));
            for path in unknown_fields(kind, &doc) {
                if !KNOWN_MISSPELLINGS
                    .iter()
                    .any(|(f, p, _)| *f == rel && *p == path)
                {
                    unexpected.push(format!("{rel}: {path}"));
                }
            }
            assert_eq!(schema::deprecated_api_version(api_version), None, "{rel}");
            // The walk reaches the domain of every VM and VMI: one misspelling there is named.
            let domain = match kind {
                Kind::VirtualMachine => "/spec/template/spec/domain",
                Kind::VirtualMachineInstance => "/spec/domain",
                _ => continue,
            };
            let mut misspelled = doc.clone();
            misspelled.pointer_mut(domain).unwrap()["devices"]["disk"] = serde_json::json!([]);
            let want = format!("{}.devices.disk", domain[1..].replace('/', "."));
            assert!(
                unknown_fields(kind, &misspelled).contains(&want),
                "{rel}: {want}"
            );
        }
    }
    // Every document of the bundles is read: 65 instance types, 54 preferences, the rest.
    assert!(documents > 150, "{documents} documents");
    assert!(
        unexpected.is_empty(),
        "false warnings:\n{}",
        unexpected.join("\n")
    );
}

/// A typical VM as the CLI sends it: a containerDisk, cloud-init, a masquerade interface.
const TYPICAL_VM: &str = r##"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine",
"metadata":{"name":"testvm","namespace":"default","labels":{"app":"web","kubevirt.io/os":"fedora"}},
"spec":{"runStrategy":"Always","template":{"metadata":{"labels":{"kubevirt.io/domain":"testvm"}},
"spec":{"terminationGracePeriodSeconds":30,"domain":{"cpu":{"cores":2,"sockets":1,"threads":1},
"memory":{"guest":"2Gi"},"resources":{"requests":{"memory":"2Gi"}},
"firmware":{"bootloader":{"efi":{"secureBoot":false}}},
"devices":{"disks":[{"name":"containerdisk","disk":{"bus":"virtio"}},
{"name":"cloudinitdisk","disk":{"bus":"virtio"}}],
"interfaces":[{"name":"default","masquerade":{}}],"rng":{}}},
"networks":[{"name":"default","pod":{}}],
"volumes":[{"name":"containerdisk","containerDisk":{"image":"quay.io/containerdisks/fedora:40"}},
{"name":"cloudinitdisk","cloudInitNoCloud":{"userData":"#cloud-config\npassword: fedora\n"}}]}}}}"##;

/// The one-pass check of a JSON text (the apply path's) answers what the walk of the parsed
/// document answers, for every corpus manifest as JSON, with and without a planted misspelling,
/// whatever the order of its keys; it declines (`None`) only a text it cannot read in one pass.
#[test]
fn the_check_of_a_json_text_answers_what_the_walk_of_its_tree_answers() {
    let dir = testdata_dir::kubevirt_testdata();
    let mut files = Vec::new();
    yaml_files(&dir, &mut files);
    let mut texts = vec![TYPICAL_VM.to_owned()];
    for file in &files {
        let bytes = std::fs::read(file).unwrap();
        for mut doc in parse_documents(&bytes).unwrap() {
            texts.push(doc.to_string());
            if let Some(spec) = doc.get_mut("spec").and_then(|s| s.as_object_mut()) {
                spec.insert("bogus".into(), serde_json::json!({"x": [1, {"y": 2}]}));
            }
            if let Some(meta) = doc.get_mut("metadata").and_then(|s| s.as_object_mut()) {
                meta.insert("lables".into(), serde_json::json!({"a": "b"}));
            }
            if let Some(top) = doc.as_object_mut() {
                top.insert("extra".into(), serde_json::json!(1));
            }
            texts.push(doc.to_string());
        }
    }
    // apiVersion after kind, and a deprecated version: still one pass.
    let kind_first = TYPICAL_VM.replacen(
        r#""apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","#,
        r#""kind":"VirtualMachine","apiVersion":"kubevirt.io/v1alpha3","#,
        1,
    );
    texts.push(kind_first.replace(r#""memory":{"guest""#, r#""memory":{"gest""#));
    let mut planted = 0;
    for text in &texts {
        let tree = &parse_documents(text.as_bytes()).unwrap()[0];
        let want = schema::warnings(tree);
        let got = schema::warnings_of_json(text).unwrap_or_else(|| panic!("one pass: {text}"));
        assert_eq!(got, want, "{text}");
        planted += usize::from(want.iter().any(|w| w.contains("spec.bogus")));
    }
    assert!(planted > 100, "{planted} planted misspellings found");
    let last = schema::warnings_of_json(texts.last().unwrap()).unwrap();
    assert_eq!(
        last,
        [
            "kubevirt.io/v1alpha3 is now deprecated and will be removed in a future release.",
            r#"unknown field "spec.template.spec.domain.memory.gest""#,
        ]
    );
    // A spec before its kind cannot be walked in one pass: declined, not answered wrong.
    let spec_first = r#"{"spec":{"bogus":1},"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"a"}}"#;
    assert_eq!(schema::warnings_of_json(spec_first), None);
    assert_eq!(
        schema::warnings(&parse_documents(spec_first.as_bytes()).unwrap()[0]),
        [r#"unknown field "spec.bogus""#]
    );
    // YAML is not read here.
    assert_eq!(schema::warnings_of_json("apiVersion: v1\n"), None);
}
