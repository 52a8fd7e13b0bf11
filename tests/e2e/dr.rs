//! The disaster-recovery drill: a workload through the CLI, `admin backup`, wipe, `admin
//! restore`, a server on the restored directory serving the same objects, history and audit;
//! a point-in-time restore; a tampered backup refused; `admin verify` on good and damaged
//! directories.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use vmplane_store::{AppendRequest, EventLog, ExpectedRevision, ProposedEvent};
use vmplane_tests::{Cli, Server, run_cli};

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

/// An object without its time-dependent status.
fn stable(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("status");
    }
    if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
        for item in items {
            if let Some(o) = item.as_object_mut() {
                o.remove("status");
            }
        }
    }
    v
}

fn vm(name: &str, memory: &str) -> String {
    format!(
        "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: {name}
spec:
  runStrategy: Manual
  template:
    spec:
      domain:
        memory:
          guest: {memory}
"
    )
}

fn apply(cli: &Cli, ns: &str, manifest: &str) {
    let (code, out, err) = cli.run_with_stdin(&["apply", "-n", ns, "-f", "-"], manifest);
    assert_eq!(code, 0, "apply failed: {out}\n{err}");
}

/// Everything a client can see that must survive a restore.
fn observe(cli: &Cli, ns: &str, names: &[&str]) -> Vec<Value> {
    let mut seen = vec![stable(json(
        &cli.ok(&["get", "vms", "-n", ns, "-o", "json"]),
    ))];
    for name in names {
        seen.push(json(
            &cli.ok(&["history", "vm", name, "-n", ns, "-o", "json"]),
        ));
    }
    seen.push(json(&cli.ok(&["audit", "-A", "-o", "json"])));
    seen
}

fn head_of(cli: &Cli, ns: &str) -> u64 {
    let list = json(&cli.ok(&["get", "vms", "-n", ns, "-o", "json"]));
    list["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .parse()
        .expect("a number")
}

fn admin(args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["admin"];
    all.extend_from_slice(args);
    run_cli(&all)
}

fn ok(args: &[&str]) -> String {
    let (code, out, err) = admin(args);
    assert_eq!(code, 0, "vmplane admin {args:?} failed:\n{out}\n{err}");
    out
}

#[test]
fn backup_restore_drill() {
    let root = tempfile::tempdir().expect("tempdir");
    let data = root.path().join("data");
    let backup = root.path().join("vmplane.backup");
    let ns = "dr";
    let names = ["dr-a", "dr-b", "dr-c", "dr-d"];

    let server = Server::start(&data, &["--hypervisor", "none"]);
    let cli = Cli::new(&server);
    for name in &names {
        apply(&cli, ns, &vm(name, "128Mi"));
    }
    apply(&cli, ns, &vm("dr-a", "256Mi"));
    cli.ok(&["start", "dr-b", "-n", ns]);
    // The point-in-time target: the state after these first steps.
    let p = head_of(&cli, ns);
    let at_p: Vec<(String, Value)> = names
        .iter()
        .map(|n| {
            let at = p.to_string();
            let v = cli.ok(&["get", "vm", n, "-n", ns, "--at-position", &at, "-o", "json"]);
            ((*n).to_string(), stable(json(&v)))
        })
        .collect();
    apply(&cli, ns, &vm("dr-c", "512Mi"));
    cli.ok(&["start", "dr-c", "-n", ns]);
    // Without a hypervisor nothing runs, so `stop` is refused: its refusal is not an event.
    assert_ne!(cli.run(&["stop", "dr-b", "-n", ns]).0, 0);
    cli.ok(&["delete", "vm", "dr-d", "-n", ns]);
    apply(&cli, ns, &vm("dr-e", "128Mi"));
    let before = observe(&cli, ns, &["dr-a", "dr-b", "dr-c", "dr-e"]);
    let full_head = head_of(&cli, ns);
    assert!(full_head > p);

    let out = Cli::new(&server).ok(&["admin", "backup", "--out", backup.to_str().unwrap()]);
    assert!(out.contains(&format!("{full_head} events")), "{out}");
    assert!(!root.path().join("vmplane.backup.tmp").exists());
    server.terminate(Duration::from_secs(20));

    // Wipe, restore, serve.
    std::fs::remove_dir_all(&data).expect("wipe");
    let from = backup.to_str().unwrap();
    let out = ok(&["restore", "--from", from, "--data", data.to_str().unwrap()]);
    assert!(
        out.contains(&format!("restored {full_head} of {full_head} events")),
        "{out}"
    );
    let out = ok(&["verify", "--data", data.to_str().unwrap()]);
    assert!(out.starts_with(&format!("ok: {full_head} events")), "{out}");
    // Restoring over a non-empty directory is refused.
    let (code, _, err) = admin(&["restore", "--from", from, "--data", data.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("not empty"), "{err}");

    let server = Server::start(&data, &["--hypervisor", "none"]);
    let cli = Cli::new(&server);
    let after = observe(&cli, ns, &["dr-a", "dr-b", "dr-c", "dr-e"]);
    assert_eq!(before, after, "the restored server serves something else");
    assert_eq!(head_of(&cli, ns), full_head);
    // New writes continue after the restored head.
    apply(&cli, ns, &vm("dr-f", "128Mi"));
    assert_eq!(head_of(&cli, ns), full_head + 1);
    server.terminate(Duration::from_secs(20));

    // Point-in-time restore at P: exactly the state at P.
    let pit = root.path().join("pit");
    let at = p.to_string();
    let out = ok(&[
        "restore",
        "--from",
        from,
        "--data",
        pit.to_str().unwrap(),
        "--to-position",
        &at,
    ]);
    assert!(out.contains(&format!("cut at position {p}")), "{out}");
    let marker: Value =
        serde_json::from_slice(&std::fs::read(pit.join("restore.json")).expect("marker"))
            .expect("marker JSON");
    assert_eq!(marker["cut_position"], p);
    ok(&["verify", "--data", pit.to_str().unwrap()]);
    let server = Server::start(&pit, &["--hypervisor", "none"]);
    let cli = Cli::new(&server);
    assert_eq!(head_of(&cli, ns), p);
    for (name, expected) in &at_p {
        let now = stable(json(&cli.ok(&["get", "vm", name, "-n", ns, "-o", "json"])));
        assert_eq!(&now, expected, "{name} at position {p}");
    }
    let (code, _, _) = cli.run(&["get", "vm", "dr-e", "-n", ns]);
    assert_ne!(code, 0, "dr-e was created after position {p}");
    server.terminate(Duration::from_secs(20));

    // A tampered backup is refused and leaves nothing behind.
    let mut bytes = std::fs::read(&backup).expect("read backup");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    let tampered = root.path().join("tampered.backup");
    std::fs::write(&tampered, bytes).expect("write");
    let bad = root.path().join("bad");
    let (code, _, err) = admin(&[
        "restore",
        "--from",
        tampered.to_str().unwrap(),
        "--data",
        bad.to_str().unwrap(),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("damaged") || err.contains("broken"), "{err}");
    assert!(!bad.exists());
    let leftovers: Vec<_> = std::fs::read_dir(root.path())
        .expect("ls")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // Verify names the damaged position.
    damage_payload(&pit);
    let (code, _, err) = admin(&["verify", "--data", pit.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains(&format!("position {}", p + 1)), "{err}");
}

/// Appends an event whose payload does not decode as its type says.
fn damage_payload(data: &Path) {
    let log = vmplane_store::SledLog::open(data).expect("open");
    let event = ProposedEvent {
        id: uuid::Uuid::now_v7(),
        event_type: "VmCreated".into(),
        schema_version: 2,
        payload: b"not an rkyv archive".to_vec(),
        actor: "test".into(),
        correlation_id: uuid::Uuid::now_v7(),
        causation_id: None,
    };
    log.append(AppendRequest::new(
        "vm/dr/garbage",
        ExpectedRevision::Any,
        vec![event],
    ))
    .expect("append");
}

#[test]
fn backup_needs_the_admin_role() {
    let root = tempfile::tempdir().expect("tempdir");
    let auth = root.path().join("auth.yaml");
    vmplane_tests::write_auth_file(
        &auth,
        &[vmplane_tests::AuthToken {
            principal: "viewer",
            token: "viewer-token",
            roles: &[("view", &["default"])],
        }],
    );
    let server = Server::start(
        &root.path().join("data"),
        &["--hypervisor", "none", "--auth", auth.to_str().unwrap()],
    );
    let out = root.path().join("b");
    let err = Cli::new(&server).with_token("viewer-token").fails(&[
        "admin",
        "backup",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(err.contains("permission denied"), "{err}");
    assert!(!out.exists());
}
