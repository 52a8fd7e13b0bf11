//! The disaster-recovery drill: a workload through the CLI, `admin backup`, wipe, `admin
//! restore`, a server on the restored directory serving the same objects, history and audit;
//! a point-in-time restore; a tampered backup refused; `admin verify` on good and damaged
//! directories.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use vmplane_gateway::pb;
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
    vmplane_tests::vm_manifest(name, memory)
}

fn apply(cli: &Cli, ns: &str, manifest: &str) {
    cli.apply_in(ns, manifest);
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
    // Restoring over an existing directory is refused, and touches nothing.
    let (code, _, err) = admin(&["restore", "--from", from, "--data", data.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("already exists"), "{err}");
    let out = ok(&["verify", "--data", data.to_str().unwrap()]);
    assert!(out.starts_with(&format!("ok: {full_head} events")), "{out}");

    let server = Server::start(&data, &["--hypervisor", "none"]);
    let cli = Cli::new(&server);
    let after = observe(&cli, ns, &["dr-a", "dr-b", "dr-c", "dr-e"]);
    assert_eq!(before, after, "the restored server serves something else");
    assert_eq!(head_of(&cli, ns), full_head);
    // New writes continue after the restored head.
    apply(&cli, ns, &vm("dr-f", "128Mi"));
    assert_eq!(head_of(&cli, ns), full_head + 1);
    server.terminate(Duration::from_secs(20));
    // The instants `--to-time` is given below: when P and P+1 were recorded (the restored log
    // keeps the original times).
    let (time_p, time_next) = {
        let log = vmplane_store::SledLog::open(&data).expect("open the restored log");
        let at = |position: u64| {
            log.read_event(vmplane_store::Position(position))
                .expect("read")
                .expect("an event")
                .recorded_at
                .0
        };
        (at(p), at(p + 1))
    };
    assert!(time_next > time_p, "P and P+1 share an instant");
    let rfc3339 = |ns: i64| {
        chrono::DateTime::from_timestamp_nanos(ns)
            .to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
    };

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
    // The positions after P hold the restore's void events: a list reads at P, the last
    // position not voided (a watch from a voided one is refused).
    assert_eq!(head_of(&cli, ns), p);
    assert!(full_head > p);
    for (name, expected) in &at_p {
        let now = stable(json(&cli.ok(&["get", "vm", name, "-n", ns, "-o", "json"])));
        assert_eq!(&now, expected, "{name} at position {p}");
    }
    let (code, _, _) = cli.run(&["get", "vm", "dr-e", "-n", ns]);
    assert_ne!(code, 0, "dr-e was created after position {p}");
    server.terminate(Duration::from_secs(20));

    // Point-in-time restore to an instant: the last event recorded at or before it is kept —
    // at P's own instant, and just before P+1's, the cut is P and the state is the state at P.
    for (i, instant) in [time_p, time_next - 1].into_iter().enumerate() {
        let target = root.path().join(format!("pit-time-{i}"));
        let when = rfc3339(instant);
        let out = ok(&[
            "restore",
            "--from",
            from,
            "--data",
            target.to_str().unwrap(),
            "--to-time",
            &when,
        ]);
        assert!(
            out.contains(&format!("cut at position {p}")),
            "--to-time {when}: {out}"
        );
        ok(&["verify", "--data", target.to_str().unwrap()]);
        if i == 0 {
            let server = Server::start(&target, &["--hypervisor", "none"]);
            let cli = Cli::new(&server);
            for (name, expected) in &at_p {
                let now = stable(json(&cli.ok(&["get", "vm", name, "-n", ns, "-o", "json"])));
                assert_eq!(&now, expected, "{name} restored to {when}");
            }
            server.terminate(Duration::from_secs(20));
        }
    }
    // An instant that is not RFC 3339 is refused naming the flag, and nothing is created.
    let never = root.path().join("never");
    let (code, _, err) = admin(&[
        "restore",
        "--from",
        from,
        "--data",
        never.to_str().unwrap(),
        "--to-time",
        "yesterday",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("--to-time"), "{err}");
    assert!(!never.exists());

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
    assert!(
        err.contains(&format!("position {}", full_head + 1)),
        "{err}"
    );
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

/// Opens a watch of every namespace after `from`.
async fn open_watch(
    server: &Server,
    from: u64,
) -> Result<tonic::Streaming<pb::WatchEvent>, tonic::Status> {
    crate::watch_all(server, None, Some(from))
        .await
        .map(tonic::Response::into_inner)
}

/// `admin verify`'s line without the restore marker (which names each restore's own epoch).
fn verified(data: &Path) -> String {
    let out = ok(&["verify", "--data", data.to_str().unwrap()]);
    out.split(", restored (")
        .next()
        .unwrap_or("")
        .trim()
        .to_owned()
}

#[test]
fn a_point_in_time_restore_never_hands_out_a_position_a_watcher_saw() {
    let root = tempfile::tempdir().expect("tempdir");
    let data = root.path().join("data");
    let backup = root.path().join("first.backup");
    let ns = "dr-watch";

    let server = Server::start(&data, &["--hypervisor", "none"]);
    let cli = Cli::new(&server);
    apply(&cli, ns, &vm("w-a", "128Mi"));
    apply(&cli, ns, &vm("w-b", "128Mi"));
    let p = head_of(&cli, ns);
    apply(&cli, ns, &vm("w-c", "128Mi"));
    apply(&cli, ns, &vm("w-a", "256Mi"));
    cli.ok(&["start", "w-b", "-n", ns]);
    let l = head_of(&cli, ns);
    assert!(l >= p + 3, "p {p}, l {l}");
    // A client watches past P: it holds position x. (Each phase has its own runtime, dropped
    // with its connections before the server is asked to stop.)
    let x = crate::rt().block_on(async {
        let mut stream = open_watch(&server, p).await.expect("watch");
        crate::next_event(&mut stream).await.position
    });
    assert!(x > p && x <= l, "p {p}, x {x}, l {l}");
    Cli::new(&server).ok(&["admin", "backup", "--out", backup.to_str().unwrap()]);
    server.terminate(Duration::from_secs(20));

    // Restore as of P.
    let pit = root.path().join("pit");
    let at = p.to_string();
    let from = backup.to_str().unwrap();
    let out = ok(&[
        "restore",
        "--from",
        from,
        "--data",
        pit.to_str().unwrap(),
        "--to-position",
        &at,
    ]);
    assert!(
        out.contains(&format!("restored {p} of {l} events")),
        "{out}"
    );
    assert!(
        out.contains(&format!("positions {}..={l} voided", p + 1)),
        "{out}"
    );
    let marker: Value =
        serde_json::from_slice(&std::fs::read(pit.join("restore.json")).expect("marker"))
            .expect("marker JSON");
    let epoch = marker["epoch"].as_str().expect("epoch").to_owned();
    assert_eq!(marker["cut_position"], p);
    assert_eq!(marker["void_stream"], format!("system/restore/{epoch}"));
    // The log is gapless and chained through the void events, and they decode.
    assert!(
        verified(&pit).starts_with(&format!("ok: {l} events, head position {l}")),
        "{}",
        verified(&pit)
    );

    let server = Server::start(&pit, &["--hypervisor", "none"]);
    let cli = Cli::new(&server);
    let rt = crate::rt();
    // A list reads at the last position not voided, the cut.
    assert_eq!(head_of(&cli, ns), p);
    // Gone: every voided position, the watcher's included.
    for gone in [p + 1, x, l] {
        let err = rt
            .block_on(open_watch(&server, gone))
            .err()
            .unwrap_or_else(|| panic!("a watch from voided position {gone} was accepted"));
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
        let message = err.message();
        assert!(message.contains(&epoch), "{message}");
        assert!(
            message.contains(&format!("cut the log at position {p}")),
            "{message}"
        );
        assert!(message.contains("re-list"), "{message}");
    }
    // A watcher at P continues, and the next position it sees is above everything the old
    // server handed out.
    let mut resumed = rt.block_on(open_watch(&server, p)).expect("a watch from P");
    apply(&cli, ns, &vm("w-d", "128Mi"));
    let next = rt.block_on(crate::next_event(&mut resumed));
    assert_eq!(next.position, l + 1, "{next:?}");
    assert_eq!(next.name, "w-d");
    assert_eq!(head_of(&cli, ns), l + 1);
    // The state is the one at P plus the new write.
    let (code, _, _) = cli.run(&["get", "vm", "w-c", "-n", ns]);
    assert_ne!(code, 0, "w-c was created after position {p}");

    drop(resumed);
    drop(rt);

    // The void events are ordinary events: a backup of the restored log carries them, and a
    // restore of that backup reproduces the log exactly.
    let second = root.path().join("second.backup");
    Cli::new(&server).ok(&["admin", "backup", "--out", second.to_str().unwrap()]);
    server.terminate(Duration::from_secs(20));
    let again = root.path().join("again");
    let out = ok(&[
        "restore",
        "--from",
        second.to_str().unwrap(),
        "--data",
        again.to_str().unwrap(),
    ]);
    assert!(
        out.contains(&format!("restored {0} of {0} events", l + 1)),
        "{out}"
    );
    let (a, b) = (verified(&pit), verified(&again));
    assert!(a.starts_with(&format!("ok: {} events", l + 1)), "{a}");
    assert_eq!(
        a, b,
        "the second restore differs from the log it was backed up from"
    );
    let server = Server::start(&again, &["--hypervisor", "none"]);
    let err = crate::rt()
        .block_on(open_watch(&server, x))
        .expect_err("still gone after a second restore");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    server.terminate(Duration::from_secs(20));
}

#[test]
fn one_restore_at_a_time_per_data_directory_and_never_over_a_used_one() {
    let root = tempfile::tempdir().expect("tempdir");
    let backup = root.path().join("b.backup");
    let server = Server::start(&root.path().join("data"), &["--hypervisor", "none"]);
    apply(&Cli::new(&server), "dr-lock", &vm("l-a", "128Mi"));
    Cli::new(&server).ok(&["admin", "backup", "--out", backup.to_str().unwrap()]);
    server.terminate(Duration::from_secs(20));
    let from = backup.to_str().unwrap();
    let leftovers = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(root.path())
            .expect("ls")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp-") || n.contains("restore-lock"))
            .collect();
        names.sort();
        names
    };

    // Another process is restoring into `target` (this one, through the same lock).
    let target = root.path().join("target");
    let lock = vmplane_gateway::dr::RestoreLock::acquire(&target).expect("lock");
    // A staging directory as a crashed restore leaves it.
    let stale = root
        .path()
        .join("target.tmp-0123456789abcdef0123456789abcdef");
    std::fs::create_dir(&stale).expect("stale");
    std::fs::write(stale.join("db"), b"half a log").expect("stale file");
    let (code, _, err) = admin(&[
        "restore",
        "--from",
        from,
        "--data",
        target.to_str().unwrap(),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("another restore into it is running"), "{err}");
    assert!(
        err.contains(&format!("process {}", std::process::id())),
        "{err}"
    );
    assert!(!target.exists());
    assert!(stale.exists(), "a refused restore touches nothing");
    drop(lock);
    assert_eq!(
        leftovers(),
        vec!["target.tmp-0123456789abcdef0123456789abcdef"]
    );

    // Once the lock is free, the restore runs, and clears the crashed one's staging directory.
    let out = ok(&[
        "restore",
        "--from",
        from,
        "--data",
        target.to_str().unwrap(),
    ]);
    assert!(out.contains("restored"), "{out}");
    assert!(leftovers().is_empty(), "{:?}", leftovers());
    ok(&["verify", "--data", target.to_str().unwrap()]);

    // An existing directory that holds anything is refused and left as it was (an empty one is
    // a target: `dr_offline`).
    let used = root.path().join("used");
    std::fs::create_dir(&used).expect("mkdir");
    std::fs::write(used.join("keep.me"), b"mine").expect("write");
    let (code, _, err) = admin(&["restore", "--from", from, "--data", used.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("already exists and is not empty"), "{err}");
    assert_eq!(std::fs::read_dir(&used).expect("ls").count(), 1);
    assert!(leftovers().is_empty(), "{:?}", leftovers());
}

#[test]
fn verify_of_a_directory_a_server_holds_says_to_stop_it_in_one_line() {
    for backend in ["sled", "file"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let _server = Server::start(&data, &["--hypervisor", "none", "--backend", backend]);
        let (code, _, err) = admin(&["verify", "--data", data.to_str().expect("utf-8")]);
        assert_ne!(code, 0);
        let line = vmplane_tests::one_error_line(&err);
        assert!(
            line.contains("in use by another process") && line.contains("stop it first"),
            "{backend}: {line}"
        );
        assert!(!line.contains("WouldBlock"), "no raw OS error: {line}");
    }
}

/// Runs `vmplane serve ARGS` expecting it to refuse at once; returns its stderr. Killed (and
/// the test failed) if it is still running after 20 s.
fn serve_refused(args: &[&str]) -> String {
    let mut child = std::process::Command::new(vmplane_tests::vmplane_bin())
        .arg("serve")
        .args(args)
        .args(["--listen", "127.0.0.1:0", "--hypervisor", "none"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn vmplane serve");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            assert!(!status.success(), "serve {args:?} was expected to refuse");
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
                .expect("stderr");
            return err;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("serve {args:?} did not refuse within 20 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_sled_log_moves_to_the_file_backend_through_backup_and_restore_and_serves_the_same() {
    let root = tempfile::tempdir().expect("tempdir");
    let (sled_dir, file_dir) = (root.path().join("sled"), root.path().join("file"));
    let backup = root.path().join("vmplane.backup");
    let ns = "move";
    let names = ["mv-a", "mv-b"];

    let server = Server::start(&sled_dir, &["--hypervisor", "none"]);
    let cli = Cli::new(&server);
    for name in &names {
        apply(&cli, ns, &vm(name, "128Mi"));
    }
    apply(&cli, ns, &vm("mv-a", "256Mi"));
    cli.ok(&["start", "mv-b", "-n", ns]);
    let before = observe(&cli, ns, &names);
    let head = head_of(&cli, ns);
    cli.ok(&["admin", "backup", "--out", backup.to_str().unwrap()]);
    server.terminate(Duration::from_secs(20));

    let (from, data) = (backup.to_str().unwrap(), file_dir.to_str().unwrap());
    let out = ok(&[
        "restore",
        "--from",
        from,
        "--data",
        data,
        "--backend",
        "file",
    ]);
    assert!(out.contains("(file log, head"), "{out}");
    assert!(file_dir.join("events.vpl").exists());
    assert!(
        !file_dir.join("db").exists(),
        "no sled files in a file log's directory"
    );
    let out = ok(&["verify", "--data", data]);
    assert!(out.starts_with(&format!("ok: {head} events")), "{out}");
    let (code, _, err) = admin(&[
        "restore",
        "--from",
        from,
        "--data",
        "x",
        "--backend",
        "etcd",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("--backend etcd"), "{err}");

    // Each directory is served by its own backend only, and the refusal says which it holds.
    let err = serve_refused(&["--data", data]);
    assert!(err.contains("holds a file log, not a sled one"), "{err}");
    let err = serve_refused(&["--data", sled_dir.to_str().unwrap(), "--backend", "file"]);
    assert!(err.contains("holds a sled log, not a file one"), "{err}");

    let server = Server::start(&file_dir, &["--hypervisor", "none", "--backend", "file"]);
    let cli = Cli::new(&server);
    assert_eq!(
        observe(&cli, ns, &names),
        before,
        "the file log serves something else"
    );
    apply(&cli, ns, &vm("mv-c", "128Mi"));
    cli.ok(&["delete", "vm", "mv-a", "-n", ns]);
    let grown = observe(&cli, ns, &["mv-b", "mv-c"]);
    assert_eq!(head_of(&cli, ns), head + 2);
    server.terminate(Duration::from_secs(20));

    // Restarted: the indexes rebuilt from the file serve what was written before.
    let server = Server::start(&file_dir, &["--hypervisor", "none", "--backend", "file"]);
    let cli = Cli::new(&server);
    assert_eq!(observe(&cli, ns, &["mv-b", "mv-c"]), grown);
    server.terminate(Duration::from_secs(20));
    let out = ok(&["verify", "--data", data]);
    assert!(
        out.starts_with(&format!("ok: {} events", head + 2)),
        "{out}"
    );
}

/// A VM carrying ~1 MiB of annotations: two values just under the 512 KiB string limit, the
/// whole object under the 1 MiB manifest limit.
fn heavy_vm(name: &str) -> String {
    let ballast = |c: char| c.to_string().repeat(500 * 1024);
    format!(
        "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: {name}
  annotations:
    dr.vmplane.io/ballast-a: \"{}\"
    dr.vmplane.io/ballast-b: \"{}\"
spec:
  runStrategy: Manual
  template:
    spec:
      domain:
        memory:
          guest: 128Mi
",
        ballast('a'),
        ballast('b')
    )
}

/// The log's head, as `Admin/LogInfo` reports it (a list of objects this large would be more
/// than one response may hold).
fn log_head(server: &Server) -> u64 {
    crate::rt().block_on(async {
        pb::admin_client::AdminClient::new(crate::channel(server).await)
            .log_info(pb::LogInfoRequest {})
            .await
            .expect("log info")
            .into_inner()
            .head_position
    })
}

#[test]
fn a_log_larger_than_one_response_backs_up_in_bounded_chunks_and_restores() {
    const VMS: usize = 72;
    let root = tempfile::tempdir().expect("tempdir");
    let data = root.path().join("data");
    let backup = root.path().join("heavy.backup");
    let ns = "dr-heavy";
    let names: Vec<String> = (0..VMS).map(|i| format!("heavy-{i:02}")).collect();

    let server = Server::start(&data, &["--hypervisor", "none"]);
    let cli = Cli::new(&server);
    // Two processes, each applying half the VMs as one multi-document stream.
    std::thread::scope(|s| {
        for half in names.chunks(VMS.div_ceil(2)) {
            let cli = &cli;
            s.spawn(move || {
                let stream: Vec<String> = half.iter().map(|n| heavy_vm(n)).collect();
                apply(cli, ns, &stream.join("---\n"));
            });
        }
    });
    let head = log_head(&server);
    assert_eq!(head, VMS as u64, "one event per VM");
    let get =
        |cli: &Cli, name: &str| stable(json(&cli.ok(&["get", "vm", name, "-n", ns, "-o", "json"])));
    let (first, last) = (&names[0], &names[VMS - 1]);
    let before = (get(&cli, first), get(&cli, last));
    let ballast = before.0["metadata"]["annotations"]["dr.vmplane.io/ballast-a"]
        .as_str()
        .map(str::len);
    assert_eq!(ballast, Some(500 * 1024));

    let out = cli.ok(&["admin", "backup", "--out", backup.to_str().unwrap()]);
    assert!(out.contains(&format!("{head} events")), "{out}");
    // The log is more than one response may hold (the server's 64 MiB): the backup came in
    // several messages.
    let bytes = std::fs::metadata(&backup).expect("backup written").len();
    assert!(
        bytes > 64 << 20,
        "only {bytes} bytes: the test proves nothing"
    );
    server.terminate(Duration::from_secs(20));

    let restored = root.path().join("restored");
    let out = ok(&[
        "restore",
        "--from",
        backup.to_str().unwrap(),
        "--data",
        restored.to_str().unwrap(),
    ]);
    assert!(
        out.contains(&format!("restored {head} of {head} events")),
        "{out}"
    );
    let out = ok(&["verify", "--data", restored.to_str().unwrap()]);
    assert!(out.starts_with(&format!("ok: {head} events")), "{out}");

    let server = Server::start(&restored, &["--hypervisor", "none"]);
    let cli = Cli::new(&server);
    assert_eq!(log_head(&server), head);
    assert_eq!(
        (get(&cli, first), get(&cli, last)),
        before,
        "the restored server serves something else"
    );
    server.terminate(Duration::from_secs(20));
}
