//! Real KubeVirt manifests (`shared/testdata/kubevirt`, loaded as they are): every document
//! vmplane manages is created, or rejected exactly where the test data says KubeVirt rejects it;
//! what comes back keeps every field it was given; a second apply changes nothing; instancetypes
//! and preferences expand; `import` keeps KubeVirt's legacy firmware UUID.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;
use vmplane_gateway::pb::{LogInfoRequest, admin_client::AdminClient};
use vmplane_tests::{Cli, Server, kubevirt_testdata, one_error_line};

/// Files whose VM sets `spec.template.spec.domain.memory.guest` while selecting an instance
/// type: KubeVirt rejects them (SOURCES.txt, pkg/instancetype/apply/memory.go), and so does
/// vmplane, with KubeVirt's message.
const CONFLICTS_WITH_INSTANCETYPE: &[&str] = &[
    "examples/vm-cirros-clarge-virtio.yaml",
    "examples/vm-cirros-clarge-windows.yaml",
    "examples/vm-cirros-clarge.yaml",
    "examples/vm-cirros-cluster-csmall.yaml",
    "examples/vm-cirros-csmall.yaml",
    "examples/vm-windows-clarge-windows.yaml",
];

/// The user guide's clone snippet with a placeholder MAC (`interfaceName: "00-11-22"`): `apply`
/// of a VirtualMachineClone runs core's clone admission (`newMacAddresses` must be MACs), which
/// refuses it with the field and the value.
const MALFORMED_CLONE_MAC: &str = "user-guide-snippets/vmclone-testclone-filters.yaml";

/// Kinds vmplane parses but does not manage: applying them is refused, naming the kind.
const NOT_MANAGED: &[&str] = &[
    "VirtualMachineInstanceMigration",
    "VirtualMachinePool",
    "VirtualMachineInstanceReplicaSet",
];

/// The positive variant that shares its explicit firmware UUID with examples/vmi-windows.yaml.
const WINDOWS_VM_2025: &str = "examples-2025-05-pre-memory-default/vm-windows-clarge-windows.yaml";

/// What applying one file must do.
#[derive(Debug, Clone, PartialEq)]
enum Expect {
    /// Every document created (or, on a second apply, unchanged).
    Applied,
    /// Refused: the one error line contains each of these.
    Rejected(Vec<&'static str>),
}

/// One document of a file: (kind, name, the document).
fn documents(path: &Path) -> Vec<(String, String, Value)> {
    let text = std::fs::read_to_string(path).expect("read test data");
    let mut out = Vec::new();
    for de in serde_yaml::Deserializer::from_str(&text) {
        let doc = Value::deserialize(de).expect("valid YAML");
        if doc.is_null() {
            continue;
        }
        let kind = doc["kind"].as_str().expect("kind").to_string();
        let name = doc["metadata"]["name"].as_str().expect("name").to_string();
        out.push((kind, name, doc));
    }
    out
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .expect("inside the test data")
        .to_str()
        .expect("utf-8")
        .to_string()
}

fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("read_dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

/// Instancetypes and preferences first (VMs refer to them), then VMs, then the rest.
fn apply_order(kind: &str) -> u8 {
    if kind.contains("Instancetype") || kind.contains("Preference") {
        0
    } else if kind == "VirtualMachine" {
        1
    } else {
        2
    }
}

fn expectation(rel: &str, docs: &[(String, String, Value)]) -> Expect {
    if CONFLICTS_WITH_INSTANCETYPE.contains(&rel) {
        assert_eq!(docs.len(), 1, "{rel}");
        return Expect::Rejected(vec![
            "invalid:",
            "spec.template.spec.domain.memory.guest",
            "conflicts with selected instance type",
        ]);
    }
    if rel == MALFORMED_CLONE_MAC {
        return Expect::Rejected(vec![
            "invalid:",
            "spec.newMacAddresses.interfaceName",
            "malformed MAC address (00-11-22)",
        ]);
    }
    if let Some((kind, _, _)) = docs
        .iter()
        .find(|(k, _, _)| NOT_MANAGED.contains(&k.as_str()))
    {
        assert_eq!(docs.len(), 1, "{rel}");
        let kind = NOT_MANAGED
            .iter()
            .find(|k| **k == kind)
            .expect("listed kind");
        return Expect::Rejected(vec!["invalid:", kind, "not managed by vmplane"]);
    }
    Expect::Applied
}

/// Applies `file` in `ns`; checks the outcome against `expect` (`outcome` for applied files).
fn check_apply(vmplane: &Cli, root: &Path, file: &Path, ns: &str, expect: &Expect, outcome: &str) {
    let rel = relative(root, file);
    let (code, out, err) = vmplane.run(&["apply", "-f", file.to_str().expect("utf-8"), "-n", ns]);
    match expect {
        Expect::Applied => {
            assert_eq!(code, 0, "{rel} must apply\nstdout:\n{out}\nstderr:\n{err}");
            let want: Vec<String> = documents(file)
                .iter()
                .map(|(kind, name, _)| format!("{}/{name} {outcome}", kind.to_ascii_lowercase()))
                .collect();
            let got: Vec<&str> = out.lines().collect();
            assert_eq!(got, want, "{rel}: one line per object, in file order");
            assert!(err.is_empty(), "{rel}: nothing on stderr: {err}");
        }
        Expect::Rejected(parts) => {
            assert_ne!(code, 0, "{rel} must be rejected\nstdout:\n{out}");
            assert!(out.is_empty(), "{rel}: nothing applied: {out}");
            let line = one_error_line(&err);
            for part in parts {
                assert!(line.contains(part), "{rel}: {part:?} missing from {line}");
            }
        }
    }
}

/// Every field of `given` is in `got` with the same value (`null` means absent, as in
/// Kubernetes). `got` may hold more: what vmplane decided, status, metadata.
fn assert_keeps(given: &Value, got: &Value, path: &str, what: &str) {
    match given {
        Value::Null => {}
        Value::Object(fields) => {
            let Some(got_fields) = got.as_object() else {
                panic!("{what}: {path} is {got}, expected an object");
            };
            for (key, value) in fields {
                if value.is_null() {
                    continue;
                }
                let at = format!("{path}.{key}");
                let Some(got_value) = got_fields.get(key) else {
                    panic!("{what}: {at} was dropped (given {value})");
                };
                assert_keeps(value, got_value, &at, what);
            }
        }
        Value::Array(items) => {
            let Some(got_items) = got.as_array() else {
                panic!("{what}: {path} is {got}, expected an array");
            };
            assert_eq!(
                items.len(),
                got_items.len(),
                "{what}: {path} has a different length"
            );
            for (i, (a, b)) in items.iter().zip(got_items).enumerate() {
                assert_keeps(a, b, &format!("{path}[{i}]"), what);
            }
        }
        scalar => assert_eq!(scalar, got, "{what}: {path} changed"),
    }
}

/// `get KIND -n NS -o json` (a List), indexed by name.
fn listed(vmplane: &Cli, kind: &str, ns: &str) -> std::collections::BTreeMap<String, Value> {
    let out = vmplane.ok(&["get", kind, "-n", ns, "-o", "json"]);
    let list: Value = serde_json::from_str(&out).expect("a JSON list");
    assert_eq!(list["kind"], "List");
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|o| {
            (
                o["metadata"]["name"].as_str().expect("name").to_string(),
                o.clone(),
            )
        })
        .collect()
}

fn log_head(server: &Server) -> u64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut admin = AdminClient::connect(server.url.clone())
            .await
            .expect("connect");
        admin
            .log_info(LogInfoRequest {})
            .await
            .expect("log info")
            .into_inner()
            .head_position
    })
}

/// Checks that each (kind, name, document) applied in `ns` comes back with every given field.
fn check_round_trip(vmplane: &Cli, rel: &str, ns: &str, docs: &[(String, String, Value)]) {
    let mut by_kind: std::collections::BTreeMap<&str, Vec<&(String, String, Value)>> =
        Default::default();
    for doc in docs {
        by_kind.entry(doc.0.as_str()).or_default().push(doc);
    }
    for (kind, docs) in by_kind {
        let stored = listed(vmplane, &kind.to_ascii_lowercase(), ns);
        for (kind, name, given) in docs {
            let what = format!("{rel}: {kind}/{name}");
            let got = stored
                .get(name)
                .unwrap_or_else(|| panic!("{what} is not listed"));
            assert_eq!(got["kind"], kind.as_str(), "{what}");
            assert_keeps(given, got, "", &what);
            let generation = got["metadata"]["generation"].as_u64();
            assert_eq!(generation, Some(1), "{what}: a new object is generation 1");
            let rv = got["metadata"]["resourceVersion"].as_str().unwrap_or("");
            assert!(
                rv.parse::<u64>().is_ok_and(|p| p > 0),
                "{what}: resourceVersion is a decimal position: {rv:?}"
            );
        }
    }
}

#[test]
fn every_kubevirt_manifest_is_created_or_rejected_where_the_test_data_says() {
    let root = kubevirt_testdata();
    assert!(
        root.join("SOURCES.txt").exists(),
        "test data not found at {}",
        root.display()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    // The control plane alone: without a reconciler, the log changes only when this test asks
    // (so "a second apply appends nothing" is exact), and the KubeVirt examples' VMs and VMIs
    // are not launched.
    let server = Server::start(&dir.path().join("data"), &["--hypervisor", "none"]);
    let vmplane = Cli::new(&server);

    // The plan: (file, namespace). Cluster bundles, then examples/ (ordered so that references
    // resolve), the user guide's snippets (each in its own namespace: some share names), and
    // the pre-memory-default variants with the instance types and preferences they refer to.
    let mut plan: Vec<(std::path::PathBuf, String)> = Vec::new();
    for f in files_under(&root.join("common-instancetypes")) {
        plan.push((f, "kv".into()));
    }
    let mut examples = files_under(&root.join("examples"));
    examples.sort_by_key(|f| {
        let kind = documents(f)[0].0.clone();
        (apply_order(&kind), f.clone())
    });
    for f in examples {
        plan.push((f, "kv".into()));
    }
    for f in files_under(&root.join("user-guide-snippets")) {
        let stem = f.file_stem().expect("stem").to_str().expect("utf-8");
        let ns = format!("ug-{stem}");
        plan.push((f, ns));
    }
    for support in ["csmall.yaml", "clarge.yaml", "windows.yaml"] {
        plan.push((root.join("examples").join(support), "kv-2025".into()));
    }
    for f in files_under(&root.join("examples-2025-05-pre-memory-default")) {
        if relative(&root, &f) != WINDOWS_VM_2025 {
            plan.push((f, "kv-2025".into()));
        }
    }
    // Every YAML file of the test data is in the plan.
    for sub in [
        "common-instancetypes",
        "examples",
        "user-guide-snippets",
        "examples-2025-05-pre-memory-default",
    ] {
        for f in files_under(&root.join(sub)) {
            let rel = relative(&root, &f);
            assert!(
                rel == WINDOWS_VM_2025 || plan.iter().any(|(p, _)| *p == f),
                "{rel} is not covered"
            );
        }
    }
    assert!(
        files_under(&root).is_empty(),
        "no YAML at the top of the test data"
    );
    let bundle_objects: usize = files_under(&root.join("common-instancetypes"))
        .iter()
        .map(|f| documents(f).len())
        .sum();
    assert_eq!(
        bundle_objects,
        65 + 54,
        "SOURCES.txt: 65 instancetypes, 54 preferences"
    );

    // Apply everything once: created or rejected as the test data says.
    let mut applied = 0usize;
    for (file, ns) in &plan {
        let rel = relative(&root, file);
        let docs = documents(file);
        let expect = expectation(&rel, &docs);
        check_apply(&vmplane, &root, file, ns, &expect, "created");
        if expect == Expect::Applied {
            applied += docs.len();
            check_round_trip(&vmplane, &rel, ns, &docs);
        }
    }
    assert!(
        applied > bundle_objects + 20,
        "only {applied} objects applied"
    );

    // A second apply of everything changes nothing and appends nothing.
    let head = log_head(&server);
    for (file, ns) in &plan {
        let rel = relative(&root, file);
        let expect = expectation(&rel, &documents(file));
        check_apply(&vmplane, &root, file, ns, &expect, "unchanged");
    }
    assert_eq!(log_head(&server), head, "a second apply appended events");

    // The Windows VM of the pre-memory-default variants carries the explicit firmware UUID
    // that examples/vmi-windows.yaml also carries: one live machine per firmware UUID, so it
    // is refused while that VMI exists, naming the holder, and accepted once it is gone.
    let windows_vm = root.join(WINDOWS_VM_2025);
    let windows = windows_vm.to_str().expect("utf-8");
    let line = vmplane.fails(&["apply", "-f", windows, "-n", "kv-2025"]);
    assert!(
        line.contains("already exists") && line.contains("vmi/kv/vmi-windows"),
        "{line}"
    );
    assert!(
        line.contains("spec.template.spec.domain.firmware.uuid"),
        "{line}"
    );
    assert_eq!(log_head(&server), head, "a refused apply appended events");
    vmplane.ok(&["delete", "vmi", "vmi-windows", "-n", "kv"]);
    check_apply(
        &vmplane,
        &root,
        &windows_vm,
        "kv-2025",
        &Expect::Applied,
        "created",
    );
    check_round_trip(
        &vmplane,
        WINDOWS_VM_2025,
        "kv-2025",
        &documents(&windows_vm),
    );

    // A VM using the common instance type u1.medium and preference fedora (cluster bundles,
    // applied above) expands to 1 vCPU and 4Gi.
    let vm = dir.path().join("u1-medium-fedora.yaml");
    std::fs::write(
        &vm,
        "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: u1-medium-fedora
spec:
  instancetype:
    kind: VirtualMachineClusterInstancetype
    name: u1.medium
  preference:
    kind: VirtualMachineClusterPreference
    name: fedora
  runStrategy: Halted
  template:
    spec:
      domain:
        devices: {}
      volumes:
      - name: containerdisk
        containerDisk:
          image: quay.io/containerdisks/fedora:latest
",
    )
    .expect("write VM");
    let vm = vm.to_str().expect("utf-8");
    assert_eq!(
        vmplane.ok(&["apply", "-f", vm, "-n", "kv-expand"]),
        "virtualmachine/u1-medium-fedora created\n"
    );
    let stored = vmplane.ok(&[
        "expand",
        "vm",
        "u1-medium-fedora",
        "-n",
        "kv-expand",
        "-o",
        "json",
    ]);
    let from_file = vmplane.ok(&["expand", "-f", vm, "-n", "kv-expand", "-o", "json"]);
    for (what, text) in [("expand vm", stored), ("expand -f", from_file)] {
        let v: Value = serde_json::from_str(&text).expect("JSON");
        let domain = &v["spec"]["template"]["spec"]["domain"];
        let vcpus: u64 = ["sockets", "cores", "threads"]
            .iter()
            .map(|k| domain["cpu"][k].as_u64().unwrap_or(1))
            .product();
        assert_eq!(vcpus, 1, "{what}: u1.medium has 1 vCPU: {}", domain["cpu"]);
        assert_eq!(
            domain["memory"]["guest"], "4Gi",
            "{what}: u1.medium has 4Gi"
        );
        assert!(
            v["spec"].get("instancetype").is_none(),
            "{what}: the expanded VM no longer refers to an instance type"
        );
    }
}

#[test]
fn import_keeps_kubevirts_legacy_firmware_uuid() {
    let server = crate::shared_server();
    let vmplane = Cli::new(server);
    let manifest = "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: testvm
spec:
  runStrategy: Halted
  template:
    spec:
      domain:
        devices: {}
        memory:
          guest: 128Mi
";
    // Imported: KubeVirt's legacy, name-derived UUID.
    let (code, out, err) =
        vmplane.run_with_stdin(&["import", "-f", "-", "-n", "manifests-import"], manifest);
    assert_eq!(
        (code, out.as_str()),
        (0, "virtualmachine/testvm created\n"),
        "{err}"
    );
    let vm: Value = serde_json::from_str(&vmplane.ok(&[
        "get",
        "vm",
        "testvm",
        "-n",
        "manifests-import",
        "-o",
        "json",
    ]))
    .expect("JSON");
    assert_eq!(
        vm["spec"]["template"]["spec"]["domain"]["firmware"]["uuid"],
        "5a9fc181-957e-5c32-9e5a-2de5e9673531"
    );
    assert_eq!(vm["status"]["firmwareUUIDOrigin"], "Legacy");

    // Applied (not imported): a new UUID, not the legacy one.
    let (code, _, err) =
        vmplane.run_with_stdin(&["apply", "-f", "-", "-n", "manifests-apply"], manifest);
    assert_eq!(code, 0, "{err}");
    let vm: Value = serde_json::from_str(&vmplane.ok(&[
        "get",
        "vm",
        "testvm",
        "-n",
        "manifests-apply",
        "-o",
        "json",
    ]))
    .expect("JSON");
    assert_eq!(vm["status"]["firmwareUUIDOrigin"], "Generated");
    assert_ne!(
        vm["spec"]["template"]["spec"]["domain"]["firmware"]["uuid"],
        "5a9fc181-957e-5c32-9e5a-2de5e9673531"
    );
}

#[test]
fn fields_vmplane_does_not_interpret_come_back_as_they_were_given() {
    let vmplane = Cli::new(crate::shared_server());
    let manifest = r#"{
  "apiVersion": "kubevirt.io/v1",
  "kind": "VirtualMachine",
  "metadata": {"name": "future", "annotations": {"example.com/note": "kept"}},
  "spec": {
    "runStrategy": "Halted",
    "someFutureField": {"nested": [1, "two", {"three": true}]},
    "template": {
      "spec": {
        "domain": {"devices": {"futureDevice": {"x": 1}}, "memory": {"guest": "128Mi"}},
        "futureSchedulingHint": "spread"
      }
    }
  }
}"#;
    let (code, _, err) =
        vmplane.run_with_stdin(&["apply", "-f", "-", "-n", "manifests-unknown"], manifest);
    assert_eq!(code, 0, "{err}");
    let given: Value = serde_json::from_str(manifest).expect("JSON");
    for format in ["json", "yaml"] {
        let out = vmplane.ok(&[
            "get",
            "vm",
            "future",
            "-n",
            "manifests-unknown",
            "-o",
            format,
        ]);
        let got: Value = serde_yaml::from_str(&out).expect("YAML or JSON");
        assert_keeps(&given, &got, "", &format!("-o {format}"));
    }
    // Applying the same document again is not a change.
    let (code, out, err) =
        vmplane.run_with_stdin(&["apply", "-f", "-", "-n", "manifests-unknown"], manifest);
    assert_eq!(
        (code, out.as_str()),
        (0, "virtualmachine/future unchanged\n"),
        "{err}"
    );
}
