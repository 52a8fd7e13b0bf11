//! Bulk import (`SledLog::importer`): a log rebuilt from another log's envelopes is the same
//! log — every read, index, claim and head — and stays an ordinary log afterwards; an envelope
//! the ordinary append path could not have produced is refused, naming its position.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use uuid::Uuid;
use vmplane_store::sled_log::ImportOptions;
use vmplane_store::{
    AppendRequest, Claim, Direction, Error, EventLog, ExpectedRevision, FileLog, Position,
    ProposedEvent, RecordedEvent, SledLog, SledOptions, Timestamp,
};

fn event(text: String) -> ProposedEvent {
    ProposedEvent {
        id: Uuid::now_v7(),
        event_type: "Noted".into(),
        schema_version: 1,
        payload: text.into_bytes(),
        actor: "tester".into(),
        correlation_id: Uuid::now_v7(),
        causation_id: None,
    }
}

const STREAMS: usize = 7;

/// A source log: appends of 1..=4 events over 7 streams, a clock that advances every third
/// append (so batches share times and times span batches), and uniqueness claims taken and
/// released. Returns the log and every claim list by first position of its append.
fn source(dir: &std::path::Path) -> (SledLog, Vec<(u64, Vec<Claim>)>) {
    let clock = Arc::new(AtomicI64::new(1_000));
    let options = SledOptions {
        clock: {
            let clock = Arc::clone(&clock);
            Arc::new(move || Timestamp(clock.load(Ordering::SeqCst)))
        },
        ..SledOptions::default()
    };
    let log = SledLog::open_with(dir, options).expect("open source");
    let mut claims_at = Vec::new();
    for append in 0..120usize {
        if append.is_multiple_of(3) {
            clock.fetch_add(10, Ordering::SeqCst);
        }
        let stream = format!("thing/{}", append % STREAMS);
        let events = (0..=append % 4)
            .map(|i| event(format!("append {append} event {i}")))
            .collect();
        let mut request = AppendRequest::new(stream.clone(), ExpectedRevision::Any, events);
        // Stream s holds key k-s while append/7 is even, and frees it otherwise.
        let key = format!("k-{}", append % STREAMS);
        request.claims = if (append / STREAMS).is_multiple_of(2) {
            vec![Claim::Acquire { key, owner: stream }]
        } else {
            vec![Claim::Release { key, owner: stream }]
        };
        let claims = request.claims.clone();
        let written = log.append(request).expect("append");
        claims_at.push((written.first_position.0, claims));
    }
    (log, claims_at)
}

fn all(log: &dyn EventLog) -> Vec<RecordedEvent> {
    let mut events = Vec::new();
    loop {
        let after = events
            .last()
            .map_or(Position(0), |e: &RecordedEvent| e.position);
        let chunk = log.read_all(after, 1_000).expect("read");
        if chunk.is_empty() {
            return events;
        }
        events.extend(chunk);
    }
}

/// Imports `events` (the claims go with the first event of their append).
fn import(
    log: &mut SledLog,
    events: &[RecordedEvent],
    claims_at: &[(u64, Vec<Claim>)],
    options: ImportOptions,
) -> vmplane_store::sled_log::ImportReport {
    let mut importer = log.importer(options).expect("importer");
    for e in events {
        let claims = claims_at
            .iter()
            .find(|(p, _)| *p == e.position.0)
            .map_or(&[][..], |(_, c)| c.as_slice());
        importer.push(e.clone(), claims).expect("push");
    }
    importer.finish().expect("finish")
}

/// Everything a reader can ask, for comparing two logs.
fn observe(log: &dyn EventLog, events: &[RecordedEvent]) -> Vec<String> {
    let mut seen = vec![format!("head {}", log.head())];
    for s in 0..STREAMS {
        let stream = format!("thing/{s}");
        seen.push(format!("{stream} at {:?}", log.stream_revision(&stream)));
        for (from, direction) in [
            (0, Direction::Forward),
            (3, Direction::Forward),
            (u64::MAX, Direction::Backward),
            (5, Direction::Backward),
        ] {
            let read = log
                .read_stream(&stream, from, direction, 1_000)
                .expect("read");
            seen.push(format!("{stream} {from} {direction:?}: {read:?}"));
        }
        seen.push(format!(
            "k-{s} held by {:?}",
            log.claim_holder(&format!("k-{s}")).expect("claim")
        ));
    }
    for e in events.iter().step_by(5) {
        seen.push(format!("{:?}", log.read_event(e.position).expect("read")));
        for at in [e.recorded_at.0 - 1, e.recorded_at.0, e.recorded_at.0 + 5] {
            let p = log.position_at(Timestamp(at)).expect("position_at");
            seen.push(format!("position at {at}: {p}"));
        }
    }
    seen
}

#[test]
fn an_imported_log_reads_exactly_like_its_source_and_continues_as_an_ordinary_log() {
    let root = tempfile::tempdir().expect("tempdir");
    let (source, claims_at) = source(&root.path().join("source"));
    let events = all(&source);
    assert_eq!(events.len() as u64, source.head().0);
    let expected = observe(&source, &events);
    let source_report = source.verify(&|_, _, _| Ok(())).expect("verify");

    let target_dir = root.path().join("target");
    let mut target = SledLog::open(&target_dir).expect("open target");
    // Syncs every 17 events: many durable steps, runs of one stream split across them. Two
    // imports: the second one finds the first one's ids on disk.
    let options = ImportOptions {
        sync_every_events: 17,
        sync_every_bytes: 1 << 20,
        value_events_max: 5,
        ..ImportOptions::default()
    };
    let first = import(&mut target, &events[..60], &claims_at, options);
    let report = import(&mut target, &events[60..], &claims_at, options);
    assert_eq!(first.events + report.events, events.len() as u64);
    assert_eq!(report.head, source.head());
    assert_eq!(report.head_hash, source_report.head_hash);
    assert_eq!(
        first.syncs + report.syncs,
        60u64.div_ceil(17) + (events.len() as u64 - 60).div_ceil(17)
    );
    assert_eq!(all(&target), events);
    assert_eq!(observe(&target, &events), expected);
    assert_eq!(
        target.verify(&|_, _, _| Ok(())).expect("verify").head_hash,
        source_report.head_hash
    );

    // A retry of an imported append replays (the ids are found on disk).
    let last = events.last().expect("events");
    let retry = AppendRequest::new(
        last.stream.clone(),
        ExpectedRevision::Any,
        vec![ProposedEvent {
            id: last.id,
            event_type: last.event_type.clone(),
            schema_version: last.schema_version,
            payload: last.payload.clone(),
            actor: last.actor.clone(),
            correlation_id: last.correlation_id,
            causation_id: last.causation_id,
        }],
    );
    let replayed = target.append(retry).expect("retry");
    assert!(replayed.replayed);
    assert_eq!(replayed.first_position, last.position);

    // Reopened: the heads checkpoint, claims and head are on disk.
    drop(target);
    let target = SledLog::open(&target_dir).expect("reopen");
    assert_eq!(observe(&target, &events), expected);

    // An ordinary append continues the chain; a claim held since the import is still enforced.
    let next = target
        .append(AppendRequest::new(
            "thing/0",
            ExpectedRevision::Exact(source.stream_revision("thing/0").unwrap().unwrap()),
            vec![event("after the import".into())],
        ))
        .expect("append after import");
    assert_eq!(next.first_position.0, source.head().0 + 1);
    let held = (0..STREAMS)
        .find_map(|s| {
            let key = format!("k-{s}");
            target.claim_holder(&key).expect("claim").map(|h| (key, h))
        })
        .expect("some key is held at the end");
    let mut grab = AppendRequest::new(
        "thing/other",
        ExpectedRevision::NoStream,
        vec![event("grab".into())],
    );
    grab.claims = vec![Claim::Acquire {
        key: held.0.clone(),
        owner: "thing/other".into(),
    }];
    assert!(matches!(
        target.append(grab),
        Err(Error::ClaimTaken { holder, .. }) if holder == held.1
    ));
    target.verify(&|_, _, _| Ok(())).expect("verify after");

    // A further import refuses an id the log already holds.
    let mut target = target;
    let mut again = next_envelope(&target);
    again.id = events[5].id;
    rehash(&mut again);
    let mut importer = target.importer(ImportOptions::default()).expect("importer");
    let err = importer.push(again, &[]).expect_err("a reused id");
    assert!(err.to_string().contains("already in the log"), "{err}");
}

/// An envelope that continues `log` on a stream of its own.
fn next_envelope(log: &SledLog) -> RecordedEvent {
    let head = log.read_event(log.head()).expect("read").expect("head");
    let proposed = event("imported later".into());
    let mut e = RecordedEvent {
        position: Position(head.position.0 + 1),
        stream: "thing/later".into(),
        revision: 1,
        id: proposed.id,
        recorded_at: head.recorded_at,
        actor: proposed.actor,
        correlation_id: proposed.correlation_id,
        causation_id: None,
        event_type: proposed.event_type,
        schema_version: 1,
        payload: proposed.payload,
        prev_hash: head.hash,
        hash: [0; 32],
    };
    rehash(&mut e);
    e
}

/// Makes the event's own hash fit its (changed) content, so a later check is the one that fires.
fn rehash(e: &mut RecordedEvent) {
    e.hash = vmplane_store::hash::event_hash(&e.as_ref());
}

#[test]
fn an_envelope_the_log_could_not_have_written_is_refused_naming_its_position() {
    let root = tempfile::tempdir().expect("tempdir");
    let (source, claims_at) = source(&root.path().join("source"));
    let events = all(&source);
    let at = 40usize; // index of position 41
    type Damage = fn(&mut Vec<RecordedEvent>, &mut Vec<(u64, Vec<Claim>)>, usize);
    let cases: Vec<(&str, Damage, &str)> = vec![
        (
            "payload changed",
            |e, _, at| e[at].payload.push(b'!'),
            "hash does not match its content",
        ),
        (
            "previous hash changed",
            |e, _, at| e[at].prev_hash[0] ^= 1,
            "previous hash does not match",
        ),
        (
            "position skipped",
            |e, _, at| {
                e.remove(at);
            },
            "expected position 41",
        ),
        (
            "revision skipped",
            |e, _, at| {
                e[at].revision += 1;
                rehash(&mut e[at]);
            },
            "jumps from revision",
        ),
        (
            "time goes backwards",
            |e, _, at| {
                e[at].recorded_at = Timestamp(0);
                rehash(&mut e[at]);
            },
            "recorded_at goes backwards",
        ),
        (
            "id reused",
            |e, _, at| e[at].id = e[3].id,
            "already in the log",
        ),
        (
            "claim taken by another owner",
            |e, c, at| {
                let position = e[at].position.0;
                c.retain(|(p, _)| *p != position);
                c.push((
                    position,
                    vec![Claim::Acquire {
                        key: "k-0".into(),
                        owner: "someone-else".into(),
                    }],
                ));
            },
            "claim k-0 is held by",
        ),
    ];
    for (name, damage, expected) in cases {
        let mut events = events.clone();
        let mut claims = claims_at.clone();
        damage(&mut events, &mut claims, at);
        let dir = root.path().join(name.replace(' ', "-"));
        let mut log = SledLog::open(&dir).expect("open");
        let mut importer = log
            .importer(ImportOptions {
                sync_every_events: 10,
                sync_every_bytes: 1 << 20,
                value_events_max: 3,
                ..ImportOptions::default()
            })
            .expect("importer");
        let mut failure = None;
        for e in &events {
            let c = claims
                .iter()
                .find(|(p, _)| *p == e.position.0)
                .map_or(&[][..], |(_, c)| c.as_slice());
            if let Err(err) = importer.push(e.clone(), c) {
                failure = Some(err);
                break;
            }
        }
        let err = failure.unwrap_or_else(|| panic!("{name}: the import accepted it"));
        let text = err.to_string();
        assert!(text.contains(expected), "{name}: {text}");
        if !matches!(err, Error::ClaimTaken { .. } | Error::InvalidRequest { .. }) {
            assert!(text.contains("41"), "{name}: names the position: {text}");
        }
        // The importer and the log refuse to go on; what was synced is a sound prefix.
        assert!(importer.finish().is_err(), "{name}");
        assert!(
            log.append(AppendRequest::new(
                "x",
                ExpectedRevision::Any,
                vec![event("x".into())]
            ))
            .is_err(),
            "{name}: the log must refuse appends after a failed import"
        );
        drop(log);
        let log = SledLog::open(&dir).expect("reopen");
        assert_eq!(log.head().0, 40, "{name}: the last sync before the damage");
        log.verify(&|_, _, _| Ok(())).expect("the prefix verifies");
        assert_eq!(all(&log), events[..40].to_vec(), "{name}");
    }
}

/// Imports `events` into a file log (the claims go with the first event of their append).
fn import_file(
    log: &mut FileLog,
    events: &[RecordedEvent],
    claims_at: &[(u64, Vec<Claim>)],
) -> vmplane_store::sled_log::ImportReport {
    let mut importer = log.importer().expect("importer");
    for e in events {
        let claims = claims_at
            .iter()
            .find(|(p, _)| *p == e.position.0)
            .map_or(&[][..], |(_, c)| c.as_slice());
        importer.push(e.clone(), claims).expect("push");
    }
    importer.finish().expect("finish")
}

#[test]
fn a_file_log_imported_from_a_sled_log_reads_exactly_like_it_and_continues() {
    let root = tempfile::tempdir().expect("tempdir");
    let (source, claims_at) = source(&root.path().join("source"));
    let events = all(&source);
    let expected = observe(&source, &events);
    let source_report = source.verify(&|_, _, _| Ok(())).expect("verify");

    let target_dir = root.path().join("target");
    let mut target = FileLog::open(&target_dir).expect("open target");
    // Two imports: the second one continues from the first one's tip and indexes.
    let first = import_file(&mut target, &events[..60], &claims_at);
    let report = import_file(&mut target, &events[60..], &claims_at);
    assert_eq!(first.events + report.events, events.len() as u64);
    assert_eq!(report.head, source.head());
    assert_eq!(report.head_hash, source_report.head_hash);
    assert_eq!(all(&target), events);
    assert_eq!(observe(&target, &events), expected);

    // Reopened: the indexes rebuilt from the file answer the same.
    drop(target);
    let mut target = FileLog::open(&target_dir).expect("reopen");
    assert_eq!(observe(&target, &events), expected);
    assert_eq!(
        target.verify(&|_, _, _| Ok(())).expect("verify").head_hash,
        source_report.head_hash
    );

    // A retry of an imported append replays; an ordinary append continues the chain.
    let last = events.last().expect("events");
    let retry = AppendRequest::new(
        last.stream.clone(),
        ExpectedRevision::Any,
        vec![ProposedEvent {
            id: last.id,
            event_type: last.event_type.clone(),
            schema_version: last.schema_version,
            payload: last.payload.clone(),
            actor: last.actor.clone(),
            correlation_id: last.correlation_id,
            causation_id: last.causation_id,
        }],
    );
    assert!(target.append(retry).expect("retry").replayed);
    let next = target
        .append(AppendRequest::new(
            "thing/0",
            ExpectedRevision::Exact(source.stream_revision("thing/0").unwrap().unwrap()),
            vec![event("after the import".into())],
        ))
        .expect("append after import");
    assert_eq!(next.first_position.0, source.head().0 + 1);

    // A further import refuses an id the log holds, and an envelope off the chain, naming its
    // position; nothing of either is written.
    let head = target.head();
    let mut importer = target.importer().expect("importer");
    let mut again = RecordedEvent {
        position: Position(head.0 + 1),
        ..events[5].clone()
    };
    rehash(&mut again);
    let err = importer.push(again, &[]).expect_err("a reused id");
    assert!(err.to_string().contains("already in the log"), "{err}");
    drop(importer);
    let mut importer = target.importer().expect("importer");
    let mut off_chain = RecordedEvent {
        position: Position(head.0 + 1),
        id: Uuid::now_v7(),
        stream: "thing/new".into(),
        revision: 1,
        ..events[5].clone()
    };
    rehash(&mut off_chain);
    match importer.push(off_chain, &[]) {
        Err(Error::Corrupt { position, reason }) => {
            assert_eq!(position, Position(head.0 + 1));
            assert!(reason.contains("previous hash"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    drop(importer);
    assert_eq!(target.head(), head);
}
