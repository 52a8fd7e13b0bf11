//! Errors: one clear line on stderr (`vmplane: error: ...`) naming the object, the field and the
//! reason; a non-zero exit; the right gRPC code; and nothing appended to the log on rejection.

use serde_json::Value;
use tonic::Code;
use vmplane_gateway::pb::{self, objects_client::ObjectsClient};
use vmplane_tests::{Cli, one_error_line, repo_root};

use crate::{channel, rt, shared_server};

fn example(name: &str) -> String {
    std::fs::read_to_string(repo_root().join("examples").join(name)).expect("read example")
}

/// examples/vm.yaml renamed, with `replace` applied to its text.
fn vm_manifest(name: &str, replace: &[(&str, &str)]) -> String {
    let mut text = example("vm.yaml").replace("name: demo", &format!("name: {name}"));
    for (from, to) in replace {
        assert!(text.contains(from), "{from:?} not in examples/vm.yaml");
        text = text.replace(from, to);
    }
    text
}

/// The audit entries of one namespace (every event appended for its objects).
fn audit(vmplane: &Cli, ns: &str) -> Vec<Value> {
    let out = vmplane.ok(&["audit", "-n", ns, "-o", "json"]);
    serde_json::from_str::<Value>(&out)
        .expect("audit JSON")
        .as_array()
        .expect("a list")
        .clone()
}

fn apply_stdin(vmplane: &Cli, manifest: &str, extra: &[&str]) -> (i32, String, String) {
    let mut args = vec!["apply", "-f", "-"];
    args.extend_from_slice(extra);
    vmplane.run_with_stdin(&args, manifest)
}

/// The gRPC status of applying `manifest` in `ns`.
fn grpc_apply(manifest: &str, ns: &str, expected_generation: Option<u64>) -> tonic::Status {
    let server = shared_server();
    rt().block_on(async {
        ObjectsClient::new(channel(server).await)
            .apply(pb::ApplyRequest {
                manifest: manifest.to_string(),
                namespace: ns.to_string(),
                expected_generation,
                ..Default::default()
            })
            .await
            .expect_err("the apply must be refused")
    })
}

/// The stable reason codes a refusal carries in its metadata, for programs.
fn reasons(status: &tonic::Status) -> Option<&str> {
    status
        .metadata()
        .get("vmplane-reasons")
        .and_then(|v| v.to_str().ok())
}

#[test]
fn a_bad_quantity_names_the_object_and_field_in_one_line_and_appends_nothing() {
    let vmplane = Cli::new(shared_server());
    let ns = "errors-quantity";
    let bad = vm_manifest("badq", &[("guest: 256Mi", "guest: 2Gx")]);
    let (code, out, err) = apply_stdin(&vmplane, &bad, &["-n", ns]);
    assert_ne!(code, 0);
    assert!(out.is_empty(), "{out}");
    let line = one_error_line(&err);
    for part in [
        "invalid:",
        "VirtualMachine errors-quantity/badq",
        "spec.template.spec.domain.memory.guest",
        "2Gx",
    ] {
        assert!(line.contains(part), "{part:?} missing from {line}");
    }
    let status = grpc_apply(&bad, ns, None);
    assert_eq!(
        status.code(),
        Code::InvalidArgument,
        "InvalidArgument on the wire"
    );
    assert_eq!(reasons(&status), Some("QUANTITY_INVALID"));
    assert!(
        audit(&vmplane, ns).is_empty(),
        "a rejection appended events"
    );
    let line = vmplane.fails(&["get", "vm", "badq", "-n", ns]);
    assert!(line.contains("not found"), "{line}");

    // Several bad documents: a line for each, then the count.
    let two = format!(
        "{bad}\n---\n{}",
        vm_manifest("badr", &[("runStrategy: Manual", "runStrategy: Sometimes")])
    );
    let (code, _, err) = apply_stdin(&vmplane, &two, &["-n", ns]);
    assert_ne!(code, 0);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert!(
        lines.iter().all(|l| l.starts_with("vmplane: error: ")),
        "{err}"
    );
    assert!(
        lines[0].contains("badq") && lines[1].contains("badr"),
        "{err}"
    );
    assert!(lines[1].contains("spec.runStrategy"), "{err}");
    assert!(lines[2].contains("2 of 2 objects not applied"), "{err}");
    assert!(
        audit(&vmplane, ns).is_empty(),
        "a rejection appended events"
    );
}

#[test]
fn a_stale_expected_generation_is_a_conflict_naming_the_actual_generation() {
    let vmplane = Cli::new(shared_server());
    let ns = "errors-conflict";
    let vm = example("vm.yaml");
    let bigger = example("vm-bigger.yaml");
    assert_eq!(
        apply_stdin(&vmplane, &vm, &["-n", ns]).1,
        "virtualmachine/demo created\n"
    );
    let (code, out, err) =
        apply_stdin(&vmplane, &bigger, &["-n", ns, "--expected-generation", "1"]);
    assert_eq!(
        (code, out.as_str()),
        (0, "virtualmachine/demo configured\n"),
        "{err}"
    );
    let before = audit(&vmplane, ns).len();

    let (code, _, err) = apply_stdin(&vmplane, &vm, &["-n", ns, "--expected-generation", "1"]);
    assert_ne!(code, 0);
    let line = one_error_line(&err);
    for part in [
        "conflict:",
        "VirtualMachine errors-conflict/demo",
        "expected generation 1",
        "actual 2",
    ] {
        assert!(line.contains(part), "{part:?} missing from {line}");
    }
    let status = grpc_apply(&vm, ns, Some(1));
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(
        status
            .metadata()
            .get("vmplane-actual-generation")
            .and_then(|v| v.to_str().ok()),
        Some("2"),
        "the actual generation travels in a trailer"
    );
    let line = vmplane.fails(&[
        "delete",
        "vm",
        "demo",
        "-n",
        ns,
        "--expected-generation",
        "1",
    ]);
    assert!(
        line.contains("conflict:") && line.contains("actual 2"),
        "{line}"
    );
    assert_eq!(
        audit(&vmplane, ns).len(),
        before,
        "a conflict appended events"
    );
    let current: Value =
        serde_json::from_str(&vmplane.ok(&["get", "vm", "demo", "-n", ns, "-o", "json"]))
            .expect("JSON");
    assert_eq!(
        current["spec"]["template"]["spec"]["domain"]["cpu"]["cores"],
        2
    );
}

#[test]
fn a_firmware_uuid_held_by_another_vm_is_refused_naming_the_holder() {
    let vmplane = Cli::new(shared_server());
    let (ns_a, ns_b) = ("errors-uuid-a", "errors-uuid-b");
    apply_stdin(&vmplane, &example("vm.yaml"), &["-n", ns_a]);
    let holder: Value =
        serde_json::from_str(&vmplane.ok(&["get", "vm", "demo", "-n", ns_a, "-o", "json"]))
            .expect("JSON");
    let uuid = holder["spec"]["template"]["spec"]["domain"]["firmware"]["uuid"]
        .as_str()
        .expect("a firmware UUID")
        .to_string();
    let dup = vm_manifest(
        "dup",
        &[(
            "      domain:\n",
            &format!("      domain:\n        firmware:\n          uuid: {uuid}\n"),
        )],
    );
    let (code, _, err) = apply_stdin(&vmplane, &dup, &["-n", ns_b]);
    assert_ne!(code, 0);
    let line = one_error_line(&err);
    for part in [
        "already exists:",
        "VirtualMachine errors-uuid-b/dup",
        "spec.template.spec.domain.firmware.uuid",
        uuid.as_str(),
        "vm/errors-uuid-a/demo",
    ] {
        assert!(line.contains(part), "{part:?} missing from {line}");
    }
    assert_eq!(grpc_apply(&dup, ns_b, None).code(), Code::AlreadyExists);
    assert!(
        audit(&vmplane, ns_b).is_empty(),
        "a rejection appended events"
    );

    // Once the holder is deleted, the UUID is free.
    assert_eq!(
        vmplane.ok(&["delete", "vm", "demo", "-n", ns_a]),
        "virtualmachine/demo deleted\n"
    );
    let (code, out, err) = apply_stdin(&vmplane, &dup, &["-n", ns_b]);
    assert_eq!(
        (code, out.as_str()),
        (0, "virtualmachine/dup created\n"),
        "{err}"
    );
    let vm: Value =
        serde_json::from_str(&vmplane.ok(&["get", "vm", "dup", "-n", ns_b, "-o", "json"]))
            .expect("JSON");
    assert_eq!(vm["status"]["firmwareUUIDOrigin"], "UserSpecified");
}

#[test]
fn dry_run_validates_on_the_server_and_changes_nothing() {
    let vmplane = Cli::new(shared_server());
    let ns = "errors-dry-run";
    let (code, out, err) = apply_stdin(&vmplane, &example("vm.yaml"), &["-n", ns, "--dry-run"]);
    assert_eq!(
        (code, out.as_str()),
        (0, "virtualmachine/demo created (dry run)\n"),
        "{err}"
    );
    assert!(audit(&vmplane, ns).is_empty(), "a dry run appended events");
    let line = vmplane.fails(&["get", "vm", "demo", "-n", ns]);
    assert!(line.contains("not found"), "{line}");
    // A dry run is validated like the real thing.
    let bad = vm_manifest("demo", &[("guest: 256Mi", "guest: 2Gx")]);
    let (code, _, err) = apply_stdin(&vmplane, &bad, &["-n", ns, "--dry-run"]);
    assert_ne!(code, 0);
    assert!(one_error_line(&err).contains("spec.template.spec.domain.memory.guest"));

    apply_stdin(&vmplane, &example("vm.yaml"), &["-n", ns]);
    let before = audit(&vmplane, ns);
    let (code, out, err) = apply_stdin(
        &vmplane,
        &example("vm-bigger.yaml"),
        &["-n", ns, "--dry-run"],
    );
    assert_eq!(
        (code, out.as_str()),
        (0, "virtualmachine/demo configured (dry run)\n"),
        "{err}"
    );
    assert_eq!(audit(&vmplane, ns), before, "a dry run appended events");
    let vm: Value =
        serde_json::from_str(&vmplane.ok(&["get", "vm", "demo", "-n", ns, "-o", "json"]))
            .expect("JSON");
    assert_eq!(vm["metadata"]["generation"], 1);
    assert_eq!(vm["spec"]["template"]["spec"]["domain"]["cpu"]["cores"], 1);
}

#[test]
fn an_unknown_kind_is_refused_listing_the_known_ones() {
    let vmplane = Cli::new(shared_server());
    let line = vmplane.fails(&["get", "gadgets"]);
    assert!(
        line.contains("\"gadgets\"") && line.contains("vm, vmi"),
        "{line}"
    );
    let line = vmplane.fails(&["delete", "gadget", "x"]);
    assert!(line.contains("\"gadget\""), "{line}");
    let manifest = "apiVersion: kubevirt.io/v1\nkind: Gadget\nmetadata:\n  name: x\n";
    let (code, _, err) = apply_stdin(&vmplane, manifest, &["-n", "errors-kind"]);
    assert_ne!(code, 0);
    let line = one_error_line(&err);
    assert!(
        line.contains("invalid:") && line.contains("Gadget"),
        "{line}"
    );
    assert_eq!(
        grpc_apply(manifest, "errors-kind", None).code(),
        Code::InvalidArgument
    );
    // Documents are counted from 1, whichever side found the problem: the server (an unknown
    // kind in the second document) or the client (a syntax error in the second).
    let two = format!("{}---\n{manifest}", vm_manifest("kind-ok", &[]));
    let (code, _, err) = apply_stdin(&vmplane, &two, &["-n", "errors-kind"]);
    assert_ne!(code, 0);
    let line = one_error_line(&err);
    assert!(
        line.contains("document 2:") && line.contains("Gadget"),
        "{line}"
    );
    let broken = format!("{}---\nkind: [\n", vm_manifest("kind-ok2", &[]));
    let (code, _, err) = apply_stdin(&vmplane, &broken, &["-n", "errors-kind"]);
    assert_ne!(code, 0);
    assert!(one_error_line(&err).contains("document 2:"), "{err}");
}

#[test]
fn an_unreadable_file_is_named_with_its_cause_said_once() {
    let vmplane = Cli::new(shared_server());
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("absent.yaml");
    let path = missing.to_str().expect("utf-8 path");
    let line = vmplane.fails(&["apply", "-f", path]);
    assert!(line.contains(&format!("-f {path}: cannot read")), "{line}");
    assert_eq!(
        line.matches("No such file or directory").count(),
        1,
        "the cause once: {line}"
    );
}

#[test]
fn an_unreachable_server_is_named_with_what_to_do() {
    // A port nobody listens on: bind one, then let it go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let vmplane = Cli::at(&url);
    for args in [
        &["get", "vms"][..],
        &["audit"],
        &["watch"],
        &["start", "demo"],
    ] {
        let line = vmplane.fails(args);
        assert!(
            line.contains(&format!("cannot reach the vmplane server at {url}")),
            "{args:?}: {line}"
        );
        assert!(
            line.contains("--server") && line.contains("VMPLANE_SERVER"),
            "says what to do: {line}"
        );
    }
}

#[test]
fn an_oversized_manifest_is_refused_as_too_large() {
    let vmplane = Cli::new(shared_server());
    let ns = "errors-size";
    let limit = 1024 * 1024; // core's MANIFEST_BYTES_MAX
    // Just above the manifest limit (within the request limit): core refuses it.
    // Far above it: the server refuses the request before decoding it.
    for (name, padding) in [("big", limit + 1000), ("huge", 3 * limit)] {
        let manifest = vm_manifest(
            name,
            &[(
                "    app: demo\nspec:",
                &format!(
                    "    app: demo\n    padding: \"{}\"\nspec:",
                    "x".repeat(padding)
                ),
            )],
        );
        let (code, _, err) = apply_stdin(&vmplane, &manifest, &["-n", ns]);
        assert_ne!(code, 0);
        let line = one_error_line(&err);
        // Either size: the object, the size and the limit named (far above the request
        // limit the CLI refuses it without sending; the server could only say "too long").
        assert!(
            line.starts_with("vmplane: error: too large: ")
                && line.contains(&format!("VirtualMachine {ns}/{name}"))
                && line.contains(&limit.to_string()),
            "{name}: {line}"
        );
        // Through gRPC too: ResourceExhausted at either size (over the request limit, tonic's
        // own answer is OutOfRange), naming the limit; over the request limit, what to do.
        let json = serde_json::to_string(&serde_yaml::from_str::<Value>(&manifest).expect("YAML"))
            .expect("JSON");
        let status = grpc_apply(&json, ns, None);
        assert_eq!(status.code(), Code::ResourceExhausted, "{name}: {status:?}");
        let message = status.message();
        match name {
            "big" => assert!(message.contains(&limit.to_string()), "{message}"),
            _ => assert!(
                message.contains("more than the") && message.contains("split"),
                "{message}"
            ),
        }
    }
    assert!(
        audit(&vmplane, ns).is_empty(),
        "a rejection appended events"
    );
}

#[test]
fn a_missing_object_is_not_found_naming_it_once() {
    let vmplane = Cli::new(shared_server());
    let ns = "errors-missing";
    let line = vmplane.fails(&["get", "vm", "ghost", "-n", ns]);
    assert!(
        line.contains("not found") && line.contains("VirtualMachine errors-missing/ghost"),
        "{line}"
    );
    for args in [
        &["start", "ghost", "-n", ns][..],
        &["history", "vm", "ghost", "-n", ns],
        &["expand", "vm", "ghost", "-n", ns],
        &["delete", "vm", "ghost", "-n", ns],
        &["stop", "ghost", "-n", ns],
        &["delete", "vmi", "ghost", "-n", ns],
        &["delete", "instancetype", "ghost", "-n", ns],
    ] {
        let line = vmplane.fails(args);
        assert!(line.contains("ghost"), "{args:?}: {line}");
        // The reason names the object too, not an empty name (`"" not found`).
        assert!(!line.contains("\"\""), "{args:?}: {line}");
        // Once: not `VirtualMachine ns/ghost: VirtualMachine ns/ghost not found`.
        assert!(
            line.matches("errors-missing/ghost").count() <= 1,
            "{args:?}: {line}"
        );
    }
    let line = vmplane.fails(&["delete", "vm", "ghost", "-n", ns]);
    assert!(
        line.contains("virtualmachines.kubevirt.io \"ghost\" not found"),
        "{line}"
    );
    apply_stdin(&vmplane, &example("vm.yaml"), &["-n", ns]);
    let line = vmplane.fails(&["get", "vm", "demo", "-n", ns, "--revision", "7"]);
    assert!(
        line.contains("not found") && line.contains("revision 7"),
        "{line}"
    );
}

#[test]
fn a_bad_time_names_the_flag_the_user_typed() {
    let vmplane = Cli::new(shared_server());
    let ns = "errors-time";
    // Not the request's field (`as_of`); a usage error, refused before anything is sent.
    for (args, flag) in [
        (
            &["get", "vm", "demo", "-n", ns, "--as-of", "yesterday"][..],
            "--as-of",
        ),
        (&["audit", "-n", ns, "--since", "yesterday"], "--since"),
        (&["audit", "-n", ns, "--until", "yesterday"], "--until"),
    ] {
        let (code, _, err) = vmplane.run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        let line = one_error_line(&err);
        assert!(
            line.contains(flag)
                && line.contains("yesterday")
                && line.contains("RFC 3339")
                && !line.contains("as_of")
                && !line.contains("since:"),
            "{line}"
        );
    }
}

#[test]
fn a_usage_error_is_one_line_with_the_usage() {
    for args in [
        &["get"][..],
        &["get", "vms", "--bogus"],
        &["get", "vms", "-o", "xml"],
        &["frob"],
    ] {
        let (code, out, err) = vmplane_tests::run_cli(args);
        assert_eq!((code, out.as_str()), (2, ""), "{args:?}: {err}");
        let line = one_error_line(&err);
        assert!(
            line.contains("usage: vmplane") || line.contains("see --help"),
            "{args:?}: {line}"
        );
    }
    // Help itself is not an error.
    let (code, out, _) = vmplane_tests::run_cli(&["get", "--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("Examples:"), "{out}");
}

#[test]
fn a_name_across_all_namespaces_is_refused_as_a_usage_error() {
    let (code, out, err) = vmplane_tests::run_cli(&["get", "vm", "demo", "-A"]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    let line = one_error_line(&err);
    assert!(
        line.contains("a resource cannot be retrieved by name across all namespaces")
            && line.contains("usage: vmplane get"),
        "{line}"
    );
}

#[test]
fn a_manifest_error_names_its_field_path_once_and_where_the_object_is() {
    let vmplane = Cli::new(shared_server());
    let (code, _, err) = apply_stdin(&vmplane, "kind: VirtualMachine\n", &["-n", "errors-once"]);
    assert_ne!(code, 0);
    assert_eq!(
        one_error_line(&err),
        "vmplane: error: invalid: manifest: document 1: apiVersion: Required value"
    );
    let two = format!(
        "{}---\napiVersion: kubevirt.io/v1\nmetadata: {{name: y}}\n",
        vm_manifest("once-ok", &[])
    );
    let (code, _, err) = apply_stdin(&vmplane, &two, &["-n", "errors-once"]);
    assert_ne!(code, 0);
    assert_eq!(
        one_error_line(&err),
        "vmplane: error: invalid: manifest: document 2: kind: Required value"
    );
}

#[test]
fn a_usage_error_does_not_list_the_server_flag_the_environment_set() {
    let out = std::process::Command::new(vmplane_tests::vmplane_bin())
        .args(["get"])
        .env("VMPLANE_SERVER", "http://127.0.0.1:1")
        .env("VMPLANE_TOKEN", "t")
        .output()
        .expect("run vmplane");
    assert_eq!(out.status.code(), Some(2));
    let line = one_error_line(&String::from_utf8_lossy(&out.stderr));
    assert!(
        line.ends_with("(usage: vmplane get <KIND> [NAME]; see --help)"),
        "{line}"
    );
}

#[test]
fn an_error_about_a_named_object_ends_with_what_to_do_next_after_the_servers_words() {
    let vmplane = Cli::new(shared_server());
    let ns = "errors-hints";
    apply_stdin(&vmplane, &example("vm.yaml"), &["-n", ns]);
    apply_stdin(&vmplane, &example("vm-bigger.yaml"), &["-n", ns]);
    let list_vms = format!(" (list the VMs with `vmplane get vms -n {ns}`)");

    // NotFound: the server's words first, unchanged, then how to list that kind there.
    assert_eq!(
        vmplane.fails(&["get", "vm", "ghost", "-n", ns]),
        format!("vmplane: error: not found: VirtualMachine {ns}/ghost not found{list_vms}")
    );
    assert_eq!(
        vmplane.fails(&["delete", "vm", "ghost", "-n", ns]),
        format!(
            "vmplane: error: not found: VirtualMachine {ns}/ghost: metadata.name: \
             virtualmachines.kubevirt.io \"ghost\" not found{list_vms}"
        )
    );
    for args in [
        &["start", "ghost", "-n", ns][..],
        &["stop", "ghost", "-n", ns],
        &["restart", "ghost", "-n", ns],
        &["history", "vm", "ghost", "-n", ns],
        &["diff", "vm", "ghost", "-n", ns, "--from", "1"],
    ] {
        let line = vmplane.fails(args);
        assert!(
            line.starts_with(&format!(
                "vmplane: error: not found: VirtualMachine {ns}/ghost"
            )) && line.ends_with(&list_vms),
            "{args:?}: {line}"
        );
    }
    let line = vmplane.fails(&["get", "snapshot", "ghost", "-n", ns]);
    assert!(
        line.ends_with(&format!(
            " (list the snapshots with `vmplane get snapshots -n {ns}`)"
        )),
        "{line}"
    );

    // A revision the VM never had: its history lists the ones it has.
    let history = format!(" (`vmplane history vm demo -n {ns}` lists its revisions)");
    for args in [
        &["get", "vm", "demo", "-n", ns, "--revision", "7"][..],
        &["diff", "vm", "demo", "-n", ns, "--from", "7"],
        &["diff", "vm", "demo", "-n", ns, "--from", "1", "--to", "7"],
    ] {
        let line = vmplane.fails(args);
        assert!(
            line.contains("revision 7 not found") && line.ends_with(&history),
            "{args:?}: {line}"
        );
    }
    // On the wire, programs are told by the reason code, not by the words.
    let status = rt()
        .block_on(async {
            ObjectsClient::new(channel(shared_server()).await)
                .get(pb::GetRequest {
                    r#ref: Some(pb::ObjectRef {
                        kind: "vm".into(),
                        namespace: ns.into(),
                        name: "demo".into(),
                    }),
                    at: Some(pb::PointInTime {
                        at: Some(pb::point_in_time::At::Revision(7)),
                    }),
                    ..Default::default()
                })
                .await
        })
        .expect_err("revision 7 does not exist");
    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(reasons(&status), Some("REVISION_NOT_FOUND"));

    // A conflict on the expected generation: read it again, then retry.
    let reread = format!(" (re-read it with `vmplane get vm demo -n {ns}`, then retry)");
    let line = vmplane.fails(&[
        "delete",
        "vm",
        "demo",
        "-n",
        ns,
        "--expected-generation",
        "1",
    ]);
    assert!(
        line.starts_with(&format!(
            "vmplane: error: conflict: VirtualMachine {ns}/demo: "
        )) && line.contains("expected generation 1, actual 2")
            && line.ends_with(&reread),
        "{line}"
    );
    let (code, _, err) = apply_stdin(
        &vmplane,
        &example("vm.yaml"),
        &["-n", ns, "--expected-generation", "1"],
    );
    assert_ne!(code, 0);
    let line = one_error_line(&err);
    assert!(
        line.contains("actual 2") && line.ends_with(&reread),
        "{line}"
    );

    // A lifecycle request the VM's state refuses: the command that would help, and where
    // its status is.
    for verb in ["stop", "restart"] {
        assert_eq!(
            vmplane.fails(&[verb, "demo", "-n", ns]),
            format!(
                "vmplane: error: refused: VirtualMachine {ns}/demo: VM is not running \
                 (`vmplane start demo -n {ns}` starts it; `vmplane get vm demo -n {ns}` shows \
                 its status)"
            ),
            "{verb}"
        );
    }
}

/// Runs `vmplane ARGS...` as [`vmplane_tests::run_cli`] does, killing it after 30 s (a server
/// that should have refused to start, and did not).
fn run_briefly(args: &[&str]) -> (i32, String) {
    let mut child = std::process::Command::new(vmplane_tests::vmplane_bin())
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run vmplane");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("vmplane {args:?} still runs after 30 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("wait for vmplane");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn serve_with_an_unreadable_auth_file_names_it_with_its_cause_said_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("absent-auth.yaml");
    let data = dir.path().join("data");
    let (code, err) = run_briefly(&[
        "serve",
        "--auth",
        missing.to_str().expect("utf-8 path"),
        "--data",
        data.to_str().expect("utf-8 path"),
        "--listen",
        "127.0.0.1:0",
        "--hypervisor",
        "none",
    ]);
    assert_eq!(code, 2, "{err}");
    let line = one_error_line(&err);
    assert!(
        line.contains(&format!("--auth: cannot read {}", missing.display())),
        "{line}"
    );
    assert_eq!(
        line.matches("No such file or directory").count(),
        1,
        "the cause once: {line}"
    );
    assert!(!data.exists(), "nothing was opened");
}

#[test]
fn diff_with_output_json_or_yaml_prints_one_object_and_keeps_its_exit_status() {
    let vmplane = Cli::new(shared_server());
    let ns = "errors-diff-json";
    apply_stdin(&vmplane, &example("vm.yaml"), &["-n", ns]);
    apply_stdin(&vmplane, &example("vm-bigger.yaml"), &["-n", ns]);

    // Different: exit 1, the unified diff inside the object, `to` the current revision.
    let (code, out, err) =
        vmplane.run(&["diff", "vm", "demo", "-n", ns, "--from", "1", "-o", "json"]);
    assert_eq!(code, 1, "{err}");
    let diff: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        (&diff["from"], &diff["to"], &diff["equal"]),
        (&Value::from(1), &Value::from(2), &Value::from(false)),
        "{diff:#}"
    );
    let text = diff["diff"].as_str().expect("the diff as text");
    assert!(
        text.starts_with("--- revision 1\n+++ revision 2\n")
            && text.contains("\n-        cores: 1\n+        cores: 2\n"),
        "{text}"
    );
    // The same text the table output prints.
    let (code, plain, _) = vmplane.run(&["diff", "vm", "demo", "-n", ns, "--from", "1"]);
    assert_eq!((code, plain.as_str()), (1, text));

    // Equal: exit 0, an empty diff.
    let (code, out, err) =
        vmplane.run(&["diff", "vm", "demo", "-n", ns, "--from", "2", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let diff: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        diff,
        serde_json::json!({"from": 2, "to": 2, "equal": true, "diff": ""})
    );

    // YAML, with --to.
    let (code, out, err) = vmplane.run(&[
        "diff", "vm", "demo", "-n", ns, "--from", "1", "--to", "2", "-o", "yaml",
    ]);
    assert_eq!(code, 1, "{err}");
    let diff: Value = serde_yaml::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        (&diff["to"], &diff["equal"]),
        (&Value::from(2), &Value::from(false))
    );
    assert_eq!(diff["diff"], text);
}

#[test]
fn a_request_id_retried_replays_its_answer_and_reused_for_another_request_does_that_request() {
    let server = shared_server();
    let ns = "errors-request-id";
    let id = "11111111-2222-3333-4444-555555555555";
    let manifest = |memory: &str| vm_manifest("idem", &[("guest: 256Mi", memory)]);
    rt().block_on(async {
        let channel = channel(server).await;
        let mut objects = ObjectsClient::new(channel.clone());
        let mut lifecycle = pb::lifecycle_client::LifecycleClient::new(channel);
        let apply = |memory: &str| pb::ApplyRequest {
            manifest: manifest(memory),
            namespace: ns.into(),
            request_id: id.into(),
            ..Default::default()
        };
        let first = objects
            .apply(apply("guest: 256Mi"))
            .await
            .expect("apply")
            .into_inner();
        assert_eq!(first.outcome, "created");
        // A retry of the same request: its first answer, nothing written again.
        let retry = objects
            .apply(apply("guest: 256Mi"))
            .await
            .expect("retry")
            .into_inner();
        assert_eq!(
            (retry.outcome.as_str(), retry.position),
            ("created", first.position)
        );
        // The same id for another manifest: that edit is made.
        let edit = objects
            .apply(apply("guest: 1Gi"))
            .await
            .expect("another manifest")
            .into_inner();
        assert_eq!(edit.outcome, "configured");
        assert!(edit.position > first.position);
        // ... and for a start, then a delete: each is done, not answered with the apply's
        // result.
        let start = lifecycle
            .start(pb::LifecycleRequest {
                namespace: ns.into(),
                name: "idem".into(),
                request_id: id.into(),
            })
            .await
            .expect("start")
            .into_inner();
        assert!(start.position > edit.position, "{start:?}");
        objects
            .delete(pb::DeleteRequest {
                r#ref: Some(pb::ObjectRef {
                    kind: "vm".into(),
                    namespace: ns.into(),
                    name: "idem".into(),
                }),
                expected_generation: None,
                request_id: id.into(),
            })
            .await
            .expect("delete");
        // Deleted, or Terminating while the VMI the start launched stops: not the apply's
        // answer either way.
        match objects
            .get(pb::GetRequest {
                r#ref: Some(pb::ObjectRef {
                    kind: "vm".into(),
                    namespace: ns.into(),
                    name: "idem".into(),
                }),
                ..Default::default()
            })
            .await
        {
            Err(gone) => assert_eq!(gone.code(), Code::NotFound),
            Ok(going) => {
                let json: Value =
                    serde_json::from_str(&going.into_inner().object.expect("an object").json)
                        .expect("JSON");
                assert_eq!(json["status"]["printableStatus"], "Terminating", "{json}");
            }
        }
    });
}

#[test]
fn a_request_that_cannot_name_an_object_is_invalid_naming_the_field_and_quoting_little() {
    let server = shared_server();
    let ns = "errors-refs";
    let vmplane = Cli::new(server);
    apply_stdin(&vmplane, &vm_manifest("there", &[]), &["-n", ns]);
    let long = "a".repeat(1_000_000);
    rt().block_on(async {
        let channel = channel(server).await;
        let mut objects = ObjectsClient::new(channel.clone());
        let mut history = pb::history_client::HistoryClient::new(channel.clone());
        let mut lifecycle = pb::lifecycle_client::LifecycleClient::new(channel);
        let get = |r#ref: Option<pb::ObjectRef>| pb::GetRequest {
            r#ref,
            ..Default::default()
        };
        let named = |kind: &str, namespace: &str, name: &str| {
            Some(pb::ObjectRef {
                kind: kind.into(),
                namespace: namespace.into(),
                name: name.into(),
            })
        };
        for (request, field) in [
            (get(None), "ref:"),
            (get(named("", ns, "there")), "ref.kind:"),
            (get(named("vm", ns, "")), "ref.name:"),
            (get(named("vm", ns, "BAD_NAME")), "ref.name:"),
            (get(named("vm", ns, &long)), "ref.name:"),
            (get(named("vm", "A B", "there")), "ref.namespace:"),
        ] {
            let status = objects.get(request).await.expect_err("refused");
            assert_eq!(status.code(), Code::InvalidArgument, "{field} {status:?}");
            assert!(status.message().starts_with(field), "{}", status.message());
            assert!(status.message().len() < 1024, "quoted whole: {field}");
        }
        let status = objects
            .list(pb::ListRequest {
                kind: "vm".into(),
                namespace: "A B".into(),
                ..Default::default()
            })
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().starts_with("namespace:"), "{status:?}");
        // A made-up continue token is refused, not waited on.
        let status = objects
            .list(pb::ListRequest {
                kind: "vm".into(),
                namespace: ns.into(),
                continue_token: "1.999999999.60.00".into(),
                ..Default::default()
            })
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().starts_with("continue_token:"),
            "{status:?}"
        );
        let status = lifecycle
            .start(pb::LifecycleRequest {
                namespace: ns.into(),
                name: String::new(),
                request_id: String::new(),
            })
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().starts_with("name:"), "{status:?}");
        // A VM that runs no VMI: the VMI has no history, and the message says where a VM's
        // VMIs are recorded.
        let status = history
            .history(pb::HistoryRequest {
                r#ref: named("vmi", ns, "there"),
                ..Default::default()
            })
            .await
            .expect_err("not found");
        assert_eq!(status.code(), Code::NotFound);
        assert!(
            status
                .message()
                .contains(&format!("`vmplane history vm there -n {ns}`")),
            "{status:?}"
        );
    });
}

#[test]
fn a_manifest_read_with_get_and_applied_again_is_refused_once_its_object_changed_or_was_replaced() {
    let vmplane = Cli::new(shared_server());
    let ns = "errors-preconditions";
    let (code, _, err) = apply_stdin(&vmplane, &vm_manifest("pre", &[]), &["-n", ns]);
    assert_eq!(code, 0, "{err}");
    let read = vmplane.ok(&["get", "vm", "pre", "-n", ns, "-o", "yaml"]);
    assert!(
        read.contains("resourceVersion:") && read.contains("uid:"),
        "{read}"
    );
    // As read: the edit is made.
    let edited = read.replace("guest: 256Mi", "guest: 512Mi");
    let (code, out, err) = apply_stdin(&vmplane, &edited, &["-n", ns]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("configured"), "{out}");
    // The same file again, with another edit: the object changed since it was read.
    let (code, _, err) = apply_stdin(
        &vmplane,
        &read.replace("guest: 256Mi", "guest: 1Gi"),
        &["-n", ns],
    );
    assert_ne!(code, 0);
    let line = one_error_line(&err);
    assert!(
        line.contains("conflict:") && line.contains("metadata.resourceVersion"),
        "{line}"
    );
    // Deleted and created again: the file's uid is another object's.
    vmplane.ok(&["delete", "vm", "pre", "-n", ns]);
    let (code, _, err) = apply_stdin(&vmplane, &vm_manifest("pre", &[]), &["-n", ns]);
    assert_eq!(code, 0, "{err}");
    let now = vmplane.ok(&["get", "vm", "pre", "-n", ns, "-o", "json"]);
    let position: Value = serde_json::from_str(&now).expect("json");
    let rv = position["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion");
    let old_rv = read
        .lines()
        .find_map(|l| l.trim().strip_prefix("resourceVersion: "))
        .expect("resourceVersion line");
    let replaced = read
        .replace(old_rv, &format!("'{rv}'"))
        .replace("guest: 256Mi", "guest: 2Gi");
    let (code, _, err) = apply_stdin(&vmplane, &replaced, &["-n", ns]);
    assert_ne!(code, 0);
    let line = one_error_line(&err);
    assert!(
        line.contains("conflict:") && line.contains("metadata.uid"),
        "{line}"
    );
    // Without them, the file applies over whatever is there.
    let bare: String = read
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            !l.starts_with("uid:") && !l.starts_with("resourceVersion:")
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let (code, out, err) = apply_stdin(
        &vmplane,
        &bare.replace("guest: 256Mi", "guest: 2Gi"),
        &["-n", ns],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("configured"), "{out}");
}

/// The lifecycle commands (`vmplane start|stop|restart ...`) a hint at the end of `line`
/// suggests, as written between backticks.
fn suggested_lifecycle_commands(line: &str) -> Vec<Vec<String>> {
    let hint = line.rsplit_once(" (").map_or("", |(_, hint)| hint);
    hint.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|command| {
            let words: Vec<String> = command.split_whitespace().map(str::to_owned).collect();
            let verb = words.get(1)?;
            (words.first()? == "vmplane" && ["start", "stop", "restart"].contains(&verb.as_str()))
                .then(|| words[1..].to_vec())
        })
        .collect()
}

/// Waits until VM `name`'s VMI in `ns` is Running.
fn wait_running(vmplane: &Cli, ns: &str, name: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (code, out, _) = vmplane.run(&["get", "vmi", name, "-n", ns, "-o", "json"]);
        if code == 0
            && serde_json::from_str::<Value>(&out).is_ok_and(|v| v["status"]["phase"] == "Running")
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{ns}/{name}'s VMI never ran"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn a_lifecycle_hint_never_suggests_a_command_the_run_strategy_refuses() {
    let vmplane = Cli::new(shared_server());
    let ns = "errors-run-strategy";
    for (name, strategy) in [
        ("once2", "Once"),
        ("manual2", "Manual"),
        ("halted2", "Halted"),
    ] {
        let manifest = vm_manifest(
            name,
            &[("runStrategy: Manual", &format!("runStrategy: {strategy}"))],
        );
        let (code, _, err) = apply_stdin(&vmplane, &manifest, &["-n", ns]);
        assert_eq!(code, 0, "{err}");
    }
    vmplane.ok(&["start", "manual2", "-n", ns]);
    wait_running(&vmplane, ns, "once2");
    wait_running(&vmplane, ns, "manual2");

    // Each refusal, and what its hint suggests: nothing the server would refuse in turn.
    let mut suggested = Vec::new();
    for (verb, name, says) in [
        ("start", "once2", "VM is already running"),
        (
            "restart",
            "once2",
            "Once does not support manual restart requests",
        ),
        ("start", "manual2", "VM is already running"),
        ("stop", "halted2", "VM is not running"),
        (
            "restart",
            "halted2",
            "Halted does not support manual restart requests",
        ),
    ] {
        let line = vmplane.fails(&[verb, name, "-n", ns]);
        assert!(line.contains(says), "{verb} {name}: {line}");
        assert!(
            line.contains(&format!("`vmplane get vm {name} -n {ns}` shows its status")),
            "{verb} {name}: {line}"
        );
        let commands = suggested_lifecycle_commands(&line);
        if name == "once2" {
            assert_eq!(commands, Vec::<Vec<String>>::new(), "{verb} {name}: {line}");
        }
        suggested.push((format!("{verb} {name}: {line}"), commands));
    }
    // Where a command helps, it is named: a running Manual VM restarts; a Halted one starts.
    assert_eq!(
        suggested[2].1,
        [vec![
            "restart".to_owned(),
            "manual2".into(),
            "-n".into(),
            ns.into()
        ]],
        "{}",
        suggested[2].0
    );
    assert_eq!(
        suggested[3].1,
        [vec![
            "start".to_owned(),
            "halted2".into(),
            "-n".into(),
            ns.into()
        ]],
        "{}",
        suggested[3].0
    );
    let mut tried = std::collections::BTreeSet::new();
    for (refusal, commands) in &suggested {
        for command in commands {
            if !tried.insert(command.clone()) {
                continue;
            }
            let args: Vec<&str> = command.iter().map(String::as_str).collect();
            let (code, out, err) = vmplane.run(&args);
            assert_eq!(
                code, 0,
                "after {refusal}\n{command:?} was refused: {out}{err}"
            );
        }
    }
}

/// A server that dies in the middle of `apply -f` (or `delete -f`) of many objects: the CLI
/// stops at the first failure to reach it, says so once, and counts what it did not send,
/// instead of one error line per remaining object.
#[test]
fn a_server_dying_mid_apply_or_delete_stops_the_cli_with_one_error_and_a_count_of_what_was_not_sent()
 {
    for (verb, done) in [("apply", "applied"), ("delete", "deleted")] {
        server_dies_mid(verb, done);
    }
}

fn server_dies_mid(verb: &str, done: &str) {
    use std::io::{BufRead, BufReader};
    const OBJECTS: usize = 600;
    const BEFORE_DEATH: usize = 20;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = vmplane_tests::Server::start(&dir.path().join("data"), &["--hypervisor", "none"]);
    let file = dir.path().join("many.yaml");
    let docs: Vec<String> = (0..OBJECTS)
        .map(|i| vm_manifest(&format!("many-{i}"), &[]))
        .collect();
    std::fs::write(&file, docs.join("\n---\n")).expect("write manifests");
    let file = file.to_str().expect("utf-8 path");
    let vmplane = Cli::new(&server);
    if verb == "delete" {
        vmplane.ok(&["apply", "-n", "dying", "-f", file]);
    }
    let mut child = vmplane.spawn(&[verb, "-n", "dying", "-f", file]);
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    // The server lives until the CLI has printed some of its answers.
    for _ in 0..BEFORE_DEATH {
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read stdout");
        assert!(line.contains("many-"), "{verb}: {line:?}");
    }
    drop(server);
    let printed = BEFORE_DEATH + stdout.lines().count();
    let output = child.wait_with_output().expect("wait for vmplane");
    assert_ne!(output.status.code(), Some(0), "{verb}");
    let err = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{verb}: one failure, then the count: {err}");
    assert!(
        lines[0].starts_with("vmplane: error: server unavailable: "),
        "{verb}: {err}"
    );
    let not_done = lines[1]
        .strip_prefix("vmplane: error: ")
        .and_then(|rest| rest.split_once(&format!(" of {OBJECTS} objects not {done}: ")))
        .map(|(n, _)| n.parse::<usize>().expect("a count"))
        .unwrap_or_else(|| panic!("{verb}: no count: {err}"));
    assert_eq!(not_done + printed, OBJECTS, "{verb}: {err}");
    assert!(
        lines[1].ends_with(&format!("so the last {} were not sent", not_done - 1)),
        "{verb}: {err}"
    );
}
