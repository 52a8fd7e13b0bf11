//! Output formats scripts depend on (INTERFACE.md, "JSON and YAML objects"), `--help` with an
//! example for every command, and shell completion.

use std::io::{BufRead, BufReader};

use serde_json::Value;
use vmplane_tests::{Cli, one_error_line, repo_root, run_cli};

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
        for k in ["type", "status"] {
            assert!(c[k].is_string(), "condition without {k}: {c}");
        }
        // KubeVirt's omitempty: an empty reason or message is left out, never "".
        for k in ["reason", "message"] {
            assert!(
                c.get(k).is_none() || c[k].as_str().is_some_and(|v| !v.is_empty()),
                "condition with an empty or non-text {k}: {c}"
            );
        }
    }
    // A stopped VM's Ready=False says why.
    assert_eq!(conditions[0]["reason"], "VMINotExists");

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
fn history_gives_each_revision_the_generation_get_shows_at_that_revision() {
    let server = shared_server();
    let vmplane = Cli::new(server);
    let ns = "output-generation";
    let example = |f: &str| {
        let path = repo_root().join("examples").join(f);
        path.to_str().expect("utf-8").to_owned()
    };
    // runStrategy Manual: the start is a revision of the VM's stream, not a change of the
    // object, so the edit after it is generation 2 at a later revision.
    vmplane.ok(&["apply", "-f", &example("vm.yaml"), "-n", ns]);
    vmplane.ok(&["start", "demo", "-n", ns]);
    vmplane.ok(&["apply", "-f", &example("vm-bigger.yaml"), "-n", ns]);

    let history = json(&vmplane.ok(&["history", "vm", "demo", "-n", ns, "-o", "json"]));
    let rows = history.as_array().expect("a list");
    assert_eq!(rows[0]["generation"], 1);
    assert_eq!(rows[1]["events"][0], "VmStartRequested");
    assert_eq!(
        (&rows[1]["revision"], &rows[1]["generation"]),
        (&2.into(), &1.into())
    );
    let edit = rows
        .iter()
        .find(|r| r["events"][0] == "VmSpecEdited")
        .expect("the edit's row");
    assert_eq!(edit["generation"], 2);
    assert!(edit["revision"].as_u64() > Some(2), "{edit}");
    for row in rows {
        let revision = row["revision"].as_u64().expect("revision").to_string();
        let then = json(&vmplane.ok(&[
            "get",
            "vm",
            "demo",
            "-n",
            ns,
            "--revision",
            &revision,
            "-o",
            "json",
        ]));
        assert_eq!(
            then["metadata"]["generation"], row["generation"],
            "at revision {revision}"
        );
    }

    // The table shows it with -o wide, and keeps its columns without.
    let wide = vmplane.ok(&["history", "vm", "demo", "-n", ns, "-o", "wide"]);
    let header: Vec<&str> = wide
        .lines()
        .next()
        .expect("header")
        .split_whitespace()
        .collect();
    assert_eq!(&header[..3], ["REVISION", "GENERATION", "POSITION"]);
    let table = vmplane.ok(&["history", "vm", "demo", "-n", ns]);
    let header: Vec<&str> = table
        .lines()
        .next()
        .expect("header")
        .split_whitespace()
        .collect();
    assert_eq!(&header[..2], ["REVISION", "POSITION"]);
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
                "revision",
                "firstRevision",
                "position",
                "generation",
                "time",
                "actor",
                "events",
                "summary"
            ])
        );
        assert_eq!(r["revision"], i as u64 + 1);
        assert_eq!(r["firstRevision"], i as u64 + 1);
        assert_eq!(r["generation"], i as u64 + 1);
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
    // --limit keeps the newest revisions, and says on stderr how many older ones there are.
    let (code, out, err) = vmplane.run(&[
        "history", "vm", "demo", "-n", ns, "--limit", "1", "-o", "json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out), Value::Array(vec![revisions[1].clone()]));
    assert!(
        err.starts_with("1 older revisions not shown: raise --limit (now 1)"),
        "{err}"
    );

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
    // --limit keeps the newest entries, and says on stderr how many older ones matched.
    let (code, out, err) = vmplane.run(&["audit", "-n", ns, "--limit", "1", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out), Value::Array(vec![entries[1].clone()]));
    assert!(
        err.starts_with("1 older entries matched too: raise --limit (now 1)"),
        "{err}"
    );
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
    let events = watch_lines(&vmplane, &["watch", "-n", ns, "--from-position", &from], 2);
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

/// `vmplane COMMAND… --help` succeeds and has an `Examples:` section that shows the command.
fn help_shows_an_example(command: &[&str]) {
    let mut args = command.to_vec();
    args.push("--help");
    let (code, out, err) = run_cli(&args);
    let command = command.join(" ");
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
        help_shows_an_example(&[command]);
    }
    // The subcommands' own help too.
    for sub in [
        &["admin", "backup"][..],
        &["admin", "restore"],
        &["admin", "verify"],
        &["features", "usage"],
    ] {
        help_shows_an_example(sub);
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

    // A reader that stops early (`| head -1`): no panic, a quiet success.
    ends_quietly_when_its_reader_leaves(&["completion", "bash"]);
}

#[test]
fn output_piped_to_a_reader_that_stops_early_ends_quietly() {
    let server = shared_server();
    let vmplane = Cli::new(server);
    demo(&vmplane, "output-pipe");
    // The reader closes its end before the CLI writes (as `| head -1` does once it has its
    // line): the CLI's write fails with EPIPE.
    ends_quietly_when_its_reader_leaves(&[
        "--server",
        &server.url,
        "get",
        "vms",
        "-n",
        "output-pipe",
        "-o",
        "json",
    ]);
}

/// Runs `vmplane ARGS` with its output's reader gone before it writes (as `| head -1` is once
/// it has its line): the write fails with EPIPE, and the CLI must end with success and say
/// nothing (no error line, no panic).
fn ends_quietly_when_its_reader_leaves(args: &[&str]) {
    // The read end is closed before the process starts: its first write fails, every run.
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = std::process::Command::new(vmplane_tests::vmplane_bin())
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .stdin(std::process::Stdio::null())
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run vmplane");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {:?}: {stderr}", out.status);
    assert!(
        stderr.is_empty(),
        "{args:?}: nothing to say to a reader that left: {stderr}"
    );
}

/// The first `n` lines of `vmplane watch ARGS -o json`, parsed.
fn watch_lines(vmplane: &Cli, args: &[&str], n: usize) -> Vec<Value> {
    let mut all = args.to_vec();
    all.extend_from_slice(&["-o", "json"]);
    let mut watch = vmplane.spawn(&all);
    let stdout = watch.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut events = Vec::new();
    while events.len() < n {
        let line = lines
            .next()
            .expect("watch ended early")
            .expect("read watch output");
        events.push(json(&line));
    }
    let _ = watch.kill();
    let _ = watch.wait();
    events
}

#[test]
fn audit_and_watch_name_the_kubevirt_object_and_filter_by_the_kind_an_event_is_about() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = vmplane_tests::Server::start(&dir.path().join("data"), &[]);
    let vmplane = Cli::new(&server);
    // Nothing yet: a cluster-scoped kind names no namespace when it has none to show.
    let (code, out, err) = vmplane.run(&["get", "clusterpreferences"]);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (0, "", "No resources found.\n")
    );
    let kubevirt = "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata:\n  name: kubevirt\n  namespace: kubevirt\nspec:\n  configuration:\n    developerConfiguration:\n      featureGates: [Snapshot]\n";
    let (code, _, err) = vmplane.run_with_stdin(&["apply", "-f", "-"], kubevirt);
    assert_eq!(code, 0, "{err}");
    let vm = repo_root().join("examples").join("vm.yaml");
    vmplane.ok(&["apply", "-f", vm.to_str().expect("utf-8")]);
    vmplane.ok(&["start", "demo"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (code, out, _) = vmplane.run(&["get", "vmi", "demo", "-o", "json"]);
        if code == 0 && json(&out)["status"]["phase"] == "Running" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the VMI never ran");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    // A VMI's resourceVersion is its own last event's position: an edit of the VM (a later
    // event of the same stream) moves the VM's, not the VMI's.
    let rv = |kind: &str| -> u64 {
        let object = json(&vmplane.ok(&["get", kind, "demo", "-o", "json"]));
        object["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("a decimal resourceVersion")
    };
    let vmi_before = rv("vmi");
    let bigger = repo_root().join("examples").join("vm-bigger.yaml");
    vmplane.ok(&["apply", "-f", bigger.to_str().expect("utf-8")]);
    assert!(rv("vm") > vmi_before, "the edit is a later event");
    assert_eq!(rv("vmi"), vmi_before, "the VMI did not change");
    let last_vmi_entry = json(&vmplane.ok(&["audit", "--kind", "vmi", "-o", "json"]))
        .as_array()
        .and_then(|a| a.last().cloned())
        .expect("the VMI's entries");
    assert_eq!(last_vmi_entry["position"].as_u64(), Some(vmi_before));

    // The KubeVirt object lives in the stream `cluster/config`: its entries still name it, in
    // the cluster scope (no namespace: it is one object for the whole cluster, whatever
    // namespace its manifest names).
    let audit = json(&vmplane.ok(&["audit", "-A", "-o", "json"]));
    let entries = audit.as_array().expect("a list");
    let kv: Vec<&Value> = entries.iter().filter(|e| e["kind"] == "KubeVirt").collect();
    assert_eq!(kv.len(), 1, "{audit}");
    assert_eq!(
        (kv[0]["namespace"].as_str(), kv[0]["name"].as_str()),
        (Some(""), Some("kubevirt")),
        "{}",
        kv[0]
    );
    let first = watch_lines(&vmplane, &["watch", "-A", "--from-position", "0"], 1);
    assert_eq!(first[0]["kind"], "KubeVirt");
    assert_eq!(
        (first[0]["namespace"].as_str(), first[0]["name"].as_str()),
        (Some(""), Some("kubevirt"))
    );

    // --kind is the kind an entry is about: the VMI's events are not VM entries.
    let kinds = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["audit", "-o", "json"];
        all.extend_from_slice(args);
        json(&vmplane.ok(&all))
            .as_array()
            .expect("a list")
            .iter()
            .map(|e| e["kind"].as_str().expect("kind").to_owned())
            .collect()
    };
    let vms = kinds(&["--kind", "vm"]);
    let vmis = kinds(&["--kind", "vmi"]);
    assert!(
        !vms.is_empty() && vms.iter().all(|k| k == "VirtualMachine"),
        "{vms:?}"
    );
    assert!(
        !vmis.is_empty() && vmis.iter().all(|k| k == "VirtualMachineInstance"),
        "{vmis:?}"
    );
    assert_eq!(
        vms.len() + vmis.len(),
        kinds(&[]).len(),
        "every entry of the namespace is one or the other"
    );
    // A watch of VMs delivers the VMI's events as changes of the VM (its status moved):
    // every line it writes says VirtualMachine; a watch of VMIs, VirtualMachineInstance.
    let total = vms.len() + vmis.len();
    for (kind, want) in [("vms", "VirtualMachine"), ("vmi", "VirtualMachineInstance")] {
        let n = if kind == "vms" { total } else { vmis.len() };
        let lines = watch_lines(&vmplane, &["watch", kind, "--from-position", "0"], n);
        assert!(lines.iter().all(|l| l["kind"] == want), "{kind}: {lines:?}");
    }
}

#[test]
fn output_name_prints_kind_slash_name_for_scripts() {
    let vmplane = Cli::new(shared_server());
    let ns = "output-name";
    let vm = repo_root().join("examples/vm.yaml");
    let vm = vm.to_str().expect("utf-8");
    // apply, a dry run too: the object's name, not the outcome.
    assert_eq!(
        vmplane.ok(&["apply", "-f", vm, "-n", ns, "--dry-run", "-o", "name"]),
        "virtualmachine/demo\n"
    );
    assert_eq!(
        vmplane.ok(&["apply", "-f", vm, "-n", ns, "-o", "name"]),
        "virtualmachine/demo\n"
    );
    assert_eq!(
        vmplane.ok(&["apply", "-f", vm, "-n", ns, "-o", "name"]),
        "virtualmachine/demo\n",
        "unchanged, still the name"
    );
    vmplane.ok(&["clone", "demo", "demo2", "-n", ns]);
    let clone_vm = || vmplane.run(&["get", "vm", "demo2", "-n", ns]).0 == 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !clone_vm() {
        assert!(
            std::time::Instant::now() < deadline,
            "the clone never made demo2"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // get: one object, a list (a line each, in the table's order), every namespace.
    assert_eq!(
        vmplane.ok(&["get", "vm", "demo", "-n", ns, "-o", "name"]),
        "virtualmachine/demo\n"
    );
    assert_eq!(
        vmplane.ok(&["get", "vms", "-n", ns, "-o", "name"]),
        "virtualmachine/demo\nvirtualmachine/demo2\n"
    );
    let all = vmplane.ok(&["get", "vms", "-A", "-o", "name"]);
    assert!(
        all.lines()
            .all(|l| l.starts_with("virtualmachine/") && !l.contains(' ')),
        "{all}"
    );
    // An empty list says so on stderr, as the table does; stdout stays empty.
    let (code, out, err) = vmplane.run(&["get", "vms", "-n", "output-name-none", "-o", "name"]);
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    assert_eq!(err, "No resources found in namespace output-name-none.\n");
    // delete: the name it deleted.
    assert_eq!(
        vmplane.ok(&["delete", "vm", "demo2", "-n", ns, "-o", "name"]),
        "virtualmachine/demo2\n"
    );
    // A command that prints no objects refuses it, in one line, before sending anything.
    let (code, out, err) = vmplane.run(&["history", "vm", "demo", "-n", ns, "-o", "name"]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert!(
        err.starts_with("vmplane: error: -o name prints object names, and `history` prints none")
            && err.lines().count() == 1,
        "{err}"
    );
}

#[test]
fn output_wide_adds_columns_to_get_and_is_the_table_elsewhere() {
    let vmplane = Cli::new(shared_server());
    let ns = "output-wide";
    demo(&vmplane, ns);
    let table = vmplane.ok(&["get", "vms", "-n", ns, "-o", "wide"]);
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        [
            "NAME",
            "STATUS",
            "AGE",
            "GENERATION",
            "FIRMWARE-UUID",
            "READY",
            "RUN-STRATEGY",
            "INSTANCETYPE",
            "PREFERENCE",
            "UUID-ORIGIN",
            "RESOURCE-VERSION"
        ],
        "{table}"
    );
    let vm = json(&vmplane.ok(&["get", "vm", "demo", "-n", ns, "-o", "json"]));
    let resource_version = vm["metadata"]["resourceVersion"].as_str().expect("rv");
    assert_eq!(rows[1][0], "demo", "{table}");
    assert_eq!(rows[1].last(), Some(&resource_version), "{table}");
    // Where there is nothing to add, `-o wide` is the table (history's adds GENERATION:
    // `history_gives_each_revision_the_generation_get_shows_at_that_revision`).
    assert_eq!(
        vmplane.ok(&["audit", "-n", ns, "-o", "wide"]),
        vmplane.ok(&["audit", "-n", ns])
    );
}

#[test]
fn describe_shows_a_vm_with_its_events_from_the_log() {
    let vmplane = Cli::new(shared_server());
    let ns = "output-describe";
    demo(&vmplane, ns);
    let text = vmplane.ok(&["describe", "vm", "demo", "-n", ns]);
    for line in [
        "Name:              demo\n",
        &format!("Namespace:         {ns}\n"),
        "Kind:              VirtualMachine\n",
        "Generation:        2\n",
        "Labels:            app=demo\n",
        "Spec:\n  runStrategy: Manual\n",
        "Status:\n  printableStatus: Stopped\n",
        "Events:\n  REVISION   AGE",
    ] {
        assert!(text.contains(line), "{line:?} in:\n{text}");
    }
    let events: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "Events:")
        .skip(2)
        .collect();
    assert_eq!(events.len(), 2, "{text}");
    assert!(
        events[0].contains("VmCreated") && events[1].contains("VmSpecEdited"),
        "{text}"
    );
    // Not there: one error line. For scripts: refused with -o, pointing at get and history.
    let line = one_error_line(&vmplane.fails(&["describe", "vm", "nosuch", "-n", ns]));
    assert!(line.contains("not found"), "{line}");
    let line = one_error_line(&vmplane.fails(&["describe", "vm", "demo", "-n", ns, "-o", "json"]));
    assert!(line.contains("get vm demo -o json"), "{line}");
}

#[test]
fn an_empty_audit_says_so_on_stderr_and_is_an_empty_list_in_json_and_yaml() {
    let vmplane = Cli::new(shared_server());
    let ns = "output-empty-audit";
    let (code, out, err) = vmplane.run(&["audit", "-n", ns]);
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    assert_eq!(err, format!("No audit entries found in namespace {ns}.\n"));
    let (code, out, err) = vmplane.run(&["audit", "-n", ns, "--actor", "nobody-at-all", "-A"]);
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    assert_eq!(err, "No audit entries found in any namespace.\n");
    assert_eq!(
        json(&vmplane.ok(&["audit", "-n", ns, "-o", "json"])),
        json("[]")
    );
    let yaml: Value =
        serde_yaml::from_str(&vmplane.ok(&["audit", "-n", ns, "-o", "yaml"])).expect("YAML");
    assert_eq!(yaml, json("[]"));
}

#[test]
fn serve_and_completion_help_do_not_list_the_client_flags() {
    for command in ["serve", "completion"] {
        let (code, out, err) = run_cli(&[command, "--help"]);
        assert_eq!(code, 0, "{err}");
        for flag in [
            "--server <SERVER>",
            "--token <TOKEN>",
            "--ca-cert <FILE>",
            "--namespace <NAMESPACE>",
            "--output <OUTPUT>",
        ] {
            assert!(!out.contains(flag), "{command} --help lists {flag}:\n{out}");
        }
    }
    // They stay global for the client commands, before or after the command.
    let (_, out, _) = run_cli(&["get", "--help"]);
    assert!(out.contains("--server <SERVER>"), "{out}");
}

/// Three VMs labelled as a GitOps repository would label them.
fn labelled_vms(ns: &str) -> String {
    let vm = std::fs::read_to_string(repo_root().join("examples/vm.yaml")).expect("example");
    [
        ("web-1", "web", "prod"),
        ("web-2", "web", "staging"),
        ("db-1", "db", "prod"),
    ]
    .iter()
    .map(|(name, tier, env)| {
        vm.replace("name: demo", &format!("name: {name}"))
            .replacen(
                "    app: demo\n",
                &format!("    app: demo\n    tier: {tier}\n    env: {env}\n"),
                1,
            )
            .replace(
                "metadata:\n  name",
                &format!("metadata:\n  namespace: {ns}\n  name"),
            )
    })
    .collect::<Vec<_>>()
    .join("---\n")
}

#[test]
fn label_selectors_choose_what_get_lists_and_what_delete_deletes() {
    let vmplane = Cli::new(shared_server());
    let ns = "output-selectors";
    let (code, _, err) = vmplane.run_with_stdin(&["apply", "-f", "-"], &labelled_vms(ns));
    assert_eq!(code, 0, "{err}");
    let get = |selector: &str| vmplane.ok(&["get", "vms", "-n", ns, "-l", selector, "-o", "name"]);
    assert_eq!(
        get("tier=web"),
        "virtualmachine/web-1\nvirtualmachine/web-2\n"
    );
    assert_eq!(get("tier=web,env=prod"), "virtualmachine/web-1\n");
    assert_eq!(
        get("env in (prod, staging),tier!=web"),
        "virtualmachine/db-1\n"
    );
    assert_eq!(get("!tier"), "");
    // Pages of one object: the same list, read at one position.
    let paged = vmplane.ok(&[
        "get",
        "vms",
        "-n",
        ns,
        "-l",
        "env=prod",
        "--chunk-size",
        "1",
        "-o",
        "json",
    ]);
    let names: Vec<String> = json(&paged)["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|o| o["metadata"]["name"].as_str().expect("name").to_owned())
        .collect();
    assert_eq!(names, ["db-1", "web-1"]);
    // The table too, and -A.
    let table = vmplane.ok(&["get", "vms", "-A", "-l", "tier=db"]);
    assert!(table.contains("db-1") && !table.contains("web-"), "{table}");
    // Label columns (-L) and every label (--show-labels), after the table's own columns.
    let table = vmplane.ok(&["get", "vms", "-n", ns, "-L", "tier,env", "--show-labels"]);
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0][5..], ["TIER", "ENV", "LABELS"], "{table}");
    assert_eq!(
        lines[1][lines[1].len() - 3..],
        ["db", "prod", "app=demo,env=prod,tier=db"],
        "{table}"
    );
    let line = vmplane.fails(&["get", "vms", "-n", ns, "-L", "tier=db"]);
    assert!(
        line.contains("--label-columns") && line.contains("not one label key"),
        "{line}"
    );
    // Nothing matches: kubectl's message on stderr.
    let (code, out, err) = vmplane.run(&["get", "vms", "-n", ns, "-l", "tier=cache"]);
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    assert_eq!(err, format!("No resources found in namespace {ns}.\n"));
    // A malformed selector is refused before anything is sent, naming the requirement.
    let (code, _, err) = vmplane.run(&["get", "vms", "-n", ns, "-l", "tier in web"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--selector") && err.contains("tier in: expected '('"),
        "{err}"
    );
    let line = vmplane.fails(&["get", "vm", "web-1", "-n", ns, "-l", "tier=web"]);
    assert!(line.contains("--selector"), "{line}");
    // The server checks it as well, and names the field.
    let status = crate::rt().block_on(async {
        vmplane_gateway::pb::objects_client::ObjectsClient::new(
            crate::channel(shared_server()).await,
        )
        .list(vmplane_gateway::pb::ListRequest {
            kind: "vm".into(),
            namespace: ns.into(),
            label_selector: "tier==".repeat(2),
            ..Default::default()
        })
        .await
        .expect_err("a malformed selector is refused")
    });
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status
            .message()
            .starts_with("label_selector: label selector \"tier==tier==\""),
        "{}",
        status.message()
    );
    // delete -l: the matching ones, named; the others stay.
    assert_eq!(
        vmplane.ok(&["delete", "vms", "-n", ns, "-l", "tier=web"]),
        "virtualmachine/web-1 deleted\nvirtualmachine/web-2 deleted\n"
    );
    assert_eq!(get("app=demo"), "virtualmachine/db-1\n");
    let (code, out, err) = vmplane.run(&["delete", "vms", "-n", ns, "-l", "tier=web"]);
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    assert_eq!(err, format!("No resources found in namespace {ns}.\n"));
    // -A: every namespace, each named; -A without -l is refused.
    assert_eq!(
        vmplane.ok(&["delete", "vms", "-A", "-l", "tier=db,env=prod"]),
        format!("virtualmachine/db-1 deleted from namespace {ns}\n")
    );
    let line = vmplane.fails(&["delete", "vms", "-A"]);
    assert!(line.contains("-l SELECTOR"), "{line}");
}

/// Polls `get vmi NAME -o json` in `ns` until its phase is `phase`.
fn vmi_in_phase(vmplane: &Cli, ns: &str, name: &str, phase: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (code, out, err) = vmplane.run(&["get", "vmi", name, "-n", ns, "-o", "json"]);
        if code == 0 {
            let vmi = json(&out);
            if vmi["status"]["phase"] == phase {
                return vmi;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "VMI {ns}/{name} did not reach {phase}: {out}{err}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn a_vms_vmi_shows_the_expanded_spec_it_runs_and_the_generation_it_stands_for() {
    let vmplane = Cli::new(shared_server());
    let ns = "output-vmi";
    let manifests = format!(
        r#"
apiVersion: instancetype.kubevirt.io/v1beta1
kind: VirtualMachineInstancetype
metadata: {{name: two-cpus, namespace: {ns}}}
spec:
  cpu: {{guest: 2}}
  memory: {{guest: 256Mi}}
---
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {{name: typed, namespace: {ns}}}
spec:
  instancetype: {{kind: VirtualMachineInstancetype, name: two-cpus}}
  runStrategy: Always
  template:
    metadata:
      labels: {{app: typed}}
      annotations: {{note: kept}}
    spec:
      domain: {{devices: {{}}}}
"#
    );
    let (code, _, err) = vmplane.run_with_stdin(&["apply", "-f", "-"], &manifests);
    assert_eq!(code, 0, "{err}");
    let vmi = vmi_in_phase(&vmplane, ns, "typed", "Running");
    // What runs: the instancetype's CPUs and memory and KubeVirt's default interface, not the
    // template as written.
    let domain = &vmi["spec"]["domain"];
    assert_eq!(domain["cpu"]["sockets"], 2, "{vmi}");
    assert_eq!(domain["memory"]["guest"], "256Mi", "{vmi}");
    assert!(domain["devices"]["interfaces"].is_array(), "{vmi}");
    let meta = &vmi["metadata"];
    assert_eq!(meta["labels"]["app"], "typed");
    assert_eq!(meta["annotations"]["note"], "kept");
    assert_eq!(
        meta["annotations"]["kubevirt.io/instancetype-name"],
        "two-cpus"
    );
    assert_eq!(meta["annotations"]["kubevirt.io/vm-generation"], "1");
    assert_eq!(meta["ownerReferences"][0]["kind"], "VirtualMachine");

    // A label on the VM changes its generation but not what runs: the run stands for the new
    // generation (KubeVirt bumps kubevirt.io/vm-generation), and no restart is asked for.
    vmplane.ok(&["label", "vm", "typed", "tier=gold", "-n", ns]);
    let vm = json(&vmplane.ok(&["get", "vm", "typed", "-n", ns, "-o", "json"]));
    assert_eq!(vm["metadata"]["generation"], 2, "{vm}");
    assert_eq!(vm["status"]["desiredGeneration"], 2, "{vm}");
    assert_eq!(vm["status"]["observedGeneration"], 2, "{vm}");
    let vmi = json(&vmplane.ok(&["get", "vmi", "typed", "-n", ns, "-o", "json"]));
    assert_eq!(
        vmi["metadata"]["annotations"]["kubevirt.io/vm-generation"],
        "2"
    );

    // A template edit is not what runs: observed stays at the run's generation until a
    // restart.
    let edited = manifests.replace(
        "domain: {devices: {}}",
        "domain: {devices: {}}\n      terminationGracePeriodSeconds: 5",
    );
    assert_ne!(edited, manifests);
    let (code, _, err) = vmplane.run_with_stdin(&["apply", "-f", "-"], &edited);
    assert_eq!(code, 0, "{err}");
    let vm = json(&vmplane.ok(&["get", "vm", "typed", "-n", ns, "-o", "json"]));
    assert_eq!(vm["status"]["desiredGeneration"], 3, "{vm}");
    assert_eq!(vm["status"]["observedGeneration"], 2, "{vm}");
}

#[test]
fn a_firmware_uuid_a_running_vmi_still_has_after_an_edit_is_refused_to_another_vm() {
    let vmplane = Cli::new(shared_server());
    let ns = "output-uuid-held";
    let vm = |name: &str, uuid: &str| {
        format!(
            "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  runStrategy: Always\n  template:\n    spec:\n      domain:\n        memory: {{guest: 64Mi}}\n        devices: {{}}\n        firmware: {{uuid: {uuid}}}\n"
        )
    };
    let (x, y) = (
        "0f0e0d0c-0b0a-4009-8008-070605040302",
        "1f1e1d1c-1b1a-4019-8018-171615141312",
    );
    let apply = |text: &str| vmplane.run_with_stdin(&["apply", "-f", "-"], text);
    assert_eq!(apply(&vm("dupa", x)).0, 0);
    vmi_in_phase(&vmplane, ns, "dupa", "Running");
    // dupa's spec moves to y; its guest keeps x until it restarts.
    assert_eq!(apply(&vm("dupa", y)).0, 0);
    let (code, _, err) = apply(&vm("dupb", x));
    assert_ne!(code, 0, "x is still dupa's guest's");
    assert!(err.contains(x) && err.contains("already used"), "{err}");
    // Once dupa restarts with y, x is free.
    vmplane.ok(&["restart", "dupa", "-n", ns]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (code, _, err) = apply(&vm("dupb", x));
        if code == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "x was not freed after dupa's restart: {err}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
fn a_vm_whose_node_selector_no_node_matches_is_unschedulable_and_says_why() {
    let vmplane = Cli::new(shared_server());
    let ns = "output-node-selector";
    let vm = |name: &str, selector: &str| {
        format!(
            "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  runStrategy: Always\n  template:\n    spec:\n      nodeSelector: {{{selector}}}\n      domain:\n        memory: {{guest: 64Mi}}\n        devices: {{}}\n"
        )
    };
    let apply = |text: &str| vmplane.run_with_stdin(&["apply", "-f", "-"], text);
    assert_eq!(apply(&vm("nowhere", "disktype: ssd")).0, 0);
    assert_eq!(apply(&vm("pinned", "kubernetes.io/hostname: node1")).0, 0);
    vmi_in_phase(&vmplane, ns, "pinned", "Running");
    let vmi = vmi_in_phase(&vmplane, ns, "nowhere", "Scheduling");
    assert_eq!(vmi["status"]["reason"], "Unschedulable", "{vmi}");
    let message = vmi["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("nodeSelector (disktype=ssd)"), "{message}");
    let vm = json(&vmplane.ok(&["get", "vm", "nowhere", "-n", ns, "-o", "json"]));
    assert_eq!(
        vm["status"]["printableStatus"], "ErrorUnschedulable",
        "{vm}"
    );
}

/// A history row holds the events one request appended: it names every revision it covers
/// (`1-2`, `firstRevision`), each of which `get --revision` takes.
#[test]
fn a_history_row_of_several_events_names_each_revision_it_covers() {
    let vmplane = Cli::new(shared_server());
    let ns = "output-history-rows";
    vmplane.apply_in(
        ns,
        "apiVersion: instancetype.kubevirt.io/v1beta1\nkind: VirtualMachineInstancetype\n\
         metadata: {name: small}\nspec:\n  cpu: {guest: 1}\n  memory: {guest: 128Mi}\n---\n\
         apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: typed}\nspec:\n  \
         runStrategy: Halted\n  instancetype: {name: small, kind: VirtualMachineInstancetype}\n  \
         template:\n    spec:\n      domain: {devices: {}}\n",
    );
    let history = json(&vmplane.ok(&["history", "vm", "typed", "-n", ns, "-o", "json"]));
    let row = &history.as_array().expect("a list")[0];
    assert_eq!(
        row["events"],
        serde_json::json!(["VmCreated", "InstancetypeRevisionCaptured"])
    );
    assert_eq!(
        (&row["firstRevision"], &row["revision"]),
        (&1.into(), &2.into())
    );
    let table = vmplane.ok(&["history", "vm", "typed", "-n", ns]);
    let cells: Vec<&str> = table
        .lines()
        .nth(1)
        .expect("a row")
        .split_whitespace()
        .collect();
    assert_eq!(cells[0], "1-2", "{table}");
    let describe = vmplane.ok(&["describe", "vm", "typed", "-n", ns]);
    assert!(describe.contains("\n  1-2 "), "{describe}");
    for revision in ["1", "2"] {
        vmplane.ok(&["get", "vm", "typed", "-n", ns, "--revision", revision]);
    }
}

/// A VM's VMI has no stream of its own: `describe vmi` shows it with its events from the VM's
/// history, those of the run shown (from its launch on), and VMI events only.
#[test]
fn describe_shows_a_vms_vmi_with_the_vmi_events_of_its_current_run() {
    let vmplane = Cli::new(shared_server());
    let ns = "output-describe-vmi";
    demo(&vmplane, ns);
    let ready = [
        "wait",
        "vmi",
        "demo",
        "-n",
        ns,
        "--for",
        "condition=Ready",
        "--timeout",
        "60s",
    ];
    let events = |text: &str| -> Vec<String> {
        text.lines()
            .skip_while(|l| *l != "Events:")
            .skip(2)
            .map(str::to_owned)
            .collect()
    };
    vmplane.ok(&["start", "demo", "-n", ns]);
    vmplane.ok(&ready);
    let first = vmplane.ok(&["describe", "vmi", "demo", "-n", ns]);
    assert!(
        first.contains("Kind:              VirtualMachineInstance\n"),
        "{first}"
    );
    let rows = events(&first);
    assert!(
        rows.first().is_some_and(|r| r.contains("VmiLaunched")),
        "{first}"
    );
    assert!(
        rows.iter().all(|r| r
            .split_whitespace()
            .nth(3)
            .is_some_and(|e| e.starts_with("Vmi"))),
        "VMI events only: {first}"
    );
    // A restart is a new run: its rows start at its own launch.
    let launch = |text: &str| -> Option<String> {
        events(text)
            .iter()
            .find(|r| r.contains("VmiLaunched"))
            .and_then(|r| r.split_whitespace().next().map(str::to_owned))
    };
    let first_launch = launch(&first).expect("a launch row");
    vmplane.ok(&["restart", "demo", "-n", ns]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let second = loop {
        let text = vmplane.ok(&["describe", "vmi", "demo", "-n", ns]);
        if launch(&text).is_some_and(|l| l != first_launch) {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no second launch: {text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let rows = events(&second);
    assert!(
        rows.first().is_some_and(|r| r.contains("VmiLaunched")),
        "{second}"
    );
    assert_eq!(
        rows.iter().filter(|r| r.contains("VmiLaunched")).count(),
        1,
        "{second}"
    );
    // --events keeps the last ones.
    let one = vmplane.ok(&["describe", "vmi", "demo", "-n", ns, "--events", "1"]);
    assert_eq!(events(&one).len(), 1, "{one}");
    // `history vmi` answers the same rows (the server decides them), and says whose
    // revisions they are.
    let (code, out, err) = vmplane.run(&["history", "vmi", "demo", "-n", ns, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let history: Vec<serde_json::Value> = serde_json::from_str(&out).expect("json");
    let launches = history
        .iter()
        .filter(|r| {
            r["events"]
                .as_array()
                .is_some_and(|e| e.contains(&"VmiLaunched".into()))
        })
        .count();
    assert_eq!(launches, 1, "{out}");
    assert_eq!(
        history[0]["events"][0], "VmiLaunched",
        "from the current run's launch on: {out}"
    );
    assert!(err.contains("`vmplane history vm demo`"), "{err}");
    vmplane.ok(&["stop", "demo", "-n", ns]);
    vmplane.ok(&[
        "wait",
        "vmi",
        "demo",
        "-n",
        ns,
        "--for",
        "delete",
        "--timeout",
        "60s",
    ]);
    // With no VMI now, the VMI has no history; the message says where its runs are.
    let err = vmplane.fails(&["history", "vmi", "demo", "-n", ns]);
    assert!(err.contains("runs no VMI now"), "{err}");
    assert!(
        err.contains("`vmplane history vm demo -n output-describe-vmi`"),
        "{err}"
    );
}
