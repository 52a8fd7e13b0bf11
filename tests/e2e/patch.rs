//! `patch`, `label` and `annotate`: read-modify-writes that never lose a change made since
//! their read (the apply is conditional on the resourceVersion read).

use serde_json::Value;
use vmplane_gateway::pb::{self, objects_client::ObjectsClient};
use vmplane_tests::{Cli, repo_root};

use crate::{channel, rt, shared_server};

fn vm_json(vmplane: &Cli, ns: &str) -> Value {
    let out = vmplane.ok(&["get", "vm", "demo", "-n", ns, "-o", "json"]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}):\n{out}"))
}

fn events(vmplane: &Cli, ns: &str) -> usize {
    let out = vmplane.ok(&["audit", "-n", ns, "-o", "json"]);
    serde_json::from_str::<Value>(&out)
        .expect("audit JSON")
        .as_array()
        .expect("a list")
        .len()
}

#[test]
fn patch_merges_or_applies_json_patches_and_says_when_nothing_changed() {
    let vmplane = Cli::new(shared_server());
    let ns = "patch-vm";
    let vm = repo_root().join("examples/vm.yaml");
    vmplane.ok(&["apply", "-f", vm.to_str().expect("utf-8"), "-n", ns]);
    let patch = |args: &[&str]| {
        let mut all = vec!["patch", "vm", "demo", "-n", ns];
        all.extend_from_slice(args);
        vmplane.ok(&all)
    };
    assert_eq!(
        patch(&["-p", r#"{"spec":{"runStrategy":"Halted"}}"#]),
        "virtualmachine/demo patched\n"
    );
    let v = vm_json(&vmplane, ns);
    assert_eq!(v["spec"]["runStrategy"], "Halted");
    assert_eq!(v["metadata"]["generation"], 2);
    // The same again: written through apply, which changes nothing.
    let before = events(&vmplane, ns);
    assert_eq!(
        patch(&["-p", "spec: {runStrategy: Halted}"]),
        "virtualmachine/demo patched (no change)\n"
    );
    assert_eq!(events(&vmplane, ns), before, "nothing appended");
    // A JSON patch, and a dry run of one that changes nothing stored.
    assert_eq!(
        patch(&[
            "--type",
            "json",
            "-p",
            r#"[{"op":"replace","path":"/spec/template/spec/domain/memory/guest","value":"512Mi"}]"#
        ]),
        "virtualmachine/demo patched\n"
    );
    assert_eq!(
        vm_json(&vmplane, ns)["spec"]["template"]["spec"]["domain"]["memory"]["guest"],
        "512Mi"
    );
    assert_eq!(
        patch(&["--dry-run", "-p", r#"{"spec":{"runStrategy":"Manual"}}"#]),
        "virtualmachine/demo patched (dry run)\n"
    );
    assert_eq!(vm_json(&vmplane, ns)["spec"]["runStrategy"], "Halted");
    // -o name and -o json print the object, as apply does.
    assert_eq!(
        patch(&[
            "-o",
            "name",
            "-p",
            r#"{"metadata":{"labels":{"app":"web"}}}"#
        ]),
        "virtualmachine/demo\n"
    );
    // Refusals: one line naming what is wrong; nothing written.
    let before = events(&vmplane, ns);
    let line = vmplane.fails(&[
        "patch",
        "vm",
        "demo",
        "-n",
        ns,
        "--type",
        "json",
        "-p",
        r#"[{"op":"remove","path":"/spec/nothing"}]"#,
    ]);
    assert!(
        line.contains("vm demo") && line.contains("/spec/nothing"),
        "{line}"
    );
    let line = vmplane.fails(&["patch", "vm", "demo", "-n", ns, "-p", "[1]"]);
    assert!(line.contains("a merge patch is an object"), "{line}");
    let line = vmplane.fails(&[
        "patch",
        "vm",
        "demo",
        "-n",
        ns,
        "-p",
        r#"{"spec":{"runStrategy":"Sometimes"}}"#,
    ]);
    assert!(line.contains("spec.runStrategy"), "{line}");
    let line = vmplane.fails(&["patch", "vm", "nothere", "-n", ns, "-p", "{}"]);
    assert!(line.contains("not found"), "{line}");
    assert_eq!(
        events(&vmplane, ns),
        before,
        "a refused patch appends nothing"
    );
}

#[test]
fn label_and_annotate_set_and_remove_keys_and_keep_values_unless_told_to_overwrite() {
    let vmplane = Cli::new(shared_server());
    let ns = "patch-labels";
    let vm = repo_root().join("examples/vm.yaml");
    vmplane.ok(&["apply", "-f", vm.to_str().expect("utf-8"), "-n", ns]);
    let labels = || vm_json(&vmplane, ns)["metadata"]["labels"].clone();
    assert_eq!(
        vmplane.ok(&["label", "vm", "demo", "-n", ns, "env=prod", "tier=web"]),
        "virtualmachine/demo labeled\n"
    );
    assert_eq!(
        labels(),
        serde_json::json!({"app": "demo", "env": "prod", "tier": "web"})
    );
    // The selector sees it at once.
    assert_eq!(
        vmplane.ok(&["get", "vms", "-n", ns, "-l", "env=prod", "-o", "name"]),
        "virtualmachine/demo\n"
    );
    let line = vmplane.fails(&["label", "vm", "demo", "-n", ns, "env=staging"]);
    assert!(
        line.contains("metadata.labels.env already has a value (\"prod\")")
            && line.contains("--overwrite"),
        "{line}"
    );
    vmplane.ok(&[
        "label",
        "vm",
        "demo",
        "-n",
        ns,
        "env=staging",
        "--overwrite",
    ]);
    vmplane.ok(&["label", "vm", "demo", "-n", ns, "tier-"]);
    assert_eq!(
        labels(),
        serde_json::json!({"app": "demo", "env": "staging"})
    );
    // Removing a label that is not there says so and changes nothing.
    let (code, out, err) = vmplane.run(&["label", "vm", "demo", "-n", ns, "tier-"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "virtualmachine/demo labeled (no change)\n");
    assert_eq!(err, "label \"tier\" not found.\n");
    // Malformed changes are refused before anything is read.
    let line = vmplane.fails(&["label", "vm", "demo", "-n", ns, "tier"]);
    assert!(line.contains("KEY=VALUE"), "{line}");
    let line = vmplane.fails(&["label", "vm", "demo", "-n", ns, "tier=-web"]);
    assert!(line.contains("label tier: value \"-web\""), "{line}");
    // Annotations take any value.
    assert_eq!(
        vmplane.ok(&[
            "annotate",
            "vm",
            "demo",
            "-n",
            ns,
            "description=the demo VM, v2"
        ]),
        "virtualmachine/demo annotated\n"
    );
    let v = vm_json(&vmplane, ns);
    assert_eq!(
        v["metadata"]["annotations"]["description"],
        "the demo VM, v2"
    );
    vmplane.ok(&["annotate", "vm", "demo", "-n", ns, "description-"]);
    assert!(
        vm_json(&vmplane, ns)["metadata"]["annotations"]
            .get("description")
            .is_none()
    );
    // Each change is in the VM's history, by its actor.
    let history = vmplane.ok(&["history", "vm", "demo", "-n", ns, "-o", "json"]);
    let revisions: Value = serde_json::from_str(&history).expect("history JSON");
    assert!(revisions.as_array().expect("list").len() >= 5, "{history}");
}

#[test]
fn an_apply_conditional_on_a_stale_resource_version_is_aborted_and_appends_nothing() {
    let vmplane = Cli::new(shared_server());
    let ns = "patch-stale";
    let vm = repo_root().join("examples/vm.yaml");
    vmplane.ok(&["apply", "-f", vm.to_str().expect("utf-8"), "-n", ns]);
    let read = vm_json(&vmplane, ns);
    let read_version: u64 = read["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .parse()
        .expect("a position");
    // Someone else changes the labels since: the resourceVersion moves.
    vmplane.ok(&["label", "vm", "demo", "-n", ns, "owner=bob"]);
    let before = events(&vmplane, ns);
    let mut edited = read.clone();
    edited["metadata"]["labels"]["owner"] = "alice".into();
    let apply = |expected: u64, dry_run: bool| {
        rt().block_on(async {
            ObjectsClient::new(channel(shared_server()).await)
                .apply(pb::ApplyRequest {
                    manifest: edited.to_string(),
                    namespace: ns.into(),
                    expected_resource_version: Some(expected),
                    dry_run,
                    ..Default::default()
                })
                .await
        })
    };
    for dry_run in [true, false] {
        let status = apply(read_version, dry_run).expect_err("stale");
        assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
        assert!(
            status.message().contains("metadata.resourceVersion")
                && status
                    .message()
                    .contains(&format!("expected resourceVersion {read_version}")),
            "{}",
            status.message()
        );
    }
    assert_eq!(events(&vmplane, ns), before, "nothing appended");
    assert_eq!(vm_json(&vmplane, ns)["metadata"]["labels"]["owner"], "bob");
    // Conditional on the current version, it is written.
    let now: u64 = vm_json(&vmplane, ns)["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .parse()
        .expect("a position");
    apply(now, false).expect("current version");
    assert_eq!(
        vm_json(&vmplane, ns)["metadata"]["labels"]["owner"],
        "alice"
    );
    // 0: only if the object does not exist.
    let status = apply(0, false).expect_err("it exists");
    assert_eq!(status.code(), tonic::Code::Aborted);
}

#[test]
fn concurrent_labels_on_one_object_all_land() {
    let vmplane = Cli::new(shared_server());
    let ns = "patch-concurrent";
    let vm = repo_root().join("examples/vm.yaml");
    vmplane.ok(&["apply", "-f", vm.to_str().expect("utf-8"), "-n", ns]);
    // Four writers read the same version and race; a loser reads again and writes again.
    let keys = ["k0", "k1", "k2", "k3"];
    let children: Vec<_> = keys
        .iter()
        .map(|key| {
            let change = format!("{key}=v");
            vmplane.spawn(&["label", "vm", "demo", "-n", ns, &change])
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().expect("label");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let labels = vm_json(&vmplane, ns)["metadata"]["labels"].clone();
    for key in keys {
        assert_eq!(labels[key], "v", "label {key} was lost: {labels}");
    }
}
