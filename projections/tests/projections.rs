//! The projections against a real SledLog in a temp dir.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{env, meta, put, testdata, vm, vm_with};
use proptest::prelude::*;
use vmplane_core::types::Kind;
use vmplane_core::{Category, Outcome, VmCommand, codes};
use vmplane_projections::{
    At, AuditQuery, AuditRecord, Command, CommandError, CommandHandler, CommandOptions, Error,
    Preconditions, ProjectionOptions, Projections, WatchFilter, checkpoint,
};
use vmplane_store::threads::{Policy, policies_of_threads_named};
use vmplane_store::{EventLog, Position, Timestamp};

// ---------------------------------------------------------------------------------------------
// Read models, checkpoints, rebuild, digest

#[test]
fn vm_read_model_has_kubevirt_shape() {
    let env = env();
    let created = env.run("alice", Command::apply(testdata("examples/vm-cirros.yaml")));
    assert_eq!(created.outcome, Outcome::Created);
    let view = env
        .projections
        .get(
            Kind::VirtualMachine,
            "default",
            "vm-cirros",
            Some(created.position),
        )
        .expect("get")
        .expect("exists");
    let o = &view.object;
    assert_eq!(o["apiVersion"], "kubevirt.io/v1");
    assert_eq!(o["kind"], "VirtualMachine");
    assert_eq!(o["metadata"]["name"], "vm-cirros");
    assert_eq!(o["metadata"]["namespace"], "default");
    assert_eq!(o["metadata"]["generation"], 1);
    assert_eq!(
        o["metadata"]["resourceVersion"],
        created.position.0.to_string()
    );
    assert!(o["metadata"]["creationTimestamp"].is_string());
    assert!(o["metadata"]["uid"].is_string());
    assert_eq!(o["metadata"]["labels"]["kubevirt.io/vm"], "vm-cirros");
    let uuid = o["spec"]["template"]["spec"]["domain"]["firmware"]["uuid"]
        .as_str()
        .expect("effective firmware uuid in the spec");
    assert_eq!(o["status"]["printableStatus"], "Stopped");
    assert_eq!(o["status"]["firmwareUUIDOrigin"], "Generated");
    assert_eq!(o["status"]["runStrategy"], "Halted");
    let holder = env
        .projections
        .firmware_holder(uuid.parse().expect("uuid"))
        .expect("index")
        .expect("held");
    assert_eq!(holder.stream, "vm/default/vm-cirros");

    // Start: a lifecycle event, not an object change... but Halted → Always is one.
    let started = env.vm_command(
        "alice",
        "default",
        "vm-cirros",
        VmCommand::Start { paused: false },
    );
    let view = env
        .projections
        .get(
            Kind::VirtualMachine,
            "default",
            "vm-cirros",
            Some(started.position),
        )
        .expect("get")
        .expect("exists");
    assert_eq!(view.object["status"]["printableStatus"], "Starting");
    assert_eq!(view.generation, started.generation);
    let list = env
        .projections
        .list(Kind::VirtualMachine, Some("default"), None)
        .expect("list");
    assert_eq!(list.items.len(), 1);
    let json = list.to_json();
    assert_eq!(json["kind"], "List");
    assert_eq!(
        json["metadata"]["resourceVersion"],
        list.position.0.to_string()
    );
}

fn populate(env: &common::Env, prefix: &str, vms: usize) {
    for i in 0..vms {
        let name = format!("{prefix}{i}");
        env.apply_vm("alice", vm("team-a", &name, "128Mi"));
        env.apply_vm("bob", vm("team-a", &name, "256Mi"));
        if i % 2 == 0 {
            env.vm_command("bob", "team-a", &name, VmCommand::Start { paused: false });
        }
        if i % 3 == 0 {
            env.vm_command(
                "carol",
                "team-a",
                &name,
                VmCommand::Delete {
                    expected_generation: None,
                },
            );
        }
    }
}

#[test]
fn the_pages_of_a_long_list_pass_through_the_state_cache_and_a_short_list_is_cached() {
    let env = env();
    for i in 0..5 {
        env.apply_vm("alice", vm("team-a", &format!("p{i}"), "128Mi"));
    }
    let cache = env.projections.cache();
    let page = |after: Option<(String, String)>| {
        let mut names = Vec::new();
        let end = env
            .projections
            .visit_page(
                Kind::VirtualMachine,
                Some("team-a"),
                &vmplane_projections::ListPage {
                    after,
                    limit: Some(2),
                    ..Default::default()
                },
                |view| names.push(view.name),
            )
            .expect("page");
        (names, end.next)
    };
    cache.clear();
    let (first, mut next) = page(None);
    let mut names = first;
    while next.is_some() {
        let (more, after) = page(next);
        names.extend(more);
        next = after;
    }
    assert_eq!(names, ["p0", "p1", "p2", "p3", "p4"]);
    assert_eq!(cache.streams(), 0, "pages of a longer list are not cached");
    // Still read from the log, and the same objects as an unpaged list.
    let whole = env
        .projections
        .list(Kind::VirtualMachine, Some("team-a"), None)
        .expect("list");
    let listed: Vec<_> = whole.items.iter().map(|v| v.name.clone()).collect();
    assert_eq!(listed, names);
    assert_eq!(
        cache.streams(),
        5,
        "a list that is one short page is cached"
    );
}

#[test]
fn a_label_selector_pages_through_matching_objects_only() {
    use vmplane_core::selector::LabelSelector;
    let env = env();
    // p0..p9; the even ones are tier=web, every third has no tier at all.
    for i in 0..10 {
        let mut v = vm("team-a", &format!("p{i}"), "128Mi");
        if i % 3 != 0 {
            let tier = if i % 2 == 0 { "web" } else { "db" };
            v.metadata
                .labels
                .get_or_insert_default()
                .insert("tier".into(), serde_json::json!(tier));
        }
        env.apply_vm("alice", v);
    }
    let select = |selector: &str, limit: Option<usize>| {
        let selector = LabelSelector::parse(selector).expect("selector");
        let mut pages = Vec::new();
        let mut after = None;
        loop {
            let mut names = Vec::new();
            let end = env
                .projections
                .visit_page(
                    Kind::VirtualMachine,
                    Some("team-a"),
                    &vmplane_projections::ListPage {
                        after,
                        limit,
                        selector: Some(selector.clone()),
                        ..Default::default()
                    },
                    |view| names.push(view.name),
                )
                .expect("page");
            pages.push(names);
            match end.next {
                Some(next) => after = Some(next),
                None => return pages,
            }
        }
    };
    // p2, p4, p8 are web (p0 and p6 have no tier).
    assert_eq!(select("tier=web", None), [["p2", "p4", "p8"]]);
    // Pages of two matching objects; the last page is not empty, and no page follows it.
    assert_eq!(select("tier=web", Some(2)), [vec!["p2", "p4"], vec!["p8"]]);
    assert_eq!(
        select("tier in (web,db)", Some(3)),
        [vec!["p1", "p2", "p4"], vec!["p5", "p7", "p8"]]
    );
    assert_eq!(select("!tier", Some(10)), [["p0", "p3", "p6", "p9"]]);
    assert_eq!(
        select("tier!=web,app=demo", Some(3)),
        [vec!["p0", "p1", "p3"], vec!["p5", "p6", "p7"], vec!["p9"]]
    );
    // Nothing matches: one empty page, no next.
    assert_eq!(select("tier=cache", Some(2)), [Vec::<String>::new()]);
    // The empty selector selects everything, as no selector does.
    assert_eq!(select("", None)[0].len(), 10);
}

#[test]
fn a_manifests_uid_and_resource_version_are_preconditions_of_an_update_and_ignored_by_a_create() {
    use vmplane_core::types::Manifest;
    use vmplane_projections::command::CommandMeta;
    let env = env();
    let first = env.apply_vm("alice", vm("team-a", "pre", "128Mi"));
    let uid = env
        .projections
        .get(Kind::VirtualMachine, "team-a", "pre", None)
        .expect("get")
        .and_then(|v| v.uid)
        .and_then(|u| uuid::Uuid::parse_str(&u).ok())
        .expect("a uid");
    let asking = |uid: Option<uuid::Uuid>, position: Option<Position>| CommandMeta {
        actor: "carol".into(),
        if_live: Preconditions { uid, position },
        ..CommandMeta::default()
    };
    let edit = |memory: &str| {
        Command::apply(Manifest::VirtualMachine(Box::new(vm(
            "team-a", "pre", memory,
        ))))
    };
    let head = env.log.head();
    // Another object's uid, or a resourceVersion since changed: conflicts, nothing written.
    for (meta, code) in [
        (asking(Some(uuid::Uuid::nil()), None), codes::UID_CONFLICT),
        (
            asking(Some(uid), Some(Position(first.position.0 - 1))),
            codes::RESOURCE_VERSION_CONFLICT,
        ),
    ] {
        match env.commands.execute(&meta, edit("256Mi")) {
            Err(CommandError::Rejected(r)) => {
                assert_eq!(r.category, Category::Conflict);
                assert!(r.has_code(code), "{r}");
            }
            other => panic!("expected a conflict, got {other:?}"),
        }
        assert!(matches!(
            env.commands
                .dry_run_expecting(edit("256Mi"), None, meta.if_live),
            Err(CommandError::Rejected(_))
        ));
    }
    assert_eq!(env.log.head(), head, "nothing appended");
    // The object as it was read: the edit is made.
    let done = env
        .commands
        .execute(&asking(Some(uid), Some(first.position)), edit("256Mi"))
        .expect("as read");
    assert_eq!(done.outcome, Outcome::Configured);
    // A create ignores them, as every field the server sets.
    let created = env
        .commands
        .execute(
            &asking(Some(uuid::Uuid::nil()), Some(Position(12345))),
            Command::apply(Manifest::VirtualMachine(Box::new(vm(
                "team-a", "pre-new", "128Mi",
            )))),
        )
        .expect("a create");
    assert_eq!(created.outcome, Outcome::Created);
}

#[test]
fn a_command_expecting_a_stale_position_is_refused_and_one_expecting_the_current_is_carried_out() {
    use vmplane_core::types::Manifest;
    use vmplane_projections::command::CommandMeta;
    let env = env();
    let first = env.apply_vm("alice", vm("team-a", "cond", "128Mi"));
    let second = env.apply_vm("bob", vm("team-a", "cond", "256Mi"));
    let expecting = |position: Position| CommandMeta {
        actor: "carol".into(),
        expected_position: Some(position),
        ..CommandMeta::default()
    };
    let edit = || {
        Command::apply(Manifest::VirtualMachine(Box::new(vm(
            "team-a", "cond", "512Mi",
        ))))
    };
    let head = env.log.head();
    for stale in [first.position, Position(0)] {
        match env.commands.execute(&expecting(stale), edit()) {
            Err(CommandError::Rejected(r)) => {
                assert_eq!(r.category, Category::Conflict);
                assert!(r.has_code(codes::RESOURCE_VERSION_CONFLICT), "{r}");
            }
            other => panic!("expected a conflict, got {other:?}"),
        }
        assert!(matches!(
            env.commands
                .dry_run_expecting(edit(), Some(stale), Preconditions::default()),
            Err(CommandError::Rejected(_))
        ));
    }
    assert_eq!(env.log.head(), head, "nothing appended");
    let done = env
        .commands
        .execute(&expecting(second.position), edit())
        .expect("current position");
    assert_eq!(done.outcome, Outcome::Configured);
    // A new object: expected at 0, it must not exist yet.
    let created = env
        .commands
        .execute(
            &expecting(Position(0)),
            Command::apply(Manifest::VirtualMachine(Box::new(vm(
                "team-a", "fresh", "128Mi",
            )))),
        )
        .expect("a new object at 0");
    assert_eq!(created.outcome, Outcome::Created);
}

#[test]
fn restart_with_checkpoint_and_tail_equals_rebuild() {
    let env = env();
    populate(&env, "a", 6);
    env.projections.checkpoint().expect("checkpoint");
    let at_checkpoint = env.projections.position();
    populate(&env, "b", 4); // the tail
    let before = env.projections.digest().expect("digest");
    let before_lines = env.projections.canonical_content().expect("content");
    let env = env.restart();
    assert_eq!(
        before_lines,
        env.projections.canonical_content().expect("content")
    );
    assert!(env.projections.position() > at_checkpoint);
    let after_restart = env.projections.digest().expect("digest");
    assert_eq!(before, after_restart);
    env.projections.rebuild().expect("rebuild");
    assert_eq!(after_restart, env.projections.digest().expect("digest"));
    // The same objects as well as the same digest.
    let list = env
        .projections
        .list(Kind::VirtualMachine, Some("team-a"), None)
        .expect("list");
    let names: Vec<_> = list.items.iter().map(|v| v.name.clone()).collect();
    assert_eq!(names, ["a1", "a2", "a4", "a5", "b1", "b2"]);
}

#[test]
fn the_periodic_checkpoint_written_in_the_background_loads_as_a_restart_would() {
    let env = env();
    // Projections of the same log that checkpoint every 5 events, in a directory of their own.
    let dir = tempfile::tempdir().expect("temp dir");
    let options = ProjectionOptions {
        checkpoint_every_events: 5,
        ..common::options()
    };
    let periodic = Projections::open(Arc::clone(&env.log), dir.path(), options).expect("open");
    populate(&env, "a", 4);
    // Past the interval: the checkpoint is started, and written on a thread of its own.
    let reached = periodic.catch_up().expect("catch up");
    assert!(reached.0 >= 5, "{reached:?}");
    let digest = periodic.digest().expect("digest");
    // Dropping the projections waits for the write.
    drop(periodic);
    // Whole (its body's hash checked), at the position reached, holding every stream.
    let path = checkpoint::path(dir.path(), "readmodel");
    let loaded = checkpoint::read::<serde_json::Value>(&path, "readmodel")
        .expect("a sound checkpoint")
        .expect("the checkpoint was written");
    assert_eq!(loaded.position, reached.0);
    assert_eq!(loaded.body["applied"], reached.0);
    // One entry per stream: the four VMs `populate` made.
    assert_eq!(loaded.body["entries"].as_array().map(Vec::len), Some(4));
    // Reopened from it: the same model as the original's.
    let reopened =
        Projections::open(Arc::clone(&env.log), dir.path(), common::options()).expect("reopen");
    assert_eq!(reopened.digest().expect("digest"), digest);
    assert_eq!(
        reopened.digest().expect("digest"),
        env.projections.digest().expect("digest")
    );
}

/// The position of the read model's checkpoint in `dir`, once one is there (waiting up to 10 s
/// for the background writer).
fn checkpoint_at(dir: &std::path::Path) -> u64 {
    let path = checkpoint::path(dir, "readmodel");
    for _ in 0..1_000 {
        if let Ok(Some(loaded)) = checkpoint::read::<serde_json::Value>(&path, "readmodel") {
            return loaded.position;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no checkpoint written in {}", dir.display());
}

#[test]
fn a_checkpoint_of_more_streams_than_the_interval_is_followed_after_as_many_events() {
    let env = env();
    let dir = tempfile::tempdir().expect("temp dir");
    let options = ProjectionOptions {
        checkpoint_every_events: 2,
        ..common::options()
    };
    let periodic = Projections::open(Arc::clone(&env.log), dir.path(), options).expect("open");
    // 20 VMs: as many streams, at least as many events. Due: the first checkpoint.
    for i in 0..20 {
        env.apply_vm("alice", vm("team-a", &format!("c{i}"), "128Mi"));
    }
    let first = periodic.catch_up().expect("catch up").0;
    assert!(first >= 20, "{first}");
    assert_eq!(checkpoint_at(dir.path()), first);
    // 10 edits: past the interval of 2, short of the model's 20 streams. Not due.
    for memory in 1..=10 {
        env.apply_vm("bob", vm("team-a", "c0", &format!("{}Mi", 128 + memory)));
    }
    let later = periodic.catch_up().expect("catch up").0;
    assert_eq!(later, first + 10, "one event per edit");
    // Dropping the projections waits for any checkpoint being written.
    drop(periodic);
    assert_eq!(
        checkpoint_at(dir.path()),
        first,
        "no checkpoint 10 events later"
    );
    // Reopened from that checkpoint (the 10 edits replayed), 10 more edits: 20 events past
    // the checkpoint of 20 streams, due.
    let reopened = Projections::open(Arc::clone(&env.log), dir.path(), options).expect("reopen");
    for memory in 11..=20 {
        env.apply_vm("bob", vm("team-a", "c0", &format!("{}Mi", 128 + memory)));
    }
    let last = reopened.catch_up().expect("catch up").0;
    assert_eq!(last, first + 20);
    drop(reopened);
    assert_eq!(checkpoint_at(dir.path()), last);
}

#[test]
fn a_damaged_or_foreign_checkpoint_is_discarded_and_rebuilt() {
    let env = env();
    populate(&env, "v", 3);
    env.projections.checkpoint().expect("checkpoint");
    let digest = env.projections.digest().expect("digest");
    let path = vmplane_projections::checkpoint::path(env.data_dir(), "readmodel");
    let mut bytes = std::fs::read(&path).expect("checkpoint exists");
    let last = bytes.len() - 2;
    bytes[last] ^= 0x55;
    std::fs::write(&path, &bytes).expect("damage it");
    let env = env.restart();
    assert_eq!(env.projections.digest().expect("digest"), digest);
    // A checkpoint from another log (same length, other hashes) does not apply either.
    std::fs::write(
        &path,
        b"{\"format\":\"vmplane-projections/readmodel\",\"version\":999}\n{}",
    )
    .expect("write");
    let env = env.restart();
    assert_eq!(env.projections.digest().expect("digest"), digest);
}

// ---------------------------------------------------------------------------------------------
// Read-your-writes, list and watch

#[test]
fn read_your_writes_waits_and_times_out() {
    let env = env();
    let done = env.apply_vm("alice", vm("default", "demo", "128Mi"));
    let later = Position(done.position.0 + 2);
    match env.projections.wait_for(later, Duration::from_millis(50)) {
        Err(Error::Timeout { wanted, reached }) => {
            assert_eq!((wanted, reached), (later, done.position));
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    let log = Arc::clone(&env.log);
    let cache = Arc::clone(env.projections.cache());
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        let commands = CommandHandler::new(log, cache, CommandOptions::default());
        for memory in ["256Mi", "512Mi"] {
            commands
                .execute(
                    &meta("bob"),
                    Command::apply(vmplane_core::types::Manifest::VirtualMachine(Box::new(vm(
                        "default", "demo", memory,
                    )))),
                )
                .expect("edit");
        }
    });
    let reached = env
        .projections
        .wait_for(later, Duration::from_secs(10))
        .expect("reached");
    assert!(reached >= later);
    writer.join().expect("writer");
    let view = env
        .projections
        .get(Kind::VirtualMachine, "default", "demo", Some(later))
        .expect("get")
        .expect("exists");
    assert_eq!(view.generation, 3);
}

#[test]
fn list_then_watch_misses_nothing_and_repeats_nothing_under_concurrent_writers() {
    let env = env();
    let env = Arc::new(env);
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..3 {
        let env = Arc::clone(&env);
        writers.push(std::thread::spawn(move || {
            for i in 0..12 {
                let ns = if w % 2 == 0 { "even" } else { "odd" };
                let name = format!("w{w}-{}", i % 4);
                env.apply_vm(
                    &format!("writer{w}"),
                    vm(ns, &name, &format!("{}Mi", 128 + i)),
                );
            }
        }));
    }
    let follower = {
        let projections = Arc::new(
            Projections::in_memory(Arc::clone(&env.log), common::options()).expect("in memory"),
        );
        projections
            .follow(Arc::clone(&stop))
            .expect("follower threads")
    };
    std::thread::sleep(Duration::from_millis(30));
    let list = env
        .projections
        .list(Kind::VirtualMachine, Some("even"), None)
        .expect("list");
    let mut watch = env.projections.watch(
        list.position,
        WatchFilter {
            kind: Some(Kind::VirtualMachine),
            namespace: Some("even".into()),
        },
    );
    for w in writers {
        w.join().expect("writer");
    }
    let head = env.log.head();
    let mut seen = Vec::new();
    while watch.position() < head {
        seen.extend(
            watch
                .next_batch(7, Duration::from_millis(200))
                .expect("watch"),
        );
    }
    stop.store(true, Ordering::Relaxed);
    follower.join().expect("follower");
    // Exactly the log's events of namespace `even` after the list's position.
    let expected: Vec<u64> = env
        .log
        .read_all(list.position, 10_000)
        .expect("read")
        .iter()
        .filter(|e| e.stream.starts_with("vm/even/"))
        .map(|e| e.position.0)
        .collect();
    let got: Vec<u64> = seen.iter().map(|e| e.position).collect();
    assert_eq!(got, expected);
    assert!(
        seen.iter()
            .all(|e| e.namespace == "even" && e.kind == "VirtualMachine")
    );
    // Folding the watch onto the list gives the current list.
    let mut names: BTreeSet<String> = list.items.iter().map(|v| v.name.clone()).collect();
    names.extend(seen.iter().map(|e| e.name.clone()));
    let now = env
        .projections
        .list(Kind::VirtualMachine, Some("even"), None)
        .expect("list");
    let now_names: BTreeSet<String> = now.items.iter().map(|v| v.name.clone()).collect();
    assert_eq!(names, now_names);
}

#[test]
fn the_follower_catches_up_unasked_and_only_its_gate_runs_at_idle_priority() {
    let env = env();
    // Projections of their own, which no write and no read here catches up: only the
    // follower moves them.
    let projections = Arc::new(
        Projections::in_memory(Arc::clone(&env.log), common::options()).expect("in memory"),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let follower = projections
        .follow(Arc::clone(&stop))
        .expect("follower threads");
    for i in 0..20 {
        env.apply_vm("alice", vm("follow", &format!("vm-{i}"), "128Mi"));
    }
    let head = env.log.head();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while projections.position() < head && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(projections.position(), head, "the follower caught up");
    // Other tests may follow too: every gate is idle, every follower is not.
    let gates = policies_of_threads_named("projections-gate");
    let followers = policies_of_threads_named("projections-follower");
    assert!(
        !gates.is_empty() && !followers.is_empty(),
        "{gates:?} {followers:?}"
    );
    assert!(
        gates.iter().all(|p| *p == Policy::Idle.linux_number()),
        "{gates:?}"
    );
    assert!(
        followers.iter().all(|p| *p == libc::SCHED_OTHER),
        "{followers:?}"
    );
    stop.store(true, Ordering::Relaxed);
    follower.join().expect("follower");
    assert_eq!(
        projections
            .list(Kind::VirtualMachine, Some("follow"), None)
            .expect("list")
            .items
            .len(),
        20
    );
}

#[test]
fn the_follower_takes_the_evicted_states_so_none_are_left_waiting() {
    let env = env();
    let mut options = common::options();
    // 64 streams: each eviction past it drops one, and up to 16 wait to be freed.
    options.cache.streams_max = 64;
    let projections =
        Arc::new(Projections::in_memory(Arc::clone(&env.log), options).expect("in memory"));
    for i in 0..100 {
        env.apply_vm("alice", vm("evict", &format!("vm-{i}"), "128Mi"));
    }
    let read_all = || {
        for i in 0..100 {
            let got = projections
                .get(Kind::VirtualMachine, "evict", &format!("vm-{i}"), None)
                .expect("get");
            assert!(got.is_some(), "vm-{i}");
        }
    };
    // Without a follower, what the reads evicted waits for someone to free it.
    read_all();
    assert!(projections.cache().reap() > 0, "reads evicted streams");
    let stop = Arc::new(AtomicBool::new(false));
    let follower = projections
        .follow(Arc::clone(&stop))
        .expect("follower threads");
    read_all();
    // The follower takes them at least every 200 ms, with or without a pass to make.
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(projections.cache().reap(), 0, "nothing left waiting");
    stop.store(true, Ordering::Relaxed);
    follower.join().expect("follower");
}

// ---------------------------------------------------------------------------------------------
// History, diff, audit

#[test]
fn history_and_audit_say_what_an_edit_changed_labels_alone_or_the_run_strategy() {
    let env = env();
    let base = vm("team-a", "labelled", "128Mi");
    env.apply_vm("alice", base.clone());
    let mut labelled = base.clone();
    labelled.metadata.labels = Some([("tier".to_owned(), "gold".into())].into_iter().collect());
    env.apply_vm("alice", labelled.clone());
    let mut started = labelled.clone();
    started.spec.run_strategy = Some("Always".into());
    env.apply_vm("alice", started);
    let history = env
        .projections
        .history(Kind::VirtualMachine, "team-a", "labelled")
        .expect("history");
    let summaries: Vec<&str> = history.iter().skip(1).map(|h| h.summary.as_str()).collect();
    assert_eq!(
        summaries[..2],
        ["edited labels", "run strategy Manual → Always"],
        "{history:#?}"
    );
    let audit = env
        .projections
        .audit(&AuditQuery {
            namespace: Some("team-a".into()),
            ..AuditQuery::default()
        })
        .expect("audit")
        .records;
    let edits: Vec<&str> = audit
        .iter()
        .filter(|r| r.name == "labelled" && r.event == "VmSpecEdited")
        .map(|r| r.summary.as_str())
        .collect();
    assert_eq!(edits, ["edited labels", "run strategy Manual → Always"]);
}

#[test]
fn a_deleted_running_vm_is_read_terminating_until_its_vmi_is_gone_and_the_log_says_who_and_when() {
    let env = env();
    let reconciler = "system:reconciler";
    env.apply_vm("alice", vm("team-a", "going", "128Mi"));
    env.vm_command(
        "alice",
        "team-a",
        "going",
        VmCommand::Start { paused: false },
    );
    env.vm_command(
        reconciler,
        "team-a",
        "going",
        VmCommand::LaunchVmi {
            features: vmplane_core::Features::defaults(),
        },
    );
    let read = |position| {
        env.projections
            .get(Kind::VirtualMachine, "team-a", "going", Some(position))
            .expect("get")
    };
    let vmi = |position| {
        let view = env
            .projections
            .get(
                Kind::VirtualMachineInstance,
                "team-a",
                "going",
                Some(position),
            )
            .expect("get vmi")
            .expect("a VMI");
        view.uid.expect("uid").parse().expect("uuid")
    };
    let launched = env.vm_command(
        reconciler,
        "team-a",
        "going",
        VmCommand::ObserveVmi {
            vmi_uid: vmi(Position(0)),
            observation: vmplane_core::VmiObservation::Phase {
                phase: vmplane_core::event::VmiPhase::Running,
                reason: None,
                message: None,
            },
        },
    );
    let uid = vmi(launched.position);
    // bob deletes it: still there, Terminating, with a deletionTimestamp; listed too.
    let asked = env.vm_command(
        "bob",
        "team-a",
        "going",
        VmCommand::Delete {
            expected_generation: None,
        },
    );
    assert_eq!(asked.outcome, Outcome::Deleted);
    let view = read(asked.position).expect("a Terminating VM is read");
    assert_eq!(view.object["status"]["printableStatus"], "Terminating");
    let at = view.object["metadata"]["deletionTimestamp"]
        .as_str()
        .expect("a deletionTimestamp")
        .to_owned();
    // The text a reader gets is the tree's (the memo of the object before is not reused).
    let json = env
        .projections
        .get_json(Kind::VirtualMachine, "team-a", "going", None)
        .expect("get json")
        .expect("there");
    assert_eq!(json, view.clone().into_json());
    let listed = env
        .projections
        .list(Kind::VirtualMachine, Some("team-a"), None)
        .expect("list");
    assert_eq!(listed.items.len(), 1);
    assert_eq!(
        listed.items[0].object["status"]["printableStatus"],
        "Terminating"
    );
    // A second delete is accepted and appends nothing.
    let again = env.vm_command(
        "bob",
        "team-a",
        "going",
        VmCommand::Delete {
            expected_generation: None,
        },
    );
    assert_eq!((again.outcome, again.append), (Outcome::Unchanged, None));
    // Its name is not free: an apply is refused as a create would be, an edit of the object as
    // read (`label`, `patch`: conditional on its resourceVersion) as an edit; nothing appended.
    let refused = |expected_position: Option<Position>| {
        let meta = vmplane_projections::CommandMeta {
            expected_position,
            ..common::meta("bob")
        };
        let mut labelled = vm("team-a", "going", "128Mi");
        labelled.metadata.labels = Some([("tier".to_owned(), "gold".into())].into_iter().collect());
        match env.commands.execute(
            &meta,
            Command::apply(vmplane_core::types::Manifest::VirtualMachine(Box::new(
                labelled,
            ))),
        ) {
            Err(CommandError::Rejected(r)) => r,
            other => panic!("not refused: {other:?}"),
        }
    };
    let r = refused(None);
    assert_eq!(r.category, Category::AlreadyExists);
    assert!(r.has_code(codes::BEING_DELETED), "{r}");
    let r = refused(Some(asked.position));
    assert_eq!(r.category, Category::FailedPrecondition, "{r}");
    assert!(r.to_string().contains("an edit is refused"), "{r}");
    assert_eq!(env.commands.head(), asked.position);
    // The reconciler stops, then removes the VMI: the VM goes with it.
    for observation in [
        vmplane_core::VmiObservation::Phase {
            phase: vmplane_core::event::VmiPhase::Succeeded,
            reason: Some("Shutdown".into()),
            message: None,
        },
        vmplane_core::VmiObservation::Removed,
    ] {
        env.vm_command(
            reconciler,
            "team-a",
            "going",
            VmCommand::ObserveVmi {
                vmi_uid: uid,
                observation,
            },
        );
    }
    let gone = env.commands.head();
    assert_eq!(read(gone), None);
    assert!(
        env.projections
            .list(Kind::VirtualMachine, Some("team-a"), None)
            .expect("list")
            .items
            .is_empty()
    );
    let history = env
        .projections
        .history(Kind::VirtualMachine, "team-a", "going")
        .expect("history");
    let rows: Vec<(&str, Vec<&str>)> = history
        .iter()
        .map(|h| {
            (
                h.actor.as_str(),
                h.events.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        rows[rows.len() - 3..],
        [
            ("bob", vec!["VmDeletionRequested"]),
            (reconciler, vec!["VmiPhaseObserved"]),
            (reconciler, vec!["VmiRemoved", "VmDeleted"]),
        ],
        "{history:#?}"
    );
    let asked_row = &history[history.len() - 3];
    assert_eq!(
        asked_row.summary,
        format!("deletion requested: Terminating until VMI {uid} is gone")
    );
    assert_eq!(
        history.last().map(|h| h.summary.as_str()),
        Some(format!("VMI {uid} removed; deleted").as_str())
    );
    // The read model rebuilt from the log reaches the same digest.
    let digest = env.projections.digest().expect("digest");
    let env = env.restart();
    env.projections.rebuild().expect("rebuild");
    assert_eq!(env.projections.digest().expect("digest"), digest);
    // Time travel: as it was while it went.
    let then = env
        .projections
        .get_at(
            Kind::VirtualMachine,
            "team-a",
            "going",
            At::Position(asked.position),
        )
        .expect("get at")
        .expect("there then");
    assert_eq!(then.object["metadata"]["deletionTimestamp"], at.as_str());
}

#[test]
fn history_diff_and_audit() {
    let env = env();
    let t0 = Timestamp::now();
    env.apply_vm("alice", vm("team-a", "demo", "128Mi"));
    env.apply_vm("bob", vm("team-a", "demo", "256Mi"));
    env.vm_command("bob", "team-a", "demo", VmCommand::Start { paused: false });
    env.apply_vm("carol", vm("team-b", "other", "64Mi"));
    let history = env
        .projections
        .history(Kind::VirtualMachine, "team-a", "demo")
        .expect("history");
    assert_eq!(history.len(), 3, "{history:#?}");
    assert_eq!(history[0].actor, "alice");
    assert_eq!(history[0].events[0], "VmCreated");
    assert!(history[0].summary.starts_with("created team-a/demo"));
    assert_eq!(history[1].events, ["VmSpecEdited"]);
    assert_eq!(history[1].summary, "edited spec");
    assert_eq!(history[2].actor, "bob");
    assert!(history.windows(2).all(|w| w[0].revision < w[1].revision));
    // The generation counts the object's changes, not the start request (runStrategy
    // Manual: a start changes nothing of the object): revision 3 is still generation 2.
    let revisions_and_generations: Vec<(u64, u64)> =
        history.iter().map(|h| (h.revision, h.generation)).collect();
    assert_eq!(revisions_and_generations, [(1, 1), (2, 2), (3, 2)]);
    let json = serde_json::to_value(&history[1]).expect("json");
    for key in [
        "revision",
        "position",
        "generation",
        "time",
        "actor",
        "events",
        "summary",
    ] {
        assert!(json.get(key).is_some(), "{key}");
    }

    let diff = env
        .projections
        .diff(
            Kind::VirtualMachine,
            "team-a",
            "demo",
            history[0].revision,
            Some(history[1].revision),
        )
        .expect("diff");
    assert!(!diff.is_equal());
    let changed: Vec<&str> = diff
        .diff
        .lines()
        .filter(|l| {
            (l.starts_with('-') || l.starts_with('+'))
                && !l.starts_with("---")
                && !l.starts_with("+++")
        })
        .map(str::trim)
        .collect();
    assert_eq!(
        changed,
        ["-        guest: 128Mi", "+        guest: 256Mi"],
        "{}",
        diff.diff
    );
    assert!(diff.diff.starts_with("--- revision"));
    let same = env
        .projections
        .diff(
            Kind::VirtualMachine,
            "team-a",
            "demo",
            history[1].revision,
            Some(history[1].revision),
        )
        .expect("diff");
    assert!(same.is_equal());

    let by_bob = env
        .projections
        .audit(&AuditQuery {
            actor: Some("bob".into()),
            ..AuditQuery::default()
        })
        .expect("audit")
        .records;
    assert!(!by_bob.is_empty());
    assert_eq!(
        by_bob[0].summary, "edited spec",
        "audit says what history says"
    );
    assert!(
        by_bob
            .iter()
            .all(|r| r.actor == "bob" && r.namespace == "team-a" && r.name == "demo")
    );
    let team_b = env
        .projections
        .audit(&AuditQuery {
            namespace: Some("team-b".into()),
            kind: Some(Kind::VirtualMachine),
            since: Some(t0),
            until: Some(Timestamp::now()),
            ..AuditQuery::default()
        })
        .expect("audit")
        .records;
    assert_eq!(team_b.len(), 1);
    assert_eq!(team_b[0].event, "VmCreated");
    assert_eq!(team_b[0].kind, "VirtualMachine");
    let none = env
        .projections
        .audit(&AuditQuery {
            until: Some(Timestamp(t0.0 - 1)),
            ..AuditQuery::default()
        })
        .expect("audit")
        .records;
    assert!(none.is_empty());
}

// ---------------------------------------------------------------------------------------------
// The command path

/// A log whose first append is preceded by another writer's append to the same stream.
struct RacingLog {
    inner: Arc<dyn EventLog>,
    race: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl EventLog for RacingLog {
    fn append(
        &self,
        request: vmplane_store::AppendRequest,
    ) -> vmplane_store::Result<vmplane_store::AppendResult> {
        let race = self.race.lock().expect("lock").take();
        if let Some(race) = race {
            race();
        }
        self.inner.append(request)
    }
    fn read_stream(
        &self,
        s: &str,
        f: u64,
        d: vmplane_store::Direction,
        m: usize,
    ) -> vmplane_store::Result<Vec<vmplane_store::RecordedEvent>> {
        self.inner.read_stream(s, f, d, m)
    }
    fn read_all(
        &self,
        a: Position,
        m: usize,
    ) -> vmplane_store::Result<Vec<vmplane_store::RecordedEvent>> {
        self.inner.read_all(a, m)
    }
    fn scan(&self, a: Position, v: vmplane_store::Visitor<'_>) -> vmplane_store::Result<Position> {
        self.inner.scan(a, v)
    }
    fn read_event(
        &self,
        p: Position,
    ) -> vmplane_store::Result<Option<vmplane_store::RecordedEvent>> {
        self.inner.read_event(p)
    }
    fn position_at(&self, t: Timestamp) -> vmplane_store::Result<Position> {
        self.inner.position_at(t)
    }
    fn head(&self) -> Position {
        self.inner.head()
    }
    fn wait_for(&self, p: Position, t: Duration) -> vmplane_store::Result<Position> {
        self.inner.wait_for(p, t)
    }
    fn stream_revision(&self, s: &str) -> vmplane_store::Result<Option<u64>> {
        self.inner.stream_revision(s)
    }
    fn claim_holder(&self, k: &str) -> vmplane_store::Result<Option<String>> {
        self.inner.claim_holder(k)
    }
    fn verify(
        &self,
        v: vmplane_store::PayloadValidator<'_>,
    ) -> vmplane_store::Result<vmplane_store::VerifyReport> {
        self.inner.verify(v)
    }
    fn limits(&self) -> &vmplane_store::Limits {
        self.inner.limits()
    }
}

#[test]
fn an_audit_with_a_limit_answers_the_newest_matches_and_counts_the_older_ones() {
    let env = env();
    for i in 0..6 {
        env.apply_vm("alice", vm("audit-a", &format!("vm-{i}"), "128Mi"));
        env.apply_vm("bob", vm("audit-b", &format!("vm-{i}"), "128Mi"));
    }
    let all = env
        .projections
        .audit(&AuditQuery::default())
        .expect("audit");
    assert_eq!(all.older, 0);
    let newest_three = env
        .projections
        .audit(&AuditQuery {
            records_max: 3,
            ..AuditQuery::default()
        })
        .expect("audit");
    assert_eq!(newest_three.records, all.records[all.records.len() - 3..]);
    assert_eq!(newest_three.older, (all.records.len() - 3) as u64);
    // A reader of one namespace: its newest entries, whatever the other namespace wrote
    // after them.
    let readable = env
        .projections
        .audit(&AuditQuery {
            readable: Some(vec!["audit-a".into()]),
            records_max: 2,
            ..AuditQuery::default()
        })
        .expect("audit");
    let newest_of_a: Vec<&AuditRecord> = all
        .records
        .iter()
        .filter(|r| r.namespace == "audit-a")
        .collect();
    assert_eq!(
        readable.records.iter().collect::<Vec<_>>(),
        newest_of_a[newest_of_a.len() - 2..]
    );
    assert_eq!(readable.older, (newest_of_a.len() - 2) as u64);
}

#[test]
fn a_kubevirt_object_of_another_name_is_not_the_cluster_config() {
    let env = env();
    let kubevirt = vmplane_core::types::parse_manifest(
        b"apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: kubevirt, namespace: kubevirt}\nspec: {}\n",
    )
    .expect("kubevirt manifest");
    env.run("admin", Command::apply(kubevirt));
    let delete = |name: &str| Command::Object {
        kind: Kind::KubeVirt,
        namespace: String::new(),
        name: name.into(),
        command: vmplane_core::ObjectCommand::Delete(None),
    };
    let head = env.log.head();
    match env.commands.execute(&meta("admin"), delete("other")) {
        Err(CommandError::Rejected(r)) => {
            assert_eq!(r.category, Category::NotFound);
            assert!(r.to_string().contains("\"other\" not found"), "{r}");
        }
        other => panic!("deleting KubeVirt other: {other:?}"),
    }
    assert_eq!(env.log.head(), head, "nothing appended");
    for result in [
        env.projections
            .history(Kind::KubeVirt, "", "other")
            .map(|_| ()),
        env.projections
            .diff(Kind::KubeVirt, "", "other", 1, None)
            .map(|_| ()),
    ] {
        match result {
            Err(Error::NotFound { what }) => assert_eq!(what, "KubeVirt other"),
            other => panic!("KubeVirt other: {other:?}"),
        }
    }
    assert_eq!(
        env.projections
            .history(Kind::KubeVirt, "", "kubevirt")
            .expect("history")
            .len(),
        1
    );
    let deleted = env.run("admin", delete("kubevirt"));
    assert_eq!(deleted.outcome, Outcome::Deleted);
}

fn racing(env: &common::Env, memory: &'static str) -> CommandHandler {
    let other_log = Arc::clone(&env.log);
    let race: Box<dyn FnOnce() + Send> = Box::new(move || {
        let other = CommandHandler::new(
            other_log,
            Arc::new(vmplane_projections::StateCache::new(Default::default())),
            CommandOptions::default(),
        );
        other
            .execute(
                &meta("bob"),
                Command::apply(vmplane_core::types::Manifest::VirtualMachine(Box::new(vm(
                    "default", "demo", memory,
                )))),
            )
            .expect("the racing write");
    });
    let log: Arc<dyn EventLog> = Arc::new(RacingLog {
        inner: Arc::clone(&env.log),
        race: std::sync::Mutex::new(Some(race)),
    });
    CommandHandler::new(
        log,
        Arc::clone(env.projections.cache()),
        CommandOptions::default(),
    )
}

#[test]
fn command_path_retries_after_a_concurrent_write() {
    let env = env();
    env.apply_vm("alice", vm("default", "demo", "128Mi"));
    let handler = racing(&env, "256Mi");
    let done = handler
        .execute(
            &meta("alice"),
            Command::Vm {
                namespace: "default".into(),
                name: "demo".into(),
                command: VmCommand::Start { paused: false },
            },
        )
        .expect("start after a retry");
    assert_eq!(done.attempts, 2);
    assert_eq!(
        done.generation, 2,
        "the racing edit counts, the start request does not"
    );
    let history = env
        .projections
        .history(Kind::VirtualMachine, "default", "demo")
        .expect("history");
    let actors: Vec<_> = history.iter().map(|h| h.actor.as_str()).collect();
    assert_eq!(actors, ["alice", "bob", "alice"]);
}

#[test]
fn an_expected_generation_conflict_reports_the_actual_generation() {
    let env = env();
    env.apply_vm("alice", vm("default", "demo", "128Mi"));
    // Decided at generation 1, but bob edits first: the retry sees generation 2.
    let handler = racing(&env, "256Mi");
    let mut update = vmplane_core::PutVm::new(vm("default", "demo", "512Mi"));
    update.expected_generation = Some(1);
    let result = handler.execute(
        &meta("alice"),
        Command::Vm {
            namespace: "default".into(),
            name: "demo".into(),
            command: VmCommand::Update(Box::new(update.clone())),
        },
    );
    match result {
        Err(CommandError::Rejected(r)) => {
            assert_eq!(r.category, Category::Conflict);
            assert_eq!(r.actual_generation, Some(2));
            assert!(r.has_code(codes::GENERATION_CONFLICT));
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    // Without a race too: no retry, the actual generation.
    match env.commands.execute(
        &meta("alice"),
        Command::Vm {
            namespace: "default".into(),
            name: "demo".into(),
            command: VmCommand::Update(Box::new(update)),
        },
    ) {
        Err(CommandError::Rejected(r)) => assert_eq!(r.actual_generation, Some(2)),
        other => panic!("expected a conflict, got {other:?}"),
    }
}

#[test]
fn retries_stop_at_decide_retries_max() {
    let env = env();
    env.apply_vm("alice", vm("default", "demo", "128Mi"));
    let handler = {
        let log = Arc::clone(&env.log);
        CommandHandler::new(
            Arc::new(RacingLog {
                inner: Arc::clone(&log),
                race: std::sync::Mutex::new(Some(Box::new(move || {
                    let other = CommandHandler::new(
                        Arc::clone(&log),
                        Arc::new(vmplane_projections::StateCache::new(Default::default())),
                        CommandOptions::default(),
                    );
                    other
                        .execute(
                            &meta("bob"),
                            Command::apply(vmplane_core::types::Manifest::VirtualMachine(
                                Box::new(vm("default", "demo", "300Mi")),
                            )),
                        )
                        .expect("race");
                }))),
            }),
            Arc::clone(env.projections.cache()),
            CommandOptions {
                decide_retries_max: 0,
                ..CommandOptions::default()
            },
        )
    };
    match handler.execute(
        &meta("alice"),
        Command::Vm {
            namespace: "default".into(),
            name: "demo".into(),
            command: VmCommand::Start { paused: false },
        },
    ) {
        Err(CommandError::RetriesExhausted { attempts, .. }) => assert_eq!(attempts, 1),
        other => panic!("expected exhausted retries, got {other:?}"),
    }
}

#[test]
fn a_standalone_vmi_refused_a_firmware_uuid_a_vm_holds_is_told_its_own_field() {
    let env = env();
    let uuid = "6a1f0000-1111-4222-8333-444455556678";
    env.run(
        "alice",
        Command::Vm {
            namespace: "default".into(),
            name: "holder".into(),
            command: VmCommand::Apply(put(vm_with("default", "holder", "128Mi", Some(uuid)))),
        },
    );
    let vmi = |_: ()| {
        Command::apply(
            vmplane_core::types::parse_manifest(
                format!(
                    "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {{name: loner, namespace: default}}\nspec:\n  domain:\n    memory: {{guest: 64Mi}}\n    devices: {{}}\n    firmware: {{uuid: {uuid}}}\n"
                )
                .as_bytes(),
            )
            .expect("a VMI manifest"),
        )
    };
    for refused in [
        env.commands.dry_run(vmi(())).err(),
        env.commands.execute(&meta("alice"), vmi(())).err(),
    ] {
        match refused {
            Some(CommandError::Rejected(r)) => {
                assert!(r.has_code(codes::FIRMWARE_UUID_TAKEN), "{r}");
                assert_eq!(r.causes[0].field, "spec.domain.firmware.uuid", "{r}");
            }
            other => panic!("expected the firmware UUID refused, got {other:?}"),
        }
    }
}

#[test]
fn a_dry_run_is_refused_what_the_append_would_refuse_a_firmware_uuid_another_vm_holds() {
    let env = env();
    let uuid = "6a1f0000-1111-4222-8333-444455556677";
    let create = |name: &str| Command::Vm {
        namespace: "default".into(),
        name: name.into(),
        command: VmCommand::Apply(put(vm_with("default", name, "128Mi", Some(uuid)))),
    };
    env.run("alice", create("holder"));
    let head = env.log.head();
    let refused = env.commands.dry_run(create("thief"));
    match &refused {
        Err(CommandError::Rejected(r)) => {
            assert_eq!(r.category, Category::AlreadyExists);
            assert!(r.has_code(codes::FIRMWARE_UUID_TAKEN), "{r}");
        }
        other => panic!("expected the firmware UUID refused, got {other:?}"),
    }
    assert_eq!(env.log.head(), head, "a dry run appends nothing");
    // The holder itself may still re-apply (its own claim), and the real apply agrees.
    assert_eq!(
        env.commands.dry_run(create("holder")).expect("own claim"),
        Outcome::Unchanged
    );
    assert!(
        env.commands
            .execute(&meta("alice"), create("thief"))
            .is_err()
    );
}

#[test]
fn two_concurrent_creates_with_one_firmware_uuid_one_wins() {
    let env = Arc::new(env());
    let uuid = "6a1f0000-1111-4222-8333-444455556666";
    let handles: Vec<_> = ["left", "right"]
        .into_iter()
        .map(|name| {
            let env = Arc::clone(&env);
            std::thread::spawn(move || {
                env.commands.execute(
                    &meta("alice"),
                    Command::Vm {
                        namespace: "default".into(),
                        name: name.into(),
                        command: VmCommand::Create(put(vm_with(
                            "default",
                            name,
                            "128Mi",
                            Some(uuid),
                        ))),
                    },
                )
            })
        })
        .collect();
    let results: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("thread"))
        .collect();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, 1, "{results:?}");
    let rejection = results
        .iter()
        .find_map(|r| match r {
            Err(CommandError::Rejected(r)) => Some(r),
            _ => None,
        })
        .expect("one rejection");
    assert_eq!(rejection.category, Category::AlreadyExists);
    assert!(rejection.has_code(codes::FIRMWARE_UUID_TAKEN));
    // The holder is named to a reader of its namespace only.
    assert!(
        rejection
            .describe_for(|ns| ns == Some("default"))
            .contains("vm/default/"),
        "{rejection}"
    );
    assert!(
        rejection.to_string().contains("another object")
            && !rejection.to_string().contains("vm/default/"),
        "{rejection}"
    );
    let holder = env
        .projections
        .firmware_holder(uuid.parse().expect("uuid"))
        .expect("index")
        .expect("held");
    assert!(holder.stream == "vm/default/left" || holder.stream == "vm/default/right");
}

#[test]
fn a_request_id_makes_a_retry_idempotent() {
    let env = env();
    let mut m = meta("alice");
    m.request_id = Some(uuid::Uuid::now_v7());
    let create = || Command::Vm {
        namespace: "default".into(),
        name: "demo".into(),
        command: VmCommand::Create(put(vm("default", "demo", "128Mi"))),
    };
    let first = env.commands.execute(&m, create()).expect("create");
    let again = env.commands.execute(&m, create()).expect("retry");
    assert_eq!(first.position, again.position);
    assert_eq!(env.log.head(), first.position);
}

#[test]
fn a_request_id_reused_by_another_principal_or_for_another_object_is_another_request() {
    let env = env();
    let id = uuid::Uuid::now_v7();
    let with_id = |actor: &str| {
        let mut m = meta(actor);
        m.request_id = Some(id);
        m
    };
    let apply = |name: &str, memory: &str| Command::Vm {
        namespace: "default".into(),
        name: name.into(),
        command: VmCommand::Apply(put(vm("default", name, memory))),
    };
    let first = env
        .commands
        .execute(&with_id("alice"), apply("demo", "128Mi"))
        .expect("create");
    // Bob's edit with the same id is written, not answered with alice's create.
    let bobs = env
        .commands
        .execute(&with_id("bob"), apply("demo", "256Mi"))
        .expect("bob's edit");
    assert_eq!(bobs.outcome, Outcome::Configured);
    assert!(bobs.position > first.position);
    // Alice's request for another object with the same id is written too.
    let other = env
        .commands
        .execute(&with_id("alice"), apply("other", "128Mi"))
        .expect("another object");
    assert_eq!(other.outcome, Outcome::Created);
    assert!(other.position > bobs.position);
    // A real retry still finds its first answer, from the log after a restart too.
    let env = env.restart();
    let head = env.log.head();
    let again = env
        .commands
        .execute(&with_id("alice"), apply("demo", "128Mi"))
        .expect("retry");
    assert_eq!(again.position, first.position);
    assert_eq!(env.log.head(), head, "a retry appends nothing");
}

#[test]
fn instancetype_references_are_resolved_from_the_log() {
    let env = env();
    let it = vmplane_core::types::parse_manifest(
        b"apiVersion: instancetype.kubevirt.io/v1beta1\nkind: VirtualMachineClusterInstancetype\nmetadata: {name: small}\nspec: {cpu: {guest: 1}, memory: {guest: 1Gi}}\n",
    )
    .expect("instancetype");
    env.run("admin", Command::apply(it));
    let vm_yaml = b"apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: sized, namespace: default}\nspec:\n  runStrategy: Halted\n  instancetype: {name: small, kind: VirtualMachineClusterInstancetype}\n  template: {spec: {domain: {devices: {}}}}\n";
    let done = env.run(
        "alice",
        Command::apply(vmplane_core::types::parse_manifest(vm_yaml).expect("vm")),
    );
    let view = env
        .projections
        .get(
            Kind::VirtualMachine,
            "default",
            "sized",
            Some(done.position),
        )
        .expect("get")
        .expect("exists");
    assert_eq!(
        view.object["status"]["instancetypeRef"]["name"], "small",
        "{:#}",
        view.object["status"]
    );
    assert_eq!(
        view.object["status"]["instancetypeRef"]["revision"], 1,
        "{:#}",
        view.object["status"]
    );
    let users = env
        .projections
        .vms_using_revision(Kind::VirtualMachineClusterInstancetype, "small", Some(1))
        .expect("index");
    assert_eq!(users.len(), 1);
    assert_eq!(users[0].name, "sized");
    let it_view = env
        .projections
        .get(Kind::VirtualMachineClusterInstancetype, "", "small", None)
        .expect("get")
        .expect("exists");
    assert_eq!(it_view.object["metadata"]["name"], "small");
}

#[test]
fn feature_index_answers_which_vms_request_a_feature() {
    let env = env();
    let yaml = b"apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: metrics, namespace: default}\nspec:\n  runStrategy: Halted\n  template: {spec: {domain: {memory: {guest: 128Mi}, devices: {downwardMetrics: {}}}}}\n";
    env.run(
        "alice",
        Command::apply(vmplane_core::types::parse_manifest(yaml).expect("vm")),
    );
    env.apply_vm("alice", vm("default", "plain", "128Mi"));
    let users = env
        .projections
        .vms_using_feature("DownwardMetrics")
        .expect("index");
    let names: Vec<_> = users.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(names, ["metrics"]);
    env.vm_command(
        "alice",
        "default",
        "metrics",
        VmCommand::Delete {
            expected_generation: None,
        },
    );
    assert!(
        env.projections
            .vms_using_feature("DownwardMetrics")
            .expect("index")
            .is_empty()
    );
}

/// A core-encoded event as the command path would append it.
fn proposed(event: &vmplane_core::Event) -> vmplane_store::ProposedEvent {
    let e = vmplane_core::encode(event);
    vmplane_store::ProposedEvent {
        id: uuid::Uuid::now_v7(),
        event_type: e.type_name.to_owned(),
        schema_version: e.version,
        payload: e.bytes,
        actor: "test".into(),
        correlation_id: uuid::Uuid::now_v7(),
        causation_id: None,
    }
}

fn manifest_json(name: &str, memory: u64) -> String {
    format!(
        r#"{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{{"name":"{name}","namespace":"default"}},"spec":{{"runStrategy":"Halted","template":{{"spec":{{"domain":{{"memory":{{"guest":"{memory}Mi"}},"devices":{{}}}}}}}}}}}}"#
    )
}

/// Appends `count` events to `vm/default/<name>` in one append: a creation first if the stream
/// is new, then spec edits.
fn append_edits(log: &dyn EventLog, name: &str, revision: &mut u64, count: u64) {
    use vmplane_core::event::{CreateOrigin, FirmwareOrigin, VmCreated, VmSpecEdited};
    let mut events = Vec::new();
    for i in 0..count {
        let memory = 64 + *revision + i;
        let event = if *revision + i == 0 {
            vmplane_core::Event::VmCreated(VmCreated {
                uid: uuid::Uuid::new_v4(),
                namespace: "default".into(),
                name: name.into(),
                origin: CreateOrigin::Apply,
                manifest_json: manifest_json(name, memory),
                firmware_uuid: uuid::Uuid::new_v4(),
                firmware_serial: None,
                firmware_origin: FirmwareOrigin::Generated,
            })
        } else {
            vmplane_core::Event::VmSpecEdited(VmSpecEdited {
                manifest_json: manifest_json(name, memory),
            })
        };
        events.push(proposed(&event));
    }
    let expected = if *revision == 0 {
        vmplane_store::ExpectedRevision::NoStream
    } else {
        vmplane_store::ExpectedRevision::Exact(*revision)
    };
    log.append(vmplane_store::AppendRequest::new(
        format!("vm/default/{name}"),
        expected,
        events,
    ))
    .expect("append");
    *revision += count;
}

/// Time travel folds a stream's events by scanning the log's positions in place when they sit
/// close together, and through the stream index when other streams' events lie between them:
/// either way, at every revision, from a warm or a cold cache, the state is the one a plain
/// fold of the stream's own events gives.
#[test]
fn folding_by_position_range_equals_folding_by_stream_reads() {
    let env = env();
    let (mut a, mut b, mut noise) = (0u64, 0u64, 0u64);
    for round in 0..40u64 {
        // Bursts of `a` (dense), single events of `b` between them, and every 5th round a
        // long run of another stream, so some ranges are too sparse to scan.
        append_edits(env.log.as_ref(), "a", &mut a, round % 7 + 1);
        append_edits(env.log.as_ref(), "b", &mut b, 1);
        if round % 5 == 4 {
            append_edits(env.log.as_ref(), "noise", &mut noise, 150);
        }
    }
    env.projections.catch_up().expect("catch up");
    for (stream, revisions) in [("vm/default/a", a), ("vm/default/b", b)] {
        let plain = vmplane_projections::StateCache::new(vmplane_projections::CacheOptions {
            snapshot_every_revisions: u64::MAX,
            ..vmplane_projections::CacheOptions::default()
        });
        let expected: Vec<_> = (1..=revisions)
            .map(|r| {
                plain.clear();
                plain
                    .state_at(env.log.as_ref(), stream, Kind::VirtualMachine, r)
                    .expect("plain fold")
            })
            .collect();
        // Warm (in order, then at random), then cold, in reverse order.
        let mut order: Vec<u64> = (1..=revisions).collect();
        order.extend((1..=revisions).map(|r| (r * 7919) % revisions + 1));
        for r in order {
            let got = env
                .projections
                .state_at(stream, Kind::VirtualMachine, r)
                .expect("state_at");
            assert_eq!(
                *got,
                *expected[(r - 1) as usize],
                "{stream} at revision {r}"
            );
        }
        for r in (1..=revisions).rev() {
            env.projections.cache().clear();
            let got = env
                .projections
                .state_at(stream, Kind::VirtualMachine, r)
                .expect("state_at");
            assert_eq!(
                *got,
                *expected[(r - 1) as usize],
                "{stream} at revision {r} (cold)"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Time travel, against a model that records every version

#[derive(Debug, Clone)]
enum Op {
    Edit(u16),
    Start,
    Stop,
    Delete,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (64u16..512).prop_map(Op::Edit),
        1 => Just(Op::Start),
        1 => Just(Op::Stop),
        1 => Just(Op::Delete),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
    #[test]
    fn time_travel_returns_each_version_exactly(ops in prop::collection::vec((0usize..2, op()), 1..14)) {
        let env = env();
        // Every version: (stream revision, position, recorded_at, spec or None if not live).
        let mut versions: Vec<(usize, u64, Position, Timestamp, Option<serde_json::Value>)> = Vec::new();
        for (which, op) in ops {
            let name = ["one", "two"][which];
            let current = env.projections.get(Kind::VirtualMachine, "default", name, None).expect("get");
            let command = match (op, current.is_some()) {
                (Op::Edit(m), _) => VmCommand::Apply(put(vm("default", name, &format!("{m}Mi")))),
                (Op::Start, true) => VmCommand::Start { paused: false },
                (Op::Stop, true) => VmCommand::Stop,
                (Op::Delete, true) => VmCommand::Delete { expected_generation: None },
                (_, false) => VmCommand::Apply(put(vm("default", name, "100Mi"))),
            };
            let Ok(done) = env.commands.execute(&meta("prop"), Command::Vm { namespace: "default".into(), name: name.into(), command }) else {
                continue; // a refused start/stop: nothing appended
            };
            let Some(append) = done.append else { continue };
            let event = env.log.read_event(append.last_position).expect("read").expect("event");
            let spec = env
                .projections
                .get(Kind::VirtualMachine, "default", name, Some(done.position))
                .expect("get")
                .map(|v| v.spec().clone());
            versions.push((which, append.last_revision, append.last_position, event.recorded_at, spec));
        }
        // Reopen, so nothing comes from the command path's cache.
        let env = env.restart();
        for (which, revision, position, recorded_at, spec) in &versions {
            let name = ["one", "two"][*which];
            let at_rev = env.projections.get_at(Kind::VirtualMachine, "default", name, At::Revision(*revision)).expect("rev").map(|v| v.spec().clone());
            prop_assert_eq!(&at_rev, spec);
            let at_pos = env.projections.get_at(Kind::VirtualMachine, "default", name, At::Position(*position)).expect("pos").map(|v| v.spec().clone());
            prop_assert_eq!(&at_pos, spec);
            // A position in between (another VM's event) still shows this VM's last version.
            let next_other = versions.iter().find(|v| v.0 != *which && v.2 > *position);
            let next_own = versions.iter().find(|v| v.0 == *which && v.2 > *position);
            if let Some(other) = next_other && next_own.is_none_or(|own| own.2 > other.2) {
                let between = env.projections.get_at(Kind::VirtualMachine, "default", name, At::Position(other.2)).expect("pos").map(|v| v.spec().clone());
                prop_assert_eq!(&between, spec);
            }
            // As of the instant of the version's last event, unless a later event shares it.
            let same_instant = versions.iter().any(|v| v.2 > *position && v.3 == *recorded_at);
            if !same_instant {
                let at_time = env.projections.get_at(Kind::VirtualMachine, "default", name, At::Time(*recorded_at)).expect("time").map(|v| v.spec().clone());
                prop_assert_eq!(&at_time, spec);
            }
        }
        // Before anything: nothing.
        prop_assert!(env.projections.get_at(Kind::VirtualMachine, "default", "one", At::Time(Timestamp(1))).expect("t").is_none());
    }
}
