//! Snapshot, restore and clone (issue 9 §1, semantics.md §5) through the CLI: the shorthands
//! `snapshot`, `restore [--as]`, `clone`, manifests with `apply -f`, the Snapshot feature gate,
//! the restore readiness policies on a running VM, the events in `history`/`audit`, and a saga
//! resumed after a server restart. Servers run the real reconciler on libvirt's test driver
//! unless a test says otherwise.

use std::time::{Duration, Instant};

use serde_json::Value;
use vmplane_tests::{Cli, Server, repo_root};

fn apply(cli: &Cli, yaml: &str) -> String {
    let (code, out, err) = cli.run_with_stdin(&["apply", "-f", "-"], yaml);
    assert_eq!(code, 0, "apply failed\nstdout: {out}\nstderr: {err}");
    out
}

fn get(cli: &Cli, kind: &str, name: &str) -> Value {
    serde_json::from_str(&cli.ok(&["get", kind, name, "-o", "json"])).expect("object JSON")
}

fn example(name: &str) -> String {
    repo_root()
        .join("examples")
        .join(name)
        .to_str()
        .expect("utf-8")
        .to_owned()
}

fn firmware_uuid(vm: &Value) -> String {
    vm["spec"]["template"]["spec"]["domain"]["firmware"]["uuid"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn serial(vm: &Value) -> String {
    vm["spec"]["template"]["spec"]["domain"]["firmware"]["serial"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn mac(vm: &Value) -> String {
    vm["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"][0]["macAddress"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn cores(vm: &Value) -> i64 {
    vm["spec"]["template"]["spec"]["domain"]["cpu"]["cores"]
        .as_i64()
        .unwrap_or_default()
}

/// Polls `get KIND NAME -o json` until `done` holds (30 s at most).
#[track_caller]
fn wait_for(cli: &Cli, kind: &str, name: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, out, _) = cli.run(&["get", kind, name, "-o", "json"]);
        if code == 0 {
            let v: Value = serde_json::from_str(&out).expect("object JSON");
            if done(&v) {
                return v;
            }
            if Instant::now() > deadline {
                panic!("{kind} {name}: not {what} within 30 s:\n{v:#}");
            }
        } else if Instant::now() > deadline {
            panic!("{kind} {name}: not readable within 30 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn restore_named(cli: &Cli, name: &str, target: &str, snapshot: &str, policy: &str) -> String {
    let yaml = format!(
        "apiVersion: snapshot.kubevirt.io/v1beta1\nkind: VirtualMachineRestore\nmetadata:\n  name: {name}\nspec:\n  target:\n    apiGroup: kubevirt.io\n    kind: VirtualMachine\n    name: {target}\n  virtualMachineSnapshotName: {snapshot}\n  targetReadinessPolicy: {policy}\n"
    );
    apply(cli, &yaml)
}

#[test]
fn snapshot_restore_and_clone_through_the_shorthands() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &["--hypervisor", "none"]);
    let cli = Cli::new(&server);
    cli.ok(&["apply", "-f", &example("vm.yaml")]);
    let demo = get(&cli, "vm", "demo");
    let (uuid, demo_serial) = (firmware_uuid(&demo), serial(&demo));
    assert!(!uuid.is_empty(), "{demo:#}");

    // snapshot: Succeeded at once, ready to use, with the identity captured.
    let out = cli.ok(&["snapshot", "demo", "snap1"]);
    assert_eq!(out, "virtualmachinesnapshot/snap1 created (Succeeded)\n");
    // The table shows KubeVirt's printer columns: where the snapshot stands, at a glance.
    let table = cli.ok(&["get", "snapshots"]);
    let rows: Vec<String> = table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        rows[0], "NAME SOURCEKIND SOURCENAME PHASE READYTOUSE CREATIONTIME ERROR",
        "{table}"
    );
    assert!(
        rows[1].starts_with("snap1 VirtualMachine demo Succeeded true "),
        "{table}"
    );
    let yaml: Value =
        serde_yaml::from_str(&cli.ok(&["get", "snapshot", "snap1", "-o", "yaml"])).expect("yaml");
    let status = &yaml["status"];
    assert_eq!(status["phase"], "Succeeded", "{yaml:#}");
    assert_eq!(status["readyToUse"], true, "{yaml:#}");
    assert_eq!(status["firmwareUUID"], uuid.as_str(), "{yaml:#}");
    assert_eq!(status["sourceUID"], demo["metadata"]["uid"], "{yaml:#}");
    assert!(
        status["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True"),
        "{yaml:#}"
    );

    // An edit, then a restore onto the same VM: the snapshot's spec and UUID come back.
    cli.ok(&["apply", "-f", &example("vm-bigger.yaml")]);
    assert_eq!(cores(&get(&cli, "vm", "demo")), 2);
    let out = cli.ok(&[
        "restore",
        "demo",
        "--snapshot",
        "snap1",
        "--restore-name",
        "r1",
    ]);
    assert_eq!(out, "virtualmachinerestore/r1 created (Complete)\n");
    let restored = get(&cli, "vm", "demo");
    assert_eq!(cores(&restored), 1, "{restored:#}");
    assert_eq!(firmware_uuid(&restored), uuid);
    assert_eq!(serial(&restored), demo_serial);
    let r1 = get(&cli, "restore", "r1");
    assert_eq!(r1["status"]["complete"], true, "{r1:#}");

    // Into a new VM: demo holds the UUID, so a new UUID, serial and MACs, reported.
    let out = cli.ok(&[
        "restore",
        "demo",
        "--snapshot",
        "snap1",
        "--as",
        "demo-restored",
    ]);
    assert!(
        out.starts_with("virtualmachinerestore/demo-restored-restore-"),
        "{out}"
    );
    assert!(out.ends_with(" created (Complete)\n"), "{out}");
    let copy = get(&cli, "vm", "demo-restored");
    assert_ne!(firmware_uuid(&copy), uuid, "{copy:#}");
    assert!(!firmware_uuid(&copy).is_empty());
    assert_ne!(serial(&copy), demo_serial);
    let name =
        out.split_whitespace().next().expect("name")["virtualmachinerestore/".len()..].to_owned();
    let restore = get(&cli, "restore", &name);
    assert_eq!(
        restore["status"]["targetIdentity"]["firmwareUUID"],
        firmware_uuid(&copy).as_str(),
        "{restore:#}"
    );
    assert_eq!(restore["status"]["targetIdentity"]["regenerated"], true);

    // clone: a new VM with a new identity.
    let out = cli.ok(&["clone", "demo", "demo2", "--clone-name", "c1"]);
    assert_eq!(out, "virtualmachineclone/c1 created (Succeeded)\n");
    let demo2 = get(&cli, "vm", "demo2");
    assert_ne!(firmware_uuid(&demo2), uuid);
    assert_ne!(serial(&demo2), demo_serial);
    if !mac(&restored).is_empty() {
        assert_ne!(mac(&demo2), mac(&restored), "{demo2:#}");
    }
    // A clone manifest with label filters (negations win).
    apply(
        &cli,
        "apiVersion: clone.kubevirt.io/v1beta1\nkind: VirtualMachineClone\nmetadata:\n  name: c2\nspec:\n  source:\n    apiGroup: kubevirt.io\n    kind: VirtualMachine\n    name: demo\n  target:\n    apiGroup: kubevirt.io\n    kind: VirtualMachine\n    name: demo3\n  labelFilters: [\"*\", \"!app\"]\n",
    );
    let c2 = get(&cli, "clone", "c2");
    assert_eq!(c2["status"]["phase"], "Succeeded", "{c2:#}");
    let demo3 = get(&cli, "vm", "demo3");
    assert!(
        demo3["metadata"]["labels"].get("app").is_none(),
        "{demo3:#}"
    );

    // Every step is events.
    let history = cli.ok(&["history", "vm", "demo"]);
    assert!(history.lines().count() >= 4, "{history}");
    let audit = cli.ok(&["audit", "-o", "json"]);
    for event in [
        "SnapshotTaken",
        "RestoreStarted",
        "RestoreCompleted",
        "CloneStarted",
        "CloneSucceeded",
    ] {
        assert!(audit.contains(event), "{event} not in the audit:\n{audit}");
    }

    // Restoring a snapshot that does not exist: the restore fails, the command says so.
    let err = cli.fails(&["restore", "demo", "--snapshot", "nope"]);
    assert!(err.contains("nope"), "{err}");

    // A clone onto a name that is taken fails, and the command says why (the clone's `Ready`
    // condition holds the reason; a bare "failed" does not help).
    let err = cli.fails(&["clone", "demo", "demo2", "--clone-name", "c3"]);
    assert!(
        err.contains("VirtualMachineClone c3") && err.contains("demo2 already exists"),
        "{err}"
    );
}

#[test]
fn the_snapshot_gate_disabled_refuses_and_records_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &["--hypervisor", "none"]);
    let cli = Cli::new(&server);
    cli.ok(&["apply", "-f", &example("vm.yaml")]);
    apply(
        &cli,
        "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata:\n  name: kubevirt\n  namespace: kubevirt\nspec:\n  configuration:\n    developerConfiguration:\n      disabledFeatureGates: [Snapshot]\n",
    );
    let (code, _, err) = cli.run(&["snapshot", "demo", "snap1"]);
    assert_ne!(code, 0);
    // FailedPrecondition reads `refused:` on the CLI.
    assert!(
        err.contains(
            "refused: VirtualMachineSnapshot default/snap1: Snapshot feature gate is not enabled"
        ),
        "{err}"
    );
    let (code, _, _) = cli.run(&["get", "snapshot", "snap1"]);
    assert_ne!(code, 0, "nothing was recorded");
    let audit = cli.ok(&["audit", "-o", "json"]);
    assert!(!audit.contains("SnapshotTaken"), "{audit}");
}

#[test]
fn a_restore_onto_a_running_vm_follows_its_readiness_policy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &[]);
    let cli = Cli::new(&server);
    cli.ok(&["apply", "-f", &example("vm.yaml")]);
    cli.ok(&["snapshot", "demo", "snap1"]);
    cli.ok(&["apply", "-f", &example("vm-bigger.yaml")]);
    cli.ok(&["start", "demo"]);
    wait_for(&cli, "vm", "demo", "running", |v| {
        v["status"]["printableStatus"] == "Running"
    });

    // StopTarget: the restore stops the VM, waits, then restores.
    restore_named(&cli, "r-stop", "demo", "snap1", "StopTarget");
    wait_for(&cli, "restore", "r-stop", "complete", |v| {
        v["status"]["complete"] == true
    });
    assert_eq!(cores(&get(&cli, "vm", "demo")), 1);

    // WaitGracePeriod (the default): waits for the VM to stop.
    cli.ok(&["apply", "-f", &example("vm-bigger.yaml")]);
    cli.ok(&["start", "demo"]);
    wait_for(&cli, "vm", "demo", "running", |v| {
        v["status"]["printableStatus"] == "Running"
    });
    let out = cli.ok(&[
        "restore",
        "demo",
        "--snapshot",
        "snap1",
        "--restore-name",
        "r-wait",
    ]);
    assert_eq!(out, "virtualmachinerestore/r-wait created (InProgress)\n");
    assert_eq!(
        cores(&get(&cli, "vm", "demo")),
        2,
        "not restored while running"
    );
    cli.ok(&["stop", "demo"]);
    wait_for(&cli, "restore", "r-wait", "complete", |v| {
        v["status"]["complete"] == true
    });
    assert_eq!(cores(&get(&cli, "vm", "demo")), 1);
}

#[test]
fn an_unfinished_restore_resumes_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let server = Server::start(&data, &[]);
    let cli = Cli::new(&server);
    cli.ok(&["apply", "-f", &example("vm.yaml")]);
    cli.ok(&["snapshot", "demo", "snap1"]);
    cli.ok(&["apply", "-f", &example("vm-bigger.yaml")]);
    cli.ok(&["start", "demo"]);
    wait_for(&cli, "vm", "demo", "running", |v| {
        v["status"]["printableStatus"] == "Running"
    });
    let out = cli.ok(&[
        "restore",
        "demo",
        "--snapshot",
        "snap1",
        "--restore-name",
        "r1",
    ]);
    assert_eq!(out, "virtualmachinerestore/r1 created (InProgress)\n");
    let status = server.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}");

    // The new server has never seen r1 driven: it resumes it from the log. (The test
    // driver's domains do not survive the restart: the VM may already be found stopped.)
    let server = Server::start(&data, &[]);
    let cli = Cli::new(&server);
    let _ = cli.run(&["stop", "demo"]);
    wait_for(&cli, "restore", "r1", "complete", |v| {
        v["status"]["complete"] == true
    });
    assert_eq!(cores(&get(&cli, "vm", "demo")), 1);
}

/// The `items` of `get KIND -n NS -o json`.
fn items(cli: &Cli, kind: &str, ns: &str) -> Vec<Value> {
    let list: Value =
        serde_json::from_str(&cli.ok(&["get", kind, "-n", ns, "-o", "json"])).expect("list JSON");
    list["items"].as_array().expect("items").clone()
}

#[test]
fn a_shorthand_whose_source_is_missing_creates_nothing_and_says_what_to_do() {
    let cli = Cli::new(crate::shared_server());
    let ns = "snapshots-missing-source";
    cli.ok(&["apply", "-f", &example("vm.yaml"), "-n", ns]);
    let no_vm = format!(
        "vmplane: error: VirtualMachine {ns}/nope not found: nothing was created (list the VMs \
         with `vmplane get vms -n {ns}`)"
    );
    let no_snapshot = format!(
        "vmplane: error: VirtualMachineSnapshot {ns}/nosnap not found: nothing was created (list \
         the snapshots with `vmplane get snapshots -n {ns}`)"
    );
    for (args, said) in [
        (&["snapshot", "nope", "s9"][..], &no_vm),
        (&["clone", "nope", "x"], &no_vm),
        // Again: no new randomly named clone object either.
        (&["clone", "nope", "x"], &no_vm),
        (&["clone", "nope", "x", "--clone-name", "c9"], &no_vm),
        (&["restore", "demo", "--snapshot", "nosnap"], &no_snapshot),
        (
            &["restore", "demo", "--snapshot", "nosnap", "--as", "copy"],
            &no_snapshot,
        ),
    ] {
        let args: Vec<&str> = args.iter().copied().chain(["-n", ns]).collect();
        let (code, out, err) = cli.run(&args);
        assert_eq!((code, out.as_str()), (2, ""), "{args:?}: {err}");
        assert_eq!(vmplane_tests::one_error_line(&err), *said, "{args:?}");
    }
    for kind in ["snapshots", "restores", "clones"] {
        assert_eq!(items(&cli, kind, ns), Vec::<Value>::new(), "{kind}");
    }
    let vms: Vec<Value> = items(&cli, "vms", ns);
    assert_eq!(vms.len(), 1, "no VM was created: {vms:#?}");
    // Not one event but the VM's creation.
    let audit: Value =
        serde_json::from_str(&cli.ok(&["audit", "-n", ns, "-o", "json"])).expect("audit JSON");
    let kinds: Vec<&Value> = audit
        .as_array()
        .expect("a list")
        .iter()
        .map(|e| &e["kind"])
        .collect();
    assert!(kinds.iter().all(|k| *k == "VirtualMachine"), "{audit:#}");

    // With their sources there, the shorthands work as before.
    assert_eq!(
        cli.ok(&["snapshot", "demo", "s1", "-n", ns]),
        "virtualmachinesnapshot/s1 created (Succeeded)\n"
    );
    assert_eq!(
        cli.ok(&[
            "restore",
            "demo",
            "--snapshot",
            "s1",
            "--restore-name",
            "r1",
            "-n",
            ns
        ]),
        "virtualmachinerestore/r1 created (Complete)\n"
    );
    assert_eq!(
        cli.ok(&["clone", "demo", "demo2", "--clone-name", "c1", "-n", ns]),
        "virtualmachineclone/c1 created (Succeeded)\n"
    );

    // A manifest is KubeVirt's to judge, not checked first: a snapshot of a missing VM is
    // accepted, and fails.
    let (code, out, err) = cli.run_with_stdin(
        &["apply", "-f", "-", "-n", ns],
        "apiVersion: snapshot.kubevirt.io/v1beta1\nkind: VirtualMachineSnapshot\nmetadata:\n  \
         name: s-applied\nspec:\n  source:\n    apiGroup: kubevirt.io\n    kind: VirtualMachine\n    \
         name: nope\n",
    );
    assert_eq!(
        (code, out.as_str()),
        (0, "virtualmachinesnapshot/s-applied created\n"),
        "{err}"
    );
    let applied: Value =
        serde_json::from_str(&cli.ok(&["get", "snapshot", "s-applied", "-n", ns, "-o", "json"]))
            .expect("snapshot JSON");
    assert_eq!(applied["status"]["phase"], "Failed", "{applied:#}");
}

/// The actors of the events of `history KIND NAME -n NS -o json` whose types are in `types`,
/// as `(event type, actor)`.
fn history_actors(
    cli: &Cli,
    kind: &str,
    name: &str,
    ns: &str,
    types: &[&str],
) -> Vec<(String, String)> {
    let history: Value =
        serde_json::from_str(&cli.ok(&["history", kind, name, "-n", ns, "-o", "json"]))
            .expect("history JSON");
    let mut out = Vec::new();
    for entry in history.as_array().expect("a list") {
        for event in entry["events"].as_array().expect("events") {
            let event = event.as_str().expect("an event type");
            if types.contains(&event) {
                out.push((
                    event.to_owned(),
                    entry["actor"].as_str().expect("actor").to_owned(),
                ));
            }
        }
    }
    out
}

/// A restore that waits for its target to stop is finished by the saga driver, on behalf of
/// whoever asked for it: every event it records (the VM's spec edit, the restore's start and
/// completion) carries the requester as actor, as when the restore runs at once.
#[test]
fn a_restore_finished_by_the_saga_driver_acts_for_its_requester() {
    let dir = tempfile::tempdir().expect("tempdir");
    let auth = dir.path().join("auth.yaml");
    vmplane_tests::write_auth_file(
        &auth,
        &[vmplane_tests::AuthToken {
            principal: "alice",
            token: "alice-token",
            roles: &[("edit", &["team-a"])],
        }],
    );
    let server = Server::start(
        &dir.path().join("data"),
        &["--auth", auth.to_str().expect("utf-8")],
    );
    let alice = Cli::new(&server).with_token("alice-token");
    let ns = "team-a";
    let larry = std::fs::read_to_string(example("vm.yaml"))
        .expect("examples/vm.yaml")
        .replace("name: demo", "name: larry")
        .replace("runStrategy: Manual", "runStrategy: Always");
    let (code, out, err) = alice.run_with_stdin(&["apply", "-f", "-", "-n", ns], &larry);
    assert_eq!(code, 0, "apply failed\nstdout: {out}\nstderr: {err}");
    let running = || {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let vm: Value =
                serde_json::from_str(&alice.ok(&["get", "vm", "larry", "-n", ns, "-o", "json"]))
                    .expect("VM JSON");
            if vm["status"]["printableStatus"] == "Running" {
                return;
            }
            assert!(Instant::now() < deadline, "larry not running:\n{vm:#}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    running();
    alice.ok(&["snapshot", "larry", "s1", "-n", ns]);
    alice.ok(&[
        "patch",
        "vm",
        "larry",
        "-n",
        ns,
        "-p",
        r#"{"spec":{"template":{"spec":{"domain":{"cpu":{"cores":2}}}}}}"#,
    ]);
    let out = alice.ok(&[
        "restore",
        "larry",
        "--snapshot",
        "s1",
        "--restore-name",
        "r1",
        "-n",
        ns,
    ]);
    assert_eq!(out, "virtualmachinerestore/r1 created (InProgress)\n");
    alice.ok(&["stop", "larry", "-n", ns]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r: Value =
            serde_json::from_str(&alice.ok(&["get", "restore", "r1", "-n", ns, "-o", "json"]))
                .expect("restore JSON");
        if r["status"]["complete"] == true {
            break;
        }
        assert!(Instant::now() < deadline, "r1 not complete:\n{r:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let vm: Value =
        serde_json::from_str(&alice.ok(&["get", "vm", "larry", "-n", ns, "-o", "json"]))
            .expect("VM JSON");
    assert_eq!(cores(&vm), 1, "restored: {vm:#}");

    // history: the VM's restore edit and the restore's own steps are alice's.
    let vm_edits = history_actors(&alice, "vm", "larry", ns, &["VmSpecEdited"]);
    assert_eq!(vm_edits.len(), 2, "the patch and the restore: {vm_edits:?}");
    for (event, actor) in &vm_edits {
        assert_eq!(actor, "alice", "{event} of vm larry");
    }
    let steps = history_actors(
        &alice,
        "restore",
        "r1",
        ns,
        &[
            "ObjectCreated",
            "RestoreTargetFoundRunning",
            "RestoreStarted",
            "RestoreCompleted",
        ],
    );
    assert_eq!(steps.len(), 4, "{steps:?}");
    for (event, actor) in &steps {
        assert_eq!(actor, "alice", "{event} of restore r1");
    }

    // audit: not one event of the namespace is the driver's.
    let audit: Value =
        serde_json::from_str(&alice.ok(&["audit", "-n", ns, "-o", "json"])).expect("audit JSON");
    let records = audit.as_array().expect("a list");
    for event in ["VmSpecEdited", "RestoreStarted", "RestoreCompleted"] {
        assert!(
            records.iter().any(|r| r["event"] == event),
            "{event} not in the audit:\n{audit:#}"
        );
    }
    for r in records {
        assert_ne!(r["actor"], "system:saga-driver", "{r:#}");
    }
    let by_alice: Value =
        serde_json::from_str(&alice.ok(&["audit", "-n", ns, "--actor", "alice", "-o", "json"]))
            .expect("audit JSON");
    assert!(
        by_alice
            .as_array()
            .expect("a list")
            .iter()
            .any(|r| r["event"] == "RestoreCompleted"),
        "{by_alice:#}"
    );
}
