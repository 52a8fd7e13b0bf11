//! Damage is an error naming the problem, never a panic and never a silently wrong answer:
//! bytes flipped inside a stored batch (through sled, as a bit rot or tampering our own format
//! must catch) and bytes flipped in sled's files on disk.

use std::ops::ControlFlow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use rand::{Rng, SeedableRng};
use uuid::Uuid;
use vmplane_store::{
    AppendRequest, Error, EventLog, ExpectedRevision, Position, ProposedEvent, SledLog, SledOptions,
};

/// sled's configuration as `SledLog` opens it (the segment size is fixed at creation), opened
/// as `SledLog` opens it: right after the `SledLog` built here is dropped, sled can still hold
/// the directory's lock for a moment.
fn raw_sled(dir: &Path) -> sled::Db {
    let config = sled::Config::new().path(dir).segment_size(8 << 20);
    vmplane_store::sled_log::open_sled(&config).expect("raw sled open")
}

fn marker(position: u64) -> Vec<u8> {
    format!("payload-of-event-{position:06}").into_bytes()
}

/// 60 events in appends of 3 (20 batches); event at position p carries `marker(p)`. Stream heads
/// are checkpointed after every batch, so opening reads only the last batch and damage further
/// back is left for reads and `verify` to find.
fn build(dir: &Path) {
    let options = SledOptions {
        heads_checkpoint_batches: 1,
        ..SledOptions::default()
    };
    let log = SledLog::open_with(dir, options).expect("open");
    for append in 0..20u64 {
        let events = (0..3)
            .map(|i| ProposedEvent {
                id: Uuid::now_v7(),
                event_type: "DamageTestEvent".into(),
                schema_version: 1,
                payload: marker(append * 3 + i + 1),
                actor: "tester".into(),
                correlation_id: Uuid::now_v7(),
                causation_id: None,
            })
            .collect();
        log.append(AppendRequest::new(
            format!("s/{}", append % 4),
            ExpectedRevision::Any,
            events,
        ))
        .expect("append");
    }
}

fn batch_key(first_position: u64) -> [u8; 9] {
    let mut key = [b'B'; 9];
    key[1..].copy_from_slice(&first_position.to_be_bytes());
    key
}

/// Rewrites the batch stored under `first_position` with `edit` applied.
fn tamper(dir: &Path, first_position: u64, edit: impl FnOnce(&mut Vec<u8>)) {
    let db = raw_sled(dir);
    let mut value = db
        .get(batch_key(first_position))
        .expect("get")
        .expect("batch exists")
        .to_vec();
    edit(&mut value);
    db.insert(batch_key(first_position), value).expect("insert");
    db.flush().expect("flush");
}

fn find(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("marker present")
}

fn accept_all(_: &str, _: u16, _: &[u8]) -> Result<(), String> {
    Ok(())
}

#[test]
fn flipped_payload_byte_fails_verify_at_its_position() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    // Position 17 is the second event of the batch starting at 16.
    tamper(dir.path(), 16, |value| {
        let at = find(value, &marker(17));
        value[at + 3] ^= 0x01;
    });
    let log = SledLog::open(dir.path()).expect("the damage is not in the last batch");
    match log.verify(&accept_all) {
        Err(Error::Corrupt { position, reason }) => {
            assert_eq!(position, Position(17));
            assert!(reason.contains("hash"), "{reason}");
        }
        other => panic!("expected Corrupt at 17, got {other:?}"),
    }
}

#[test]
fn damaged_batch_frame_is_an_error_on_every_read_path() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    // Scramble the offset table of the batch starting at 31.
    tamper(dir.path(), 31, |value| {
        for byte in &mut value[16..24] {
            *byte = 0xff;
        }
    });
    let log = SledLog::open(dir.path()).expect("open");
    assert!(matches!(
        log.verify(&accept_all),
        Err(Error::Corrupt {
            position: Position(31),
            ..
        })
    ));
    assert!(matches!(
        log.read_all(Position(29), 100),
        Err(Error::Corrupt {
            position: Position(31),
            ..
        })
    ));
    assert!(matches!(
        log.read_event(Position(32)),
        Err(Error::Corrupt { .. })
    ));
    assert!(
        log.scan(Position(0), &mut |_| ControlFlow::Continue(()))
            .is_err()
    );
    let stream = (0..4)
        .map(|s| log.read_stream(&format!("s/{s}"), 1, vmplane_store::Direction::Forward, 100));
    assert!(
        stream.into_iter().any(|read| read.is_err()),
        "the stream holding 31 fails to read"
    );
    // Events before the damage still read.
    assert_eq!(
        log.read_all(Position(0), 30).expect("intact prefix").len(),
        30
    );
}

#[test]
fn damaged_archive_inside_a_batch_is_reported_not_panicked() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    // Overwrite the bytes right after the payload (the archive's strings and root) with junk.
    tamper(dir.path(), 46, |value| {
        let at = find(value, &marker(47)) + marker(47).len();
        for (i, byte) in value[at..].iter_mut().take(64).enumerate() {
            *byte = (i as u8).wrapping_mul(37) ^ 0xa5;
        }
    });
    let log = SledLog::open(dir.path()).expect("open");
    match log.verify(&accept_all) {
        Err(Error::Corrupt { position, .. }) => assert!((46..=48).contains(&position.0)),
        other => panic!("expected Corrupt in 46..=48, got {other:?}"),
    }
}

#[test]
fn damaged_last_batch_fails_open() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    tamper(dir.path(), 58, |value| value.truncate(40));
    match SledLog::open(dir.path()) {
        Err(Error::Corrupt {
            position: Position(58),
            ..
        }) => {}
        other => panic!("expected Corrupt at 58, got {other:?}"),
    }
}

#[test]
fn random_byte_flips_in_sled_files_never_panic() {
    let template = tempfile::tempdir().unwrap();
    build(template.path());
    let seed: u64 = rand::thread_rng().r#gen();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut outcomes = [0usize; 3]; // open failed, verify failed, verified
    for round in 0..24 {
        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(template.path()).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_file() {
                std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
            }
        }
        std::fs::create_dir_all(dir.path().join("blobs")).unwrap();
        let target = if round % 4 == 3 {
            std::fs::read_dir(dir.path())
                .unwrap()
                .filter_map(|e| e.ok())
                .map(|e| e.path())
                .find(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("snap."))
                })
                .unwrap_or_else(|| dir.path().join("db"))
        } else {
            dir.path().join("db")
        };
        let mut bytes = std::fs::read(&target).unwrap();
        let flips = rng.gen_range(1..=8);
        for _ in 0..flips {
            let at = rng.gen_range(0..bytes.len());
            bytes[at] ^= 1 << rng.gen_range(0..8);
        }
        std::fs::write(&target, &bytes).unwrap();
        let outcome = catch_unwind(AssertUnwindSafe(|| match SledLog::open(dir.path()) {
            Err(_) => 0,
            Ok(log) => {
                let _ = log.read_all(Position(0), 1_000);
                let _ = log.read_stream("s/1", u64::MAX, vmplane_store::Direction::Backward, 100);
                match log.verify(&accept_all) {
                    Err(_) => 1,
                    Ok(report) => {
                        // Never a silently shorter log.
                        assert_eq!(report.events, 60, "round {round}: a verified log is whole");
                        // A verified log reads back whole, up to its head.
                        let all = log
                            .read_all(Position(0), 1_000)
                            .expect("verified log reads");
                        assert_eq!(all.len() as u64, report.events);
                        2
                    }
                }
            }
        }));
        match outcome {
            Ok(kind) => outcomes[kind] += 1,
            Err(_) => panic!("seed {seed}, round {round}: a panic escaped the store's API"),
        }
    }
    eprintln!(
        "byte flips (seed {seed}): open failed {}, verify failed {}, verified {}",
        outcomes[0], outcomes[1], outcomes[2]
    );
}
