//! List-and-watch: a list read while writers are busy is a consistent snapshot at its
//! resourceVersion, and a watch from that position delivers every later event once, in order,
//! without a gap; a watch resumed from any position continues exactly.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::time::Duration;

use serde_json::Value;
use vmplane_gateway::pb::{
    self, admin_client::AdminClient, history_client::HistoryClient, objects_client::ObjectsClient,
    watch_client::WatchClient,
};
use vmplane_tests::{Cli, Server};

use crate::{channel, rt};

const WRITERS: usize = 4;
const WRITES_PER_WRITER: usize = 30;
/// How long a watch may take to deliver what the log already holds.
const WATCH_CATCH_UP_MS: u64 = 30_000;

fn vm(name: &str, memory_mi: usize) -> String {
    format!(
        r#"{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{{"name":"{name}"}},
"spec":{{"runStrategy":"Halted","template":{{"spec":{{"domain":{{"memory":{{"guest":"{memory_mi}Mi"}},
"devices":{{}}}}}}}}}}}}"#
    )
}

/// One writer: creates and edits VMs in its own namespace, and starts some.
fn writer(url: String, id: usize) {
    rt().block_on(async move {
        let channel = tonic::transport::Channel::from_shared(url)
            .expect("url")
            .connect()
            .await
            .expect("connect");
        let mut objects = ObjectsClient::new(channel.clone());
        let mut lifecycle = pb::lifecycle_client::LifecycleClient::new(channel);
        let ns = format!("watch-w{id}");
        for j in 0..WRITES_PER_WRITER {
            let name = format!("vm-{}", j % 5);
            objects
                .apply(pb::ApplyRequest {
                    manifest: vm(&name, 128 + j),
                    namespace: ns.clone(),
                    ..Default::default()
                })
                .await
                .expect("apply");
            if j % 7 == 3 {
                lifecycle
                    .start(pb::LifecycleRequest {
                        namespace: ns.clone(),
                        name,
                        request_id: String::new(),
                    })
                    .await
                    .expect("start");
            }
        }
    });
}

async fn head(server: &Server) -> u64 {
    AdminClient::new(channel(server).await)
        .log_info(pb::LogInfoRequest {})
        .await
        .expect("log info")
        .into_inner()
        .head_position
}

/// Watches every namespace from `after` until an event at `until` arrives.
async fn watch_until(server: &Server, after: u64, until: u64) -> Vec<pb::WatchEvent> {
    let mut stream = WatchClient::new(channel(server).await)
        .watch(pb::WatchRequest {
            kind: String::new(),
            namespace: String::new(),
            all_namespaces: true,
            from_position: Some(after),
        })
        .await
        .expect("watch")
        .into_inner();
    let mut events = Vec::new();
    if after >= until {
        return events;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(WATCH_CATCH_UP_MS);
    loop {
        let next = tokio::time::timeout_at(deadline, stream.message())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "watch from {after} stalled after {} events (want up to {until})",
                    events.len()
                )
            })
            .expect("watch stream")
            .expect("watch ended early");
        let at = next.position;
        events.push(next);
        if at >= until {
            return events;
        }
    }
}

fn positions(events: &[pb::WatchEvent]) -> Vec<u64> {
    events.iter().map(|e| e.position).collect()
}

#[test]
fn a_list_then_a_watch_from_its_resource_version_misses_nothing_and_repeats_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &[]);
    let rt = rt();
    let start = rt.block_on(head(&server));

    // Writers busy in the background while a client lists.
    let writers: Vec<_> = (0..WRITERS)
        .map(|id| {
            let url = server.url.clone();
            std::thread::spawn(move || writer(url, id))
        })
        .collect();
    let (list, events_after_list, end) = rt.block_on(async {
        while head(&server).await < start + 20 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let list = ObjectsClient::new(channel(&server).await)
            .list(pb::ListRequest {
                kind: "vm".into(),
                namespace: String::new(),
                all_namespaces: true,
                min_position: 0,
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner();
        let still_writing = head(&server).await;
        for w in writers {
            w.join().expect("writer");
        }
        // The head once the writers are done (a reconciler may append after it: the checks
        // below stop here).
        let end = head(&server).await;
        assert!(
            still_writing < end,
            "the writers were still busy after the list"
        );
        let events = watch_until(&server, list.read_position, end).await;
        (list, events, end)
    });
    let read_at = list.read_position;
    assert!(
        read_at > start && read_at < end,
        "{start} < {read_at} < {end}"
    );

    // Every position after the list's, once, in order, without a gap.
    let want: Vec<u64> = (read_at + 1..=end).collect();
    assert_eq!(positions(&events_after_list), want);

    // The same events the audit reports.
    let audit = rt.block_on(async {
        HistoryClient::new(channel(&server).await)
            .audit(pb::AuditRequest {
                all_namespaces: true,
                ..Default::default()
            })
            .await
            .expect("audit")
            .into_inner()
            .entries
    });
    let after: Vec<&pb::AuditEntry> = audit
        .iter()
        .filter(|a| a.position > read_at && a.position <= end)
        .collect();
    assert_eq!(after.len(), events_after_list.len());
    for (a, e) in after.iter().zip(&events_after_list) {
        assert_eq!(
            (
                &a.position,
                &a.time,
                &a.actor,
                &a.namespace,
                &a.kind,
                &a.name,
                &a.event
            ),
            (
                &e.position,
                &e.time,
                &e.actor,
                &e.namespace,
                &e.kind,
                &e.name,
                &e.event
            )
        );
    }

    // The list is the state at its position: each VM as of its last event at or before it,
    // and no VM created after it.
    // A VM's resourceVersion is its stream's last event: the reconciler's observations of
    // its VMI are in that stream too (audited as VirtualMachineInstance; this test makes no
    // stand-alone VMIs).
    let mut last_event: BTreeMap<(String, String), u64> = BTreeMap::new();
    for a in audit.iter().filter(|a| a.position <= read_at) {
        if a.kind == "VirtualMachine" || a.kind == "VirtualMachineInstance" {
            last_event.insert((a.namespace.clone(), a.name.clone()), a.position);
        }
    }
    let listed: BTreeMap<(String, String), u64> = list
        .items
        .iter()
        .map(|o| ((o.namespace.clone(), o.name.clone()), o.resource_version))
        .collect();
    assert_eq!(
        listed, last_event,
        "the list is the log's state at {read_at}"
    );

    // A watch resumed from any position continues exactly.
    let all: Vec<pb::WatchEvent> = rt.block_on(watch_until(&server, start, end));
    assert_eq!(positions(&all), (start + 1..=end).collect::<Vec<_>>());
    let mid = (start + end) / 2;
    for from in [start, start + 1, read_at, mid, end - 1, end] {
        let resumed = rt.block_on(watch_until(&server, from, end));
        let expect: Vec<&pb::WatchEvent> = all.iter().filter(|e| e.position > from).collect();
        assert_eq!(
            resumed.iter().collect::<Vec<_>>(),
            expect,
            "resumed from {from}"
        );
    }

    // The CLI's watch -A -o json from the list's resourceVersion: the same positions.
    let vmplane = Cli::new(&server);
    let from = read_at.to_string();
    let mut watch = vmplane.spawn(&["watch", "-A", "-o", "json", "--from-position", &from]);
    let stdout = watch.stdout.take().expect("stdout");
    let mut seen = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let ev: Value = serde_json::from_str(&line.expect("read")).expect("one JSON object a line");
        let at = ev["position"].as_u64().expect("position");
        seen.push(at);
        if at >= end {
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert_eq!(seen, want);

    // A live watch (no position) sees only what happens after it starts.
    let live = pb::WatchRequest {
        kind: "vm".into(),
        namespace: "watch-live".into(),
        all_namespaces: false,
        from_position: None,
    };
    let (ev, applied) = rt.block_on(next_event_after_an_apply(
        &server,
        live,
        "live",
        "watch-live",
    ));
    assert_eq!(ev.position, applied.position);
    assert_eq!((ev.name.as_str(), ev.event.as_str()), ("live", "VmCreated"));
}

/// Opens `watch`, then applies VM `name` in `ns`: the first event the watch delivers, and the
/// apply's answer.
async fn next_event_after_an_apply(
    server: &Server,
    watch: pb::WatchRequest,
    name: &str,
    ns: &str,
) -> (pb::WatchEvent, pb::ApplyResponse) {
    let mut stream = WatchClient::new(channel(server).await)
        .watch(watch)
        .await
        .expect("watch")
        .into_inner();
    let applied = ObjectsClient::new(channel(server).await)
        .apply(pb::ApplyRequest {
            manifest: vm(name, 128),
            namespace: ns.into(),
            ..Default::default()
        })
        .await
        .expect("apply")
        .into_inner();
    let ev = tokio::time::timeout(Duration::from_millis(WATCH_CATCH_UP_MS), stream.message())
        .await
        .expect("the next event arrives")
        .expect("stream")
        .expect("an event");
    (ev, applied)
}

/// Names and objects of a list response, for comparing lists.
fn listed(items: &[pb::Object]) -> Vec<(String, Value)> {
    items
        .iter()
        .map(|o| {
            (
                o.name.clone(),
                serde_json::from_str(&o.json).expect("object json"),
            )
        })
        .collect()
}

#[test]
fn a_paged_list_is_one_list_at_its_first_pages_position_whatever_is_written_between_pages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &["--hypervisor", "none"]);
    let rt = rt();
    rt.block_on(async {
        let mut objects = ObjectsClient::new(channel(&server).await);
        let apply = |name: String, memory: usize| pb::ApplyRequest {
            manifest: vm(&name, memory),
            namespace: "paging".into(),
            ..Default::default()
        };
        for i in 0..9 {
            objects
                .apply(apply(format!("vm-{i}"), 128))
                .await
                .expect("apply");
        }
        let request = |limit: u32, continue_token: String| pb::ListRequest {
            kind: "vm".into(),
            namespace: "paging".into(),
            limit,
            continue_token,
            ..Default::default()
        };
        let whole = objects
            .list(request(0, String::new()))
            .await
            .expect("list")
            .into_inner();
        assert_eq!(whole.items.len(), 9);
        assert!(whole.continue_token.is_empty());

        let first = objects
            .list(request(4, String::new()))
            .await
            .expect("first page")
            .into_inner();
        assert_eq!(first.read_position, whole.read_position);
        assert_eq!(first.items.len(), 4);
        assert!(!first.continue_token.is_empty(), "more pages follow");

        // Between pages: an object of a later page is edited and another deleted, and a new
        // one sorts into the second page. None of it belongs to a list read before.
        objects
            .apply(apply("vm-5".into(), 512))
            .await
            .expect("edit");
        objects
            .apply(apply("vm-4a".into(), 128))
            .await
            .expect("create");
        objects
            .delete(pb::DeleteRequest {
                r#ref: Some(pb::ObjectRef {
                    kind: "vm".into(),
                    namespace: "paging".into(),
                    name: "vm-8".into(),
                }),
                ..Default::default()
            })
            .await
            .expect("delete");

        let mut pages = vec![first.clone()];
        let mut token = first.continue_token.clone();
        while !token.is_empty() {
            let page = objects
                .list(request(4, token))
                .await
                .expect("next page")
                .into_inner();
            assert_eq!(
                page.read_position, first.read_position,
                "every page is read at the first page's position"
            );
            assert!(page.items.len() <= 4);
            token = page.continue_token.clone();
            pages.push(page);
        }
        assert_eq!(pages.len(), 3);
        let paged: Vec<pb::Object> = pages.into_iter().flat_map(|p| p.items).collect();
        assert_eq!(listed(&paged), listed(&whole.items));

        // A new list sees the writes; a token that is not the server's is refused.
        let now = objects
            .list(request(0, String::new()))
            .await
            .expect("list")
            .into_inner();
        let names: Vec<String> = now.items.iter().map(|o| o.name.clone()).collect();
        assert_eq!(
            names,
            [
                "vm-0", "vm-1", "vm-2", "vm-3", "vm-4", "vm-4a", "vm-5", "vm-6", "vm-7"
            ]
        );
        let refused = objects
            .list(request(4, "not-a-token".into()))
            .await
            .expect_err("a forged token");
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert!(refused.message().contains("continue_token"), "{refused:?}");
    });

    // The CLI pages by default; its output is the same in any page size.
    let cli = Cli::new(&server);
    let outputs: Vec<String> = ["1", "2", "500", "0"]
        .iter()
        .map(|chunk| {
            let (code, out, err) = cli.run(&[
                "get",
                "vms",
                "-n",
                "paging",
                "-o",
                "json",
                "--chunk-size",
                chunk,
            ]);
            assert_eq!(code, 0, "{err}");
            out
        })
        .collect();
    for out in &outputs[1..] {
        assert_eq!(out, &outputs[0]);
    }
    let list: Value = serde_json::from_str(&outputs[0]).expect("json list");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(9));
}

#[test]
fn a_list_in_the_past_shows_the_objects_as_they_were_then_in_any_page_size() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &["--hypervisor", "none"]);
    let cli = Cli::new(&server);
    let ns = ["-n", "past"];
    let apply = |name: &str, memory: usize| {
        let (code, _, err) =
            cli.run_with_stdin(&["apply", "-f", "-", "-n", "past"], &vm(name, memory));
        assert_eq!(code, 0, "{err}");
    };
    for name in ["a", "b", "c"] {
        apply(name, 128);
    }
    let then: Value =
        serde_json::from_str(&cli.ok(&["get", "vms", ns[0], ns[1], "-o", "json"])).expect("JSON");
    let position = then["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_owned();
    let audit: Value =
        serde_json::from_str(&cli.ok(&["audit", ns[0], ns[1], "-o", "json"])).expect("JSON");
    let time = audit[2]["time"].as_str().expect("time").to_owned();
    // Afterwards: an edit, a delete, a new object.
    apply("a", 256);
    cli.ok(&["delete", "vm", "b", ns[0], ns[1]]);
    apply("d", 128);
    let now = cli.ok(&["get", "vms", ns[0], ns[1]]);
    assert!(now.contains("d") && !now.contains("\nb "), "{now}");

    let names = |list: &Value| -> Vec<(String, Value)> {
        list["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|o| {
                let memory = o["spec"]["template"]["spec"]["domain"]["memory"]["guest"].clone();
                (
                    o["metadata"]["name"].as_str().expect("name").to_owned(),
                    memory,
                )
            })
            .collect()
    };
    for point in [
        ["--at-position", position.as_str()],
        ["--as-of", time.as_str()],
    ] {
        for chunk in ["1", "2", "0"] {
            let out = cli.ok(&[
                "get",
                "vms",
                ns[0],
                ns[1],
                point[0],
                point[1],
                "--chunk-size",
                chunk,
                "-o",
                "json",
            ]);
            let past: Value = serde_json::from_str(&out).expect("JSON");
            assert_eq!(
                names(&past),
                names(&then),
                "{point:?} in pages of {chunk}: the list as it was"
            );
            assert_eq!(
                past["metadata"]["resourceVersion"],
                then["metadata"]["resourceVersion"]
            );
        }
    }
    // A list has no revision; a position past the head is refused in one line.
    let (code, _, _) = cli.run(&["get", "vms", "--revision", "1"]);
    assert_ne!(code, 0);
    let line = cli.fails(&["get", "vms", ns[0], ns[1], "--at-position", "999999"]);
    assert!(line.contains("past the log's head"), "{line}");
}

#[test]
fn a_watch_from_a_position_past_the_head_is_refused_naming_the_head_and_one_at_the_head_waits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &[]);
    let vmplane = Cli::new(&server);
    let (code, _, err) = vmplane.run_with_stdin(&["apply", "-f", "-"], &vm("ahead", 128));
    assert_eq!(code, 0, "{err}");
    let rt = rt();
    let at = rt.block_on(head(&server));

    // Past the head: refused once the server has waited (3 s) for its head to get there,
    // never a silent wait; the message names the field and the head.
    let status = rt.block_on(async {
        let mut client = WatchClient::new(channel(&server).await);
        let watch = client.watch(pb::WatchRequest {
            kind: String::new(),
            namespace: String::new(),
            all_namespaces: true,
            from_position: Some(at + 1),
        });
        tokio::time::timeout(Duration::from_secs(20), watch)
            .await
            .expect("an answer, not a silent wait")
            .expect_err("one past the head")
    });
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    let err = vmplane.fails(&["watch", "-A", "--from-position", &(at + 1000).to_string()]);
    assert!(err.contains("from_position"), "{err}");
    assert!(err.contains(&format!("past the log's head {at}")), "{err}");

    // At the head: accepted, and the next event is delivered.
    let from_head = pb::WatchRequest {
        kind: String::new(),
        namespace: String::new(),
        all_namespaces: true,
        from_position: Some(at),
    };
    let (ev, applied) = rt.block_on(next_event_after_an_apply(
        &server, from_head, "next", "default",
    ));
    assert_eq!(ev.position, applied.position);
}

/// More idle watches than tokio's blocking pool has threads (512), opened by one reader.
const IDLE_WATCHES: usize = 600;

#[test]
fn many_idle_watches_leave_every_read_answered_and_each_watch_still_delivers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &["--hypervisor", "none"]);
    let vmplane = Cli::new(&server);
    let (code, _, err) = vmplane.run_with_stdin(&["apply", "-f", "-"], &vm("idle", 128));
    assert_eq!(code, 0, "{err}");
    let rt = rt();
    rt.block_on(async {
        // A few connections, as many streams on each as h2 allows by default (100+).
        let mut channels = Vec::new();
        for _ in 0..8 {
            channels.push(channel(&server).await);
        }
        let mut streams = Vec::new();
        for i in 0..IDLE_WATCHES {
            let mut client = WatchClient::new(channels[i % channels.len()].clone());
            let stream = client
                .watch(pb::WatchRequest {
                    kind: "vm".into(),
                    namespace: "default".into(),
                    all_namespaces: false,
                    from_position: None,
                })
                .await
                .expect("watch opens")
                .into_inner();
            streams.push(stream);
        }
        // Reads of other clients are answered, not queued behind the watches.
        let mut objects = ObjectsClient::new(channel(&server).await);
        let mut get = tonic::Request::new(pb::GetRequest {
            r#ref: Some(pb::ObjectRef {
                kind: "vm".into(),
                namespace: "default".into(),
                name: "idle".into(),
            }),
            ..Default::default()
        });
        get.set_timeout(Duration::from_secs(10));
        objects.get(get).await.expect("a read beside idle watches");
        // And every watch still delivers the next change.
        let applied = objects
            .apply(pb::ApplyRequest {
                manifest: vm("idle", 256),
                namespace: "default".into(),
                ..Default::default()
            })
            .await
            .expect("apply")
            .into_inner();
        for stream in &mut streams {
            let event = tokio::time::timeout(Duration::from_secs(30), stream.message())
                .await
                .expect("an event, not a silent wait")
                .expect("the stream stays open")
                .expect("an event");
            assert_eq!(event.position, applied.position);
        }
    });
}
