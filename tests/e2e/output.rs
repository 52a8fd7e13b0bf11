//! Output formats scripts depend on (INTERFACE.md, "JSON and YAML objects"), `--help` with an
//! example for every command, and shell completion.

use std::io::{BufRead, BufReader};

use serde_json::Value;
use vmplane_tests::{Cli, repo_root, run_cli};

use crate::shared_server;

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .map(String::as_str)
        .collect();
    k.sort();
    k
}

fn sorted(mut v: Vec<&str>) -> Vec<&str> {
    v.sort();
    v
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

/// Applies examples/vm.yaml then vm-bigger.yaml in `ns`.
fn demo(vmplane: &Cli, ns: &str) {
    for f in ["vm.yaml", "vm-bigger.yaml"] {
        let path = repo_root().join("examples").join(f);
        vmplane.ok(&["apply", "-f", path.to_str().expect("utf-8"), "-n", ns]);
    }
}

#[test]
fn objects_and_lists_come_out_in_kubevirts_shape() {
    let vmplane = Cli::new(shared_server());
    let ns = "output-objects";
    demo(&vmplane, ns);

    let list = json(&vmplane.ok(&["get", "vms", "-n", ns, "-o", "json"]));
    assert_eq!(list["apiVersion"], "v1");
    assert_eq!(list["kind"], "List");
    let read_at: u64 = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion is a string")
        .parse()
        .expect("a decimal position");
    let items = list["items"].as_array().expect("items");
    assert_eq!(items.len(), 1);
    let vm = &items[0];
    assert_eq!(vm["apiVersion"], "kubevirt.io/v1");
    assert_eq!(vm["kind"], "VirtualMachine");
    let meta = &vm["metadata"];
    assert_eq!(meta["name"], "demo");
    assert_eq!(meta["namespace"], ns);
    uuid::Uuid::parse_str(meta["uid"].as_str().expect("uid")).expect("uid is a UUID");
    assert_eq!(meta["generation"], 2);
    let rv: u64 = meta["resourceVersion"]
        .as_str()
        .expect("resourceVersion is a string")
        .parse()
        .expect("decimal");
    assert!(
        rv <= read_at,
        "the list was read at or after the VM's last event"
    );
    chrono::DateTime::parse_from_rfc3339(meta["creationTimestamp"].as_str().expect("time"))
        .expect("creationTimestamp is RFC 3339");
    assert_eq!(meta["labels"]["app"], "demo");
    // What vmplane decided: the firmware identity, in the spec.
    let firmware = &vm["spec"]["template"]["spec"]["domain"]["firmware"];
    uuid::Uuid::parse_str(firmware["uuid"].as_str().expect("firmware uuid")).expect("UUID");
    assert!(firmware["serial"].is_string(), "{firmware}");
    let status = &vm["status"];
    assert_eq!(status["printableStatus"], "Stopped");
    assert_eq!(status["ready"], false);
    assert_eq!(status["created"], false);
    assert_eq!(status["runStrategy"], "Manual");
    assert_eq!(status["firmwareUUIDOrigin"], "Generated");
    assert!(status["desiredGeneration"].is_u64(), "{status}");
    let conditions = status["conditions"].as_array().expect("conditions");
    assert!(!conditions.is_empty());
    for c in conditions {
        for k in ["type", "status", "reason", "message"] {
            assert!(c[k].is_string(), "condition without {k}: {c}");
        }
    }

    // One object: the same document as in the list; YAML says the same as JSON.
    let one = json(&vmplane.ok(&["get", "vm", "demo", "-n", ns, "-o", "json"]));
    assert_eq!(&one, vm);
    let yaml: Value =
        serde_yaml::from_str(&vmplane.ok(&["get", "vm", "demo", "-n", ns, "-o", "yaml"]))
            .expect("YAML");
    assert_eq!(yaml["spec"], one["spec"]);
    assert_eq!(yaml["metadata"]["name"], "demo");
    assert_eq!(yaml["metadata"]["resourceVersion"], meta["resourceVersion"]);
    let list_yaml: Value =
        serde_yaml::from_str(&vmplane.ok(&["get", "vms", "-n", ns, "-o", "yaml"])).expect("YAML");
    assert_eq!(list_yaml["kind"], "List");
    assert!(list_yaml["metadata"]["resourceVersion"].is_string());
    // -A lists carry the namespace column in tables.
    let table = vmplane.ok(&["get", "vms", "-A"]);
    assert!(table.starts_with("NAMESPACE"), "{table}");
    // An empty list says so on stderr, not as a table.
    let (code, out, err) = vmplane.run(&["get", "vms", "-n", "output-nothing-here"]);
    assert_eq!((code, out.as_str()), (0, ""));
    assert!(
        err.contains("No resources found in namespace output-nothing-here"),
        "{err}"
    );
}

#[test]
fn history_audit_and_watch_json_have_the_documented_fields() {
    let server = shared_server();
    let vmplane = Cli::new(server);
    let ns = "output-history";
    demo(&vmplane, ns);

    let history = json(&vmplane.ok(&["history", "vm", "demo", "-n", ns, "-o", "json"]));
    let revisions = history.as_array().expect("a list");
    assert_eq!(revisions.len(), 2);
    for (i, r) in revisions.iter().enumerate() {
        assert_eq!(
            keys(r),
            sorted(vec![
                "revision", "position", "time", "actor", "events", "summary"
            ])
        );
        assert_eq!(r["revision"], i as u64 + 1);
        assert!(r["position"].is_u64());
        chrono::DateTime::parse_from_rfc3339(r["time"].as_str().expect("time")).expect("RFC 3339");
        assert_eq!(r["actor"], "local");
        assert!(
            r["events"]
                .as_array()
                .is_some_and(|e| e.iter().all(Value::is_string))
        );
        assert!(r["summary"].is_string());
    }
    assert_eq!(revisions[0]["events"][0], "VmCreated");
    assert_eq!(revisions[1]["events"][0], "VmSpecEdited");
    let history_yaml: Value =
        serde_yaml::from_str(&vmplane.ok(&["history", "vm", "demo", "-n", ns, "-o", "yaml"]))
            .expect("YAML");
    assert_eq!(&history_yaml, &history);

    let audit = json(&vmplane.ok(&["audit", "-n", ns, "-o", "json"]));
    let entries = audit.as_array().expect("a list");
    assert_eq!(entries.len(), 2);
    for (e, r) in entries.iter().zip(revisions) {
        assert_eq!(
            keys(e),
            sorted(vec![
                "position",
                "time",
                "actor",
                "namespace",
                "kind",
                "name",
                "event",
                "summary"
            ])
        );
        assert_eq!(e["position"], r["position"]);
        assert_eq!(e["time"], r["time"]);
        assert_eq!(e["actor"], "local");
        assert_eq!(e["namespace"], ns);
        assert_eq!(e["kind"], "VirtualMachine");
        assert_eq!(e["name"], "demo");
        assert_eq!(e["event"], r["events"][0]);
    }
    // Filters: --kind, --actor, --since/--until.
    let by_kind = json(&vmplane.ok(&["audit", "-n", ns, "--kind", "vmi", "-o", "json"]));
    assert_eq!(by_kind, Value::Array(vec![]));
    let by_actor = json(&vmplane.ok(&["audit", "-n", ns, "--actor", "someone", "-o", "json"]));
    assert_eq!(by_actor, Value::Array(vec![]));
    let second = entries[1]["time"].as_str().expect("time");
    let since = json(&vmplane.ok(&["audit", "-n", ns, "--since", second, "-o", "json"]));
    assert_eq!(
        since.as_array().map(Vec::len),
        Some(1),
        "--since is inclusive"
    );
    let until = json(&vmplane.ok(&["audit", "-n", ns, "--until", second, "-o", "json"]));
    assert_eq!(
        until.as_array().map(Vec::len),
        Some(1),
        "--until is exclusive"
    );

    // watch -o json: one object a line, replaying from a position.
    let from = (entries[0]["position"].as_u64().expect("position") - 1).to_string();
    let mut watch = vmplane.spawn(&["watch", "-n", ns, "-o", "json", "--from-position", &from]);
    let stdout = watch.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut events = Vec::new();
    while events.len() < 2 {
        let line = lines
            .next()
            .expect("watch ended early")
            .expect("read watch output");
        events.push(json(&line));
    }
    let _ = watch.kill();
    let _ = watch.wait();
    for (ev, e) in events.iter().zip(entries) {
        assert_eq!(
            keys(ev),
            sorted(vec![
                "position",
                "time",
                "actor",
                "namespace",
                "kind",
                "name",
                "event"
            ])
        );
        for k in [
            "position",
            "time",
            "actor",
            "namespace",
            "kind",
            "name",
            "event",
        ] {
            assert_eq!(ev[k], e[k], "watch and audit agree on {k}");
        }
    }
}

/// The subcommands `vmplane --help` lists.
fn subcommands() -> Vec<String> {
    let (code, out, err) = run_cli(&["--help"]);
    assert_eq!(code, 0, "{err}");
    out.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        // A command's line is indented by two; wrapped descriptions by more.
        .filter(|l| l.starts_with("  ") && !l[2..].starts_with(' '))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect()
}

#[test]
fn every_command_has_help_with_an_example() {
    let commands = subcommands();
    for want in [
        "serve",
        "apply",
        "import",
        "get",
        "delete",
        "start",
        "stop",
        "restart",
        "expand",
        "history",
        "diff",
        "audit",
        "watch",
        "completion",
    ] {
        assert!(
            commands.iter().any(|c| c == want),
            "{want} missing: {commands:?}"
        );
    }
    let (_, top, _) = run_cli(&["--help"]);
    assert!(top.contains("Examples:"), "{top}");
    for command in &commands {
        let (code, out, err) = run_cli(&[command, "--help"]);
        assert_eq!(code, 0, "{command} --help: {err}");
        let examples = out
            .split("Examples:")
            .nth(1)
            .unwrap_or_else(|| panic!("{command} --help has no example:\n{out}"));
        assert!(
            examples.contains(&format!("vmplane {command}")),
            "{command}'s example does not show it:\n{out}"
        );
    }
}

#[test]
fn completion_prints_a_shell_script() {
    let (code, out, err) = run_cli(&["completion", "bash"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("_vmplane()") && out.contains("complete -F _vmplane"),
        "{out}"
    );
    for sub in ["apply", "history", "watch"] {
        assert!(out.contains(sub), "{sub} not completed");
    }
    let (code, out, _) = run_cli(&["completion", "zsh"]);
    assert_eq!(code, 0);
    assert!(out.contains("#compdef vmplane"), "{out}");
}

#[test]
fn output_piped_to_a_reader_that_stops_early_ends_quietly() {
    let server = shared_server();
    let vmplane = Cli::new(server);
    demo(&vmplane, "output-pipe");
    // The reader closes its end before the CLI writes (as `| head -1` does once it has its
    // line): the CLI's write fails with EPIPE.
    let mut child = std::process::Command::new(vmplane_tests::vmplane_bin())
        .args([
            "--server",
            &server.url,
            "get",
            "vms",
            "-n",
            "output-pipe",
            "-o",
            "json",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn vmplane");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(
        stderr.is_empty(),
        "nothing to say to a reader that left: {stderr}"
    );
}
