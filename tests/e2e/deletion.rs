//! Deleting a VM whose VMI runs: KubeVirt keeps the VM (deletionTimestamp, printableStatus
//! `Terminating`) until its VMI is gone, then the VM goes. Meanwhile its name is not free
//! (an apply is refused as AlreadyExists, saying what to wait for) and no other write is taken;
//! the log says who asked and when the deletion ended. Also: a VMI that never ran is removed,
//! not recorded `Succeeded`, and a deleted VM gets no crash-loop backoff; a stop of a Manual VM
//! removes its VMI.
//!
//! libvirt's test driver powers a guest off the moment it is asked to, so the reconciler ends a
//! deletion in the pass the delete wakes. To look at a VM while it is Terminating, the VM is run
//! by a server with the test driver, deleted on the same data directory served with
//! `--hypervisor none` (no reconciler: it stays Terminating), and a server with the test driver
//! again finishes the deletion.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use vmplane_tests::{AuthToken, Cli, Server, free_port, scrape, write_auth_file};

const ALICE: &str = "deletion-alice-token";
const NS: &str = "deletion";

const Q1: &str = "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: q1}
spec:
  runStrategy: Always
  template:
    spec:
      terminationGracePeriodSeconds: 8
      domain:
        memory: {guest: 64Mi}
        devices: {}
";

const KUBEVIRT: &str = "apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata: {name: kubevirt, namespace: kubevirt}
spec:
  configuration:
    developerConfiguration:
      featureGates: [Snapshot]
";

const SNAPSHOT: &str = "apiVersion: snapshot.kubevirt.io/v1beta1
kind: VirtualMachineSnapshot
metadata: {name: snap-q1}
spec:
  source: {apiGroup: kubevirt.io, kind: VirtualMachine, name: q1}
";

/// A VM no node has room for: its VMI stays `Scheduling`, Unschedulable.
const HUGE: &str = "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: huge}
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        memory: {guest: 64Ti}
        devices: {}
";

const MANUAL: &str = "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: rs-manual}
spec:
  runStrategy: Manual
  template:
    spec:
      domain:
        memory: {guest: 64Mi}
        devices: {}
";

fn json(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// `get KIND NAME -n NS -o json`, or `None` when it is not found.
fn get(cli: &Cli, kind: &str, name: &str) -> Option<Value> {
    let (code, out, err) = cli.run(&["get", kind, name, "-n", NS, "-o", "json"]);
    if code != 0 {
        assert!(err.contains("not found"), "{err}");
        return None;
    }
    Some(json(&out))
}

/// Polls `check` every 100 ms for up to 30 s.
#[track_caller]
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `history vm NAME -n NS -o json`: `(actor, events, summary)` per revision.
fn history(cli: &Cli, name: &str) -> Vec<(String, Vec<String>, String)> {
    let out = cli.ok(&["history", "vm", name, "-n", NS, "-o", "json"]);
    json(&out)
        .as_array()
        .expect("a list")
        .iter()
        .map(|h| {
            (
                h["actor"].as_str().unwrap_or_default().to_owned(),
                h["events"]
                    .as_array()
                    .expect("events")
                    .iter()
                    .map(|e| e.as_str().unwrap_or_default().to_owned())
                    .collect(),
                h["summary"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn serve(data: &Path, auth: &Path, extra: &[&str]) -> (Server, Cli) {
    let mut args = vec!["--auth", auth.to_str().expect("utf-8")];
    args.extend_from_slice(extra);
    let server = Server::start(data, &args);
    let cli = Cli::new(&server).with_token(ALICE);
    (server, cli)
}

#[test]
fn a_running_vm_deleted_is_terminating_until_its_vmi_is_gone_and_its_name_is_not_free_meanwhile() {
    let dir = tempfile::tempdir().expect("tempdir");
    let auth = dir.path().join("auth.yaml");
    write_auth_file(
        &auth,
        &[AuthToken {
            principal: "alice",
            token: ALICE,
            roles: &[("admin", &[])],
        }],
    );
    let data = dir.path().join("data");

    // 1. With the test driver: q1 runs.
    let (server, cli) = serve(&data, &auth, &["--hypervisor", "test:///default"]);
    let (code, _, err) = cli.run_with_stdin(&["apply", "-f", "-"], KUBEVIRT);
    assert_eq!(code, 0, "{err}");
    for manifest in [Q1, HUGE, MANUAL] {
        cli.apply_in(NS, manifest);
    }
    cli.ok(&[
        "wait",
        "vm",
        "q1",
        "-n",
        NS,
        "--for",
        "jsonpath={.status.printableStatus}=Running",
        "--timeout",
        "60s",
    ]);

    // A stop of a Manual VM removes its VMI (KubeVirt's stop deletes it).
    cli.ok(&["start", "rs-manual", "-n", NS]);
    cli.ok(&[
        "wait",
        "vmi",
        "rs-manual",
        "-n",
        NS,
        "--for",
        "condition=Ready",
        "--timeout",
        "60s",
    ]);
    cli.ok(&["stop", "rs-manual", "-n", NS]);
    eventually("the stopped Manual VM's VMI to be removed", || {
        get(&cli, "vmi", "rs-manual").is_none()
    });
    let manual = get(&cli, "vm", "rs-manual").expect("the VM stays");
    assert_eq!(manual["status"]["printableStatus"], "Stopped");
    assert_eq!(manual["status"]["created"], false);

    // A VM that never got a node: deleted, its VMI is removed (no `Succeeded` for a VMI that
    // never ran) and no crash-loop backoff follows.
    cli.ok(&[
        "wait",
        "vm",
        "huge",
        "-n",
        NS,
        "--for",
        "jsonpath={.status.printableStatus}=ErrorUnschedulable",
        "--timeout",
        "60s",
    ]);
    cli.ok(&["delete", "vm", "huge", "-n", NS]);
    cli.ok(&[
        "wait",
        "vm",
        "huge",
        "-n",
        NS,
        "--for",
        "delete",
        "--timeout",
        "60s",
    ]);
    let rows = history(&cli, "huge");
    let events: Vec<&str> = rows
        .iter()
        .flat_map(|(_, events, _)| events.iter().map(String::as_str))
        .collect();
    assert!(
        !events.contains(&"VmStartBackoffScheduled")
            && !rows
                .iter()
                .any(|(_, _, summary)| summary.contains(" Succeeded")),
        "{rows:#?}"
    );
    let n = rows.len();
    assert_eq!(
        (rows[n - 2].0.as_str(), &rows[n - 2].1[..]),
        ("alice", &["VmDeletionRequested".to_owned()][..]),
        "{rows:#?}"
    );
    assert_eq!(
        (rows[n - 1].0.as_str(), &rows[n - 1].1[..]),
        (
            "system:reconciler",
            &["VmiRemoved".to_owned(), "VmDeleted".to_owned()][..]
        ),
        "{rows:#?}"
    );
    server.terminate(Duration::from_secs(30));

    // 2. Without a reconciler: the delete leaves q1 Terminating.
    let metrics = free_port();
    let listen = format!("127.0.0.1:{metrics}");
    let (server, cli) = serve(
        &data,
        &auth,
        &["--hypervisor", "none", "--metrics-listen", &listen],
    );
    assert_eq!(
        get(&cli, "vm", "q1").expect("q1")["status"]["printableStatus"],
        "Running"
    );
    assert_eq!(
        cli.ok(&["delete", "vm", "q1", "-n", NS]),
        "virtualmachine/q1 deleted\n"
    );
    let vm = get(&cli, "vm", "q1").expect("a Terminating VM is still there");
    assert_eq!(vm["status"]["printableStatus"], "Terminating", "{vm}");
    let since = vm["metadata"]["deletionTimestamp"]
        .as_str()
        .expect("a deletionTimestamp")
        .to_owned();
    assert!(
        chrono::DateTime::parse_from_rfc3339(&since).is_ok(),
        "{since}"
    );
    assert!(cli.ok(&["get", "vms", "-n", NS]).contains("Terminating"));
    assert_eq!(
        get(&cli, "vmi", "q1").expect("its VMI is still there")["status"]["phase"],
        "Running"
    );
    let text = scrape(metrics);
    assert!(
        text.contains(r#"vmplane_vms{status="Terminating"} 1"#),
        "{text}"
    );
    // A second delete is accepted and changes nothing.
    let before = vm["metadata"]["resourceVersion"].clone();
    cli.ok(&["delete", "vm", "q1", "-n", NS]);
    assert_eq!(
        get(&cli, "vm", "q1").expect("q1")["metadata"]["resourceVersion"],
        before
    );
    // Its name is not free: applying it again is refused, saying since when and what to do.
    let (code, _, err) = cli.run_with_stdin(&["apply", "-n", NS, "-f", "-"], Q1);
    assert_ne!(code, 0);
    assert_eq!(
        err.trim_end(),
        format!(
            "vmplane: error: already exists: VirtualMachine deletion/q1: metadata.name: \
             virtualmachines.kubevirt.io \"q1\" already exists and is being deleted (since \
             {since}; it goes once its VMI has stopped): wait until it is gone with `vmplane \
             wait --for=delete vm q1 -n deletion`, then apply again"
        )
    );
    // Nor is any other write taken.
    for (args, what) in [
        (vec!["start", "q1"], "a start request"),
        (vec!["stop", "q1"], "a stop request"),
        (vec!["restart", "q1"], "a restart request"),
        (vec!["label", "vm", "q1", "tier=gold"], "an edit"),
    ] {
        let mut args = args;
        args.extend(["-n", NS]);
        let line = cli.fails(&args);
        assert!(
            line.contains(&format!(
                "refused: VirtualMachine deletion/q1: virtualmachines.kubevirt.io \"q1\" is \
                 being deleted (since {since}; it goes once its VMI has stopped): {what} is \
                 refused"
            )),
            "{args:?}: {line}"
        );
    }
    let (code, _, err) = cli.run_with_stdin(&["apply", "-n", NS, "-f", "-"], SNAPSHOT);
    assert_ne!(code, 0);
    assert!(err.contains("a snapshot of it is refused"), "{err}");
    assert!(
        get(&cli, "snapshot", "snap-q1").is_none(),
        "nothing recorded"
    );
    assert_eq!(
        get(&cli, "vm", "q1").expect("q1")["metadata"]["resourceVersion"],
        before,
        "no refusal appended anything"
    );
    let rows = history(&cli, "q1");
    let last = rows.last().expect("rows");
    assert_eq!(
        (last.0.as_str(), &last.1[..]),
        ("alice", &["VmDeletionRequested".to_owned()][..])
    );
    drop(server);

    // 3. With the test driver again: the reconciler stops and removes the VMI, and q1 goes.
    let (_server, cli) = serve(&data, &auth, &["--hypervisor", "test:///default"]);
    cli.ok(&[
        "wait",
        "vm",
        "q1",
        "-n",
        NS,
        "--for",
        "delete",
        "--timeout",
        "60s",
    ]);
    assert!(get(&cli, "vm", "q1").is_none());
    assert!(get(&cli, "vmi", "q1").is_none());
    let rows = history(&cli, "q1");
    let asked = rows
        .iter()
        .position(|(_, events, _)| events == &["VmDeletionRequested"])
        .expect("the request");
    assert_eq!(rows[asked].0, "alice");
    let last = rows.last().expect("rows");
    assert_eq!(
        (last.0.as_str(), &last.1[..]),
        (
            "system:reconciler",
            &["VmiRemoved".to_owned(), "VmDeleted".to_owned()][..]
        ),
        "{rows:#?}"
    );
    assert!(
        rows[asked + 1..]
            .iter()
            .all(|(actor, events, _)| actor == "system:reconciler"
                && !events.iter().any(|e| e == "VmStartBackoffScheduled")),
        "{rows:#?}"
    );
    // The audit says who asked, and when it was asked for and when it ended.
    let audit = json(&cli.ok(&["audit", "-n", NS, "-o", "json"]));
    let entry = |event: &str| {
        audit
            .as_array()
            .expect("a list")
            .iter()
            .rfind(|e| e["name"] == "q1" && e["event"] == event)
            .cloned()
            .unwrap_or_else(|| panic!("no {event} of q1 in {audit:#}"))
    };
    let (requested, deleted) = (entry("VmDeletionRequested"), entry("VmDeleted"));
    assert_eq!(requested["actor"], "alice");
    assert_eq!(deleted["actor"], "system:reconciler");
    let time = |e: &Value| {
        chrono::DateTime::parse_from_rfc3339(e["time"].as_str().expect("time")).expect("RFC 3339")
    };
    assert!(time(&requested) <= time(&deleted));
    // The name is free again.
    let (code, out, err) = cli.run_with_stdin(&["apply", "-n", NS, "-f", "-"], Q1);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("created"), "{out}");
}
