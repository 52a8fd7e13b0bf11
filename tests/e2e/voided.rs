//! A point-in-time restore's voided positions, as clients of the restored server meet them:
//! a list's resourceVersion is always one a watch accepts (both backends, across restarts),
//! while the positions the original server handed out and the restore voided stay refused, by
//! watch and by time travel alike; `--as-of` a time the restore rewrote is refused too; the
//! cut is one `audit` entry (actor `system:restore`) that every reader of the audit sees; and a
//! watch that crosses the cut is told so when it opens.
//!
//! One original server makes one backup (`a`, `b` created, then `b` deleted: the deletion is
//! the position the restore cuts off); each test restores it into directories of its own.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use vmplane_gateway::pb;
use vmplane_tests::{AuthToken, Cli, Server, run_cli, write_auth_file};

const NS: &str = "voided";
const OPS: &str = "ops-voided-4b1e9c2d7a3f";
const VERA: &str = "vera-voided-8d2c6a1f0e5b";
const OTTO: &str = "otto-voided-1f7e3b9d5c2a";

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

fn vm(name: &str) -> String {
    vmplane_tests::vm_manifest(name, "128Mi")
}

fn apply(cli: &Cli, ns: &str, manifest: &str) {
    cli.apply_in(ns, manifest);
}

/// The resourceVersion of the list `args` (a `get ... -o json`).
fn list_version(cli: &Cli, args: &[&str]) -> u64 {
    let list = json(&cli.ok(args));
    list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_else(|| panic!("no resourceVersion in {list}"))
        .parse()
        .expect("a number")
}

/// The original server's log, backed up.
struct Original {
    backup: PathBuf,
    /// The position the restores cut at: `b` exists there.
    cut: u64,
    /// The backup's last position: `b`'s deletion.
    last: u64,
    /// When the event at `cut` was recorded (RFC 3339).
    cut_time: String,
    /// When `b`'s deletion was recorded (RFC 3339).
    deleted_time: String,
}

fn original() -> &'static Original {
    static ORIGINAL: OnceLock<Original> = OnceLock::new();
    ORIGINAL.get_or_init(|| {
        let dir = vmplane_tests::shared_dir();
        let server = Server::start(&dir.join("data"), &["--hypervisor", "none"]);
        let cli = Cli::new(&server);
        apply(&cli, NS, &vm("a"));
        apply(&cli, NS, &vm("b"));
        let cut = list_version(&cli, &["get", "vms", "-n", NS, "-o", "json"]);
        cli.ok(&["delete", "vm", "b", "-n", NS]);
        let last = list_version(&cli, &["get", "vms", "-n", NS, "-o", "json"]);
        assert!(last > cut, "cut {cut}, last {last}");
        let audit = json(&cli.ok(&["audit", "-n", NS, "-o", "json"]));
        let time_at = |position: u64| {
            audit
                .as_array()
                .expect("audit list")
                .iter()
                .find(|e| e["position"] == position)
                .and_then(|e| e["time"].as_str())
                .unwrap_or_else(|| panic!("no audit entry at {position}: {audit}"))
                .to_owned()
        };
        let (cut_time, deleted_time) = (time_at(cut), time_at(last));
        let backup = dir.join("original.backup");
        cli.ok(&["admin", "backup", "--out", backup.to_str().expect("utf-8")]);
        server.terminate(Duration::from_secs(20));
        Original {
            backup,
            cut,
            last,
            cut_time,
            deleted_time,
        }
    })
}

/// `admin restore --to-position CUT` of the original backup into `data` with `backend`; the
/// restore's epoch.
fn restore_cut(data: &Path, backend: &str) -> String {
    let o = original();
    let (code, out, err) = run_cli(&[
        "admin",
        "restore",
        "--from",
        o.backup.to_str().expect("utf-8"),
        "--data",
        data.to_str().expect("utf-8"),
        "--to-position",
        &o.cut.to_string(),
        "--backend",
        backend,
    ]);
    assert_eq!(code, 0, "restore failed:\n{out}\n{err}");
    let marker: Value =
        serde_json::from_slice(&std::fs::read(data.join("restore.json")).expect("marker"))
            .expect("marker JSON");
    marker["epoch"].as_str().expect("epoch").to_owned()
}

/// Asserts `err` is the refusal of a position or time the restore `epoch` voided.
#[track_caller]
fn assert_gone(message: &str, epoch: &str) {
    let o = original();
    assert!(message.contains("gone"), "{message}");
    assert!(message.contains(epoch), "{message}");
    assert!(
        message.contains(&format!("cut the log at position {}", o.cut)),
        "{message}"
    );
}

/// Every list of the restored server reads at a position its watch accepts: plain, paged and
/// across namespaces, before any write, on both backends, before and after a restart; the
/// positions the original server handed out and the restore voided stay refused; a watch from
/// the list's position continues with the first new write, without a gap or a repeat.
#[test]
fn a_list_after_a_point_in_time_restore_reads_at_a_position_its_watch_accepts() {
    let o = original();
    for backend in ["sled", "file"] {
        let root = tempfile::tempdir().expect("tempdir");
        let data = root.path().join(format!("restored-{backend}"));
        let epoch = restore_cut(&data, backend);
        let serve = ["--hypervisor", "none", "--backend", backend];
        let mut server = Server::start(&data, &serve);
        for round in ["started", "restarted"] {
            let cli = Cli::new(&server);
            let rt = crate::rt();
            let lists: [&[&str]; 4] = [
                &["get", "vms", "-n", NS, "-o", "json"],
                &["get", "vms", "-n", NS, "-o", "json", "--chunk-size", "1"],
                &["get", "vms", "-A", "-o", "json"],
                &["get", "vmis", "-A", "-o", "json"],
            ];
            for list in lists {
                let version = list_version(&cli, list);
                assert_eq!(
                    version,
                    o.cut,
                    "{backend}, {round}: {list:?} read at {version}, the restore voided {}..={}",
                    o.cut + 1,
                    o.last
                );
                rt.block_on(crate::watch_all(&server, None, Some(version)))
                    .unwrap_or_else(|e| {
                        panic!("{backend}, {round}: a watch from {list:?}'s {version}: {e:?}")
                    });
            }
            // The original server's positions after the cut are still gone.
            for gone in o.cut + 1..=o.last {
                let err = rt
                    .block_on(crate::watch_all(&server, None, Some(gone)))
                    .err()
                    .unwrap_or_else(|| panic!("{backend}: a watch from voided {gone} accepted"));
                assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
                assert_gone(err.message(), &epoch);
            }
            drop(rt);
            if round == "started" {
                server.terminate(Duration::from_secs(20));
                server = Server::start(&data, &serve);
            }
        }
        // List, then watch from the list's position: the next event is the next write.
        let cli = Cli::new(&server);
        let rt = crate::rt();
        let version = list_version(&cli, &["get", "vms", "-n", NS, "-o", "json"]);
        let mut watch = rt
            .block_on(crate::watch_all(&server, None, Some(version)))
            .expect("watch from the list's position")
            .into_inner();
        apply(&cli, NS, &vm("c"));
        let next = rt.block_on(crate::next_event(&mut watch));
        assert_eq!(
            (next.position, next.name.as_str()),
            (o.last + 1, "c"),
            "{next:?}"
        );
        assert_eq!(
            list_version(&cli, &["get", "vms", "-n", NS, "-o", "json"]),
            o.last + 1
        );
        drop(watch);
        drop(rt);
        server.terminate(Duration::from_secs(20));
    }
}

/// Time travel to a position the restore voided is refused as a watch from it is, with the same
/// explanation, for one object and for a list; `--as-of` a time the restore rewrote (from the
/// first voided event's time up to the restore) is refused the same way, while a time before
/// it, or after the restore, answers.
#[test]
fn time_travel_to_a_voided_position_or_a_rewritten_time_is_refused_like_a_watch() {
    let o = original();
    let root = tempfile::tempdir().expect("tempdir");
    let data = root.path().join("restored");
    let epoch = restore_cut(&data, "sled");
    let server = Server::start(&data, &["--hypervisor", "none"]);
    let cli = Cli::new(&server);
    let (last, cut) = (o.last.to_string(), o.cut.to_string());

    for args in [
        vec!["get", "vm", "b", "-n", NS, "--at-position", &last],
        vec![
            "get",
            "vm",
            "a",
            "-n",
            NS,
            "--at-position",
            &last,
            "-o",
            "json",
        ],
        vec!["get", "vms", "-n", NS, "--at-position", &last],
        vec!["get", "vms", "-A", "--at-position", &last, "-o", "json"],
        vec!["get", "vm", "b", "-n", NS, "--as-of", &o.deleted_time],
        vec!["get", "vms", "-n", NS, "--as-of", &o.deleted_time],
    ] {
        let line = cli.fails(&args);
        assert_gone(&line, &epoch);
        assert!(line.contains("re-list") || line.contains("as of"), "{line}");
    }
    // The same refusal over gRPC: FAILED_PRECONDITION, as a watch from the position gets.
    let rt = crate::rt();
    let status = rt
        .block_on(async {
            vmplane_gateway::pb::objects_client::ObjectsClient::new(crate::channel(&server).await)
                .get(pb::GetRequest {
                    r#ref: Some(pb::ObjectRef {
                        kind: "vm".into(),
                        namespace: NS.into(),
                        name: "b".into(),
                    }),
                    at: Some(pb::PointInTime {
                        at: Some(pb::point_in_time::At::Position(o.last)),
                    }),
                    ..Default::default()
                })
                .await
        })
        .expect_err("a read at a voided position");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    drop(rt);

    // At the cut, before the rewritten time and after the restore, `b` is there.
    let at_cut = json(&cli.ok(&[
        "get",
        "vm",
        "b",
        "-n",
        NS,
        "--at-position",
        &cut,
        "-o",
        "json",
    ]));
    assert_eq!(at_cut["metadata"]["name"], "b");
    let before = json(&cli.ok(&[
        "get",
        "vm",
        "b",
        "-n",
        NS,
        "--as-of",
        &o.cut_time,
        "-o",
        "json",
    ]));
    assert_eq!(before["metadata"]["name"], "b");
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
    let after = json(&cli.ok(&["get", "vm", "b", "-n", NS, "--as-of", &now, "-o", "json"]));
    assert_eq!(after["metadata"]["name"], "b");
    // A list as of after the restore reads at a position a watch accepts.
    assert_eq!(
        list_version(
            &cli,
            &["get", "vms", "-n", NS, "--as-of", &now, "-o", "json"]
        ),
        o.cut
    );
    server.terminate(Duration::from_secs(20));
}

/// The cut is one audit entry, by `system:restore`, naming the voided positions, the cut and
/// the restore, for an admin and for a reader of one namespace alike (it names no object), in
/// `audit -A`, `audit --actor system:restore` and a one-namespace audit, not under `--kind`; a
/// watch that crosses the cut says so in its response's metadata, one that starts after it
/// does not.
#[test]
fn the_cut_is_one_audit_entry_every_reader_sees_and_a_watch_across_it_is_told() {
    let o = original();
    let root = tempfile::tempdir().expect("tempdir");
    let data = root.path().join("restored");
    let epoch = restore_cut(&data, "sled");
    let auth = root.path().join("auth.yaml");
    write_auth_file(
        &auth,
        &[
            AuthToken {
                principal: "ops",
                token: OPS,
                roles: &[("admin", &[])],
            },
            AuthToken {
                principal: "vera",
                token: VERA,
                roles: &[("view", &[NS])],
            },
            AuthToken {
                principal: "otto",
                token: OTTO,
                roles: &[("view", &["elsewhere"])],
            },
        ],
    );
    let server = Server::start(
        &data,
        &[
            "--hypervisor",
            "none",
            "--auth",
            auth.to_str().expect("utf-8"),
        ],
    );
    let voided = format!("positions {}..={}", o.cut + 1, o.last);
    let cuts = |cli: &Cli, args: &[&str]| -> Vec<Value> {
        let mut all = vec!["audit", "-o", "json"];
        all.extend_from_slice(args);
        json(&cli.ok(&all))
            .as_array()
            .expect("audit list")
            .iter()
            .filter(|e| e["actor"] == "system:restore")
            .cloned()
            .collect()
    };
    for token in [OPS, VERA, OTTO] {
        let cli = Cli::new(&server).with_token(token);
        let all = cuts(&cli, &["-A"]);
        assert_eq!(all.len(), 1, "{token}: one entry for the cut: {all:?}");
        let entry = &all[0];
        assert_eq!(entry["event"], "LogPositionVoided", "{entry}");
        assert_eq!(entry["position"], o.cut + 1, "{entry}");
        assert_eq!(entry["namespace"], "", "{entry}");
        let summary = entry["summary"].as_str().expect("summary");
        assert!(summary.contains(&voided), "{summary}");
        assert!(summary.contains(&epoch), "{summary}");
        assert!(
            summary.contains(&format!("cut the log at position {}", o.cut)),
            "{summary}"
        );
        assert_eq!(
            cuts(&cli, &["-A", "--actor", "system:restore"]),
            all,
            "{token}"
        );
        assert!(cuts(&cli, &["-A", "--kind", "vm"]).is_empty(), "{token}");
        assert!(
            cuts(&cli, &["-A", "--since", &chrono::Utc::now().to_rfc3339()]).is_empty(),
            "{token}"
        );
    }
    // A reader of the namespace sees it in that namespace's audit too.
    let vera = Cli::new(&server).with_token(VERA);
    assert_eq!(cuts(&vera, &["-n", NS]).len(), 1);

    let rt = crate::rt();
    for (from, told) in [(Some(o.cut), true), (Some(1), true), (None, false)] {
        let response = rt
            .block_on(crate::watch_all(&server, Some(VERA), from))
            .unwrap_or_else(|e| panic!("watch from {from:?}: {e:?}"));
        let notice = response
            .metadata()
            .get("vmplane-voided-positions")
            .map(|v| v.to_str().expect("ASCII").to_owned());
        if told {
            let notice = notice.unwrap_or_else(|| panic!("no notice for a watch from {from:?}"));
            assert!(
                notice.contains(&format!("{}..={}", o.cut + 1, o.last)),
                "{notice}"
            );
            assert!(notice.contains(&epoch), "{notice}");
        } else {
            assert_eq!(notice, None, "a watch from the head crosses no cut");
        }
    }
    drop(rt);
    // The CLI says so on stderr, once, before the events.
    let mut watch = vera.spawn(&["watch", "-A", "--from-position", &o.cut.to_string()]);
    std::thread::sleep(Duration::from_secs(2));
    let _ = watch.kill();
    let output = watch.wait_with_output().expect("watch output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("positions {}..={}", o.cut + 1, o.last))
            && stderr.contains("voided by a point-in-time restore"),
        "{stderr}"
    );
    server.terminate(Duration::from_secs(20));
}
