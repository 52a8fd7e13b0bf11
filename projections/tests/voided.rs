//! The read models over a log a point-in-time restore cut: the positions it voided (one
//! `LogPositionVoided` event each, on `system/restore/<epoch>`, as the gateway's restore writes
//! them) are folded into ranges that survive a checkpoint and a rebuild alike; a list is never
//! told it read at a voided position; audit shows each cut once. Both embedded backends.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{env, meta, vm};
use uuid::Uuid;
use vmplane_core::VmCommand;
use vmplane_core::types::{Kind, Manifest};
use vmplane_projections::projections::VoidedRange;
use vmplane_projections::{
    AuditQuery, Command, CommandHandler, CommandOptions, ListPage, ProjectionOptions, Projections,
    WatchFilter,
};
use vmplane_store::hash::GENESIS_PREV_HASH;
use vmplane_store::sled_log::ImportOptions;
use vmplane_store::{EventLog, FileLog, Position, RecordedEvent, SledLog, Timestamp};

const NS: &str = "voided";

/// The original log: `a` and `b` created, then `b` deleted. Its events, and the position
/// after `b`'s creation (where the restores below cut).
fn original() -> (Vec<RecordedEvent>, u64) {
    let env = env();
    env.apply_vm("alice", vm(NS, "a", "128Mi"));
    let cut = env.apply_vm("alice", vm(NS, "b", "128Mi")).position.0;
    env.vm_command(
        "alice",
        NS,
        "b",
        VmCommand::Delete {
            expected_generation: None,
        },
    );
    let events = env.log.read_all(Position(0), 1_000).expect("read the log");
    assert!(events.len() as u64 > cut, "the deletion follows the cut");
    (events, cut)
}

/// What a restore of `events` cut at `cut` imports: the events up to the cut as they are, then
/// one void event per position after it, recorded at `restored_at`.
fn restored(
    events: &[RecordedEvent],
    cut: u64,
    epoch: Uuid,
    restored_at: Timestamp,
) -> Vec<RecordedEvent> {
    let mut out = Vec::new();
    let mut prev = GENESIS_PREV_HASH;
    let mut voided = 0;
    for e in events {
        let e = if e.position.0 <= cut {
            e.clone()
        } else {
            voided += 1;
            vmplane_projections::void_event(e, epoch, cut, voided, restored_at, prev)
        };
        prev = e.hash;
        out.push(e);
    }
    out
}

#[derive(Clone, Copy, Debug)]
enum Backend {
    Sled,
    File,
}

fn open_log(backend: Backend, dir: &Path) -> Arc<dyn EventLog> {
    match backend {
        Backend::Sled => Arc::new(SledLog::open(dir.join("log")).expect("open sled")),
        Backend::File => Arc::new(FileLog::open(dir.join("log")).expect("open file log")),
    }
}

/// A data directory holding `events` (imported as a restore does, with no claims: nothing here
/// asks for one) and a checkpoint of its projections, as a restore leaves it.
fn import(backend: Backend, dir: &Path, events: Vec<RecordedEvent>) {
    match backend {
        Backend::Sled => {
            let mut log = SledLog::open(dir.join("log")).expect("open sled");
            let mut importer = log.importer(ImportOptions::default()).expect("importer");
            for e in events {
                importer.push(e, &[]).expect("import");
            }
            importer.finish().expect("finish");
        }
        Backend::File => {
            let mut log = FileLog::open(dir.join("log")).expect("open file log");
            let mut importer = log.importer().expect("importer");
            for e in events {
                importer.push(e, &[]).expect("import");
            }
            importer.finish().expect("finish");
        }
    }
    let log = open_log(backend, dir);
    let projections = Projections::open(log, dir, options()).expect("projections");
    projections.checkpoint().expect("checkpoint");
}

fn options() -> ProjectionOptions {
    ProjectionOptions {
        checkpoint_every_events: 0,
        ..ProjectionOptions::default()
    }
}

fn list_position(projections: &Projections, page: &ListPage) -> u64 {
    projections
        .visit_page(Kind::VirtualMachine, Some(NS), page, |_| {})
        .expect("list")
        .position
        .0
}

#[test]
fn a_list_over_a_cut_log_reads_at_the_last_position_before_the_voided_ones() {
    let (events, cut) = original();
    let last = events.len() as u64;
    for backend in [Backend::Sled, Backend::File] {
        let dir = tempfile::tempdir().expect("tempdir");
        let epoch = Uuid::now_v7();
        let restored_at = Timestamp::now();
        import(
            backend,
            dir.path(),
            restored(&events, cut, epoch, restored_at),
        );
        // Opened from the restore's checkpoint, then from a rebuild: the same answers.
        for round in ["checkpoint", "rebuilt"] {
            let log = open_log(backend, dir.path());
            let projections =
                Projections::open(Arc::clone(&log), dir.path(), options()).expect("projections");
            if round == "rebuilt" {
                let digest = projections.digest().expect("digest");
                projections.rebuild().expect("rebuild");
                assert_eq!(projections.digest().expect("digest"), digest, "{backend:?}");
            }
            assert_eq!(projections.position(), Position(last), "{backend:?}");
            let listed = projections
                .list(Kind::VirtualMachine, Some(NS), None)
                .expect("list");
            assert_eq!(
                listed.position,
                Position(cut),
                "{backend:?} {round}: a list read at voided {last}"
            );
            let names: Vec<&str> = listed.items.iter().map(|v| v.name.as_str()).collect();
            assert_eq!(names, ["a", "b"], "the state at the cut");
            // Paged: every page at the first page's position, never a voided one.
            let first = ListPage {
                limit: Some(1),
                ..ListPage::default()
            };
            let end = projections
                .visit_page(Kind::VirtualMachine, Some(NS), &first, |_| {})
                .expect("page 1");
            assert_eq!(end.position, Position(cut), "{backend:?} {round}");
            let second = ListPage {
                limit: Some(1),
                at: Some(end.position),
                after: end.next.clone(),
                ..ListPage::default()
            };
            assert_eq!(list_position(&projections, &second), cut);
            assert_eq!(projections.read_position(), Position(cut));
            assert_eq!(projections.live_position(Position(last)), Position(cut));
            assert_eq!(projections.live_position(Position(cut)), Position(cut));
            assert_eq!(
                projections.voided().expect("voided"),
                vec![VoidedRange {
                    first: cut + 1,
                    last,
                    epoch,
                    cut,
                    recorded_at_ns: restored_at.0,
                    original_from_ns: events[cut as usize].recorded_at.0,
                    original_to_ns: events[last as usize - 1].recorded_at.0,
                    actor: "system:restore".into(),
                }],
                "{backend:?} {round}"
            );
            for p in cut + 1..=last {
                let range = projections.voided_at(Position(p)).expect("voided_at");
                assert!(range.is_some_and(|r| r.holds(p)), "{p}");
            }
            assert_eq!(projections.voided_at(Position(cut)).expect("at"), None);
        }

        // A write after the restore: the list reads at it, and a watch from the list's
        // position before the write delivers it first, without a gap or a repeat.
        let log = open_log(backend, dir.path());
        let projections =
            Projections::open(Arc::clone(&log), dir.path(), options()).expect("projections");
        let before = projections
            .list(Kind::VirtualMachine, Some(NS), None)
            .expect("list")
            .position;
        let mut watch = projections.watch(
            before,
            WatchFilter {
                kind: Some(Kind::VirtualMachine),
                namespace: Some(NS.into()),
            },
        );
        let commands = CommandHandler::new(
            Arc::clone(&log),
            Arc::clone(projections.cache()),
            CommandOptions::default(),
        );
        let written = commands
            .execute(
                &meta("alice"),
                Command::apply(Manifest::VirtualMachine(Box::new(vm(NS, "c", "128Mi")))),
            )
            .expect("apply");
        assert_eq!(written.position, Position(last + 1));
        let delivered = watch
            .next_batch(10, Duration::from_secs(10))
            .expect("watch");
        assert_eq!(
            delivered.iter().map(|e| e.position).collect::<Vec<_>>(),
            [last + 1]
        );
        assert_eq!(
            projections
                .list(Kind::VirtualMachine, Some(NS), Some(written.position))
                .expect("list")
                .position,
            Position(last + 1)
        );
        assert_eq!(projections.read_position(), Position(last + 1));
    }
}

#[test]
fn a_cut_inside_an_earlier_cut_is_stepped_over_to_the_position_before_both() {
    let (events, cut) = original();
    let last = events.len() as u64;
    assert!(last > cut);
    // A first restore voided cut+1..=last; a second one, of that log, cut at cut+1 (keeping
    // the first void event) and voided the rest: two touching ranges of two restores.
    let (first, second) = (Uuid::now_v7(), Uuid::now_v7());
    let now = Timestamp::now();
    let once = restored(&events, cut, first, now);
    // The log the second restore read has one more event: so that it has a rest to void.
    let dir = tempfile::tempdir().expect("tempdir");
    import(Backend::Sled, dir.path(), once);
    let log = open_log(Backend::Sled, dir.path());
    let projections =
        Projections::open(Arc::clone(&log), dir.path(), options()).expect("projections");
    let commands = CommandHandler::new(
        Arc::clone(&log),
        Arc::clone(projections.cache()),
        CommandOptions::default(),
    );
    commands
        .execute(
            &meta("alice"),
            Command::apply(Manifest::VirtualMachine(Box::new(vm(NS, "c", "128Mi")))),
        )
        .expect("apply");
    let grown = log.read_all(Position(0), 1_000).expect("read");
    drop((projections, commands, log));
    let twice = restored(&grown, cut + 1, second, Timestamp::now());
    let head = twice.len() as u64;
    let dir = tempfile::tempdir().expect("tempdir");
    import(Backend::Sled, dir.path(), twice);
    let log = open_log(Backend::Sled, dir.path());
    let projections = Projections::open(log, dir.path(), options()).expect("projections");
    let ranges = projections.voided().expect("voided");
    assert_eq!(
        ranges
            .iter()
            .map(|r| (r.first, r.last, r.epoch, r.cut))
            .collect::<Vec<_>>(),
        [
            (cut + 1, cut + 1, first, cut),
            (cut + 2, head, second, cut + 1)
        ]
    );
    assert_eq!(projections.live_position(Position(head)), Position(cut));
    assert_eq!(
        projections
            .list(Kind::VirtualMachine, Some(NS), None)
            .expect("list")
            .position,
        Position(cut)
    );
    // Audit: one entry per range.
    let audit = projections
        .audit_with_voided(&AuditQuery::default())
        .expect("audit");
    let cuts: Vec<_> = audit
        .records
        .iter()
        .filter(|r| r.actor == "system:restore")
        .map(|r| r.position)
        .collect();
    assert_eq!(cuts, [cut + 1, cut + 2]);
}

#[test]
fn audit_shows_each_cut_once_by_its_filters_and_within_the_limit() {
    let (events, cut) = original();
    let last = events.len() as u64;
    let dir = tempfile::tempdir().expect("tempdir");
    let epoch = Uuid::now_v7();
    let restored_at = Timestamp::now();
    import(
        Backend::Sled,
        dir.path(),
        restored(&events, cut, epoch, restored_at),
    );
    let log = open_log(Backend::Sled, dir.path());
    let projections = Projections::open(log, dir.path(), options()).expect("projections");
    let audit = |query: AuditQuery| projections.audit_with_voided(&query).expect("audit");

    let all = audit(AuditQuery::default());
    let positions: Vec<u64> = all.records.iter().map(|r| r.position).collect();
    assert_eq!(positions, (1..=cut + 1).collect::<Vec<_>>(), "{all:?}");
    let entry = all.records.last().expect("the cut's entry");
    assert_eq!(entry.actor, "system:restore");
    assert_eq!(entry.event, "LogPositionVoided");
    assert_eq!(entry.namespace, "");
    assert_eq!(entry.kind, "");
    assert_eq!(entry.name, format!("system/restore/{epoch}"));
    assert!(
        entry
            .summary
            .contains(&format!("positions {}..={last} voided", cut + 1)),
        "{}",
        entry.summary
    );
    assert!(
        entry
            .summary
            .contains(&format!("cut the log at position {cut}")),
        "{}",
        entry.summary
    );
    assert!(entry.summary.contains(&epoch.to_string()));
    // No object of the voided events is named.
    assert!(!entry.summary.contains("vm/"), "{}", entry.summary);

    let by_restore = audit(AuditQuery {
        actor: Some("system:restore".into()),
        ..AuditQuery::default()
    });
    assert_eq!(by_restore.records, std::slice::from_ref(entry));
    let by_alice = audit(AuditQuery {
        actor: Some("alice".into()),
        ..AuditQuery::default()
    });
    assert!(by_alice.records.iter().all(|r| r.actor == "alice"));
    assert_eq!(by_alice.records.len() as u64, cut);
    // A namespace's audit and a reader's namespaces keep it: the cut rewrote them all.
    for query in [
        AuditQuery {
            namespace: Some(NS.into()),
            ..AuditQuery::default()
        },
        AuditQuery {
            namespace: Some("elsewhere".into()),
            ..AuditQuery::default()
        },
        AuditQuery {
            readable: Some(vec!["elsewhere".into()]),
            ..AuditQuery::default()
        },
    ] {
        let records = audit(query.clone()).records;
        assert!(records.contains(entry), "{query:?}: {records:?}");
    }
    // A kind filter leaves it out; `since`/`until` take the time the restore recorded it.
    assert!(
        !audit(AuditQuery {
            kind: Some(Kind::VirtualMachine),
            ..AuditQuery::default()
        })
        .records
        .contains(entry)
    );
    let later = Timestamp(restored_at.0 + 1);
    assert!(
        audit(AuditQuery {
            since: Some(later),
            ..AuditQuery::default()
        })
        .records
        .is_empty()
    );
    assert_eq!(
        audit(AuditQuery {
            since: Some(restored_at),
            ..AuditQuery::default()
        })
        .records,
        std::slice::from_ref(entry)
    );
    assert!(
        !audit(AuditQuery {
            until: Some(Timestamp(restored_at.0 - 1)),
            ..AuditQuery::default()
        })
        .records
        .contains(entry)
    );
    // The newest entries within the limit: the cut, then the event before it.
    let newest = audit(AuditQuery {
        records_max: 2,
        ..AuditQuery::default()
    });
    assert_eq!(
        newest
            .records
            .iter()
            .map(|r| r.position)
            .collect::<Vec<_>>(),
        [cut, cut + 1]
    );
    assert_eq!(newest.older, cut - 1);
}

#[test]
fn an_instant_the_restore_rewrote_is_told_apart_from_one_before_or_after() {
    let (events, cut) = original();
    let dir = tempfile::tempdir().expect("tempdir");
    let restored_at = Timestamp::now();
    import(
        Backend::Sled,
        dir.path(),
        restored(&events, cut, Uuid::now_v7(), restored_at),
    );
    let log = open_log(Backend::Sled, dir.path());
    let projections = Projections::open(log, dir.path(), options()).expect("projections");
    let first_voided = events[cut as usize].recorded_at;
    let at = |t: Timestamp| projections.rewritten_at(t).expect("rewritten_at").is_some();
    assert!(at(first_voided), "the first voided event's time");
    assert!(at(Timestamp(restored_at.0 - 1)), "just before the restore");
    assert!(
        !at(Timestamp(first_voided.0 - 1)),
        "before the voided events"
    );
    assert!(!at(restored_at), "the restore itself");
    assert!(!at(Timestamp(restored_at.0 + 1_000)), "after the restore");
}
