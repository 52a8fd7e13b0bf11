//! Fuzz target for backup import (`dr::read_backup`), run by `cargo test` on stable with
//! bolero's random inputs, plus deterministic mutations of a real backup: every truncation, and
//! byte flips across the whole file. Whatever the bytes, reading never panics, and it never
//! accepts a file whose events differ from what was written (the chain, the per-event hashes and
//! the body checksum refuse it). `cargo bolero test backup_import_random_inputs` drives
//! libFuzzer/AFL instead where the toolchain allows.

use std::path::Path;

use vmplane_gateway::dr::{self, BackupWriter, Header};
use vmplane_store::{
    AppendRequest, EventLog, ExpectedRevision, ProposedEvent, RecordedEvent, SledLog,
};

/// A real backup of a small log: its bytes and its events.
fn real_backup(dir: &Path) -> (Vec<u8>, Vec<RecordedEvent>) {
    let log = SledLog::open(dir.join("log")).expect("open log");
    for i in 0..6u8 {
        let event = ProposedEvent {
            id: uuid::Uuid::now_v7(),
            event_type: "FuzzEventAppended".into(),
            schema_version: 1,
            payload: vec![i; 40 + usize::from(i)],
            actor: "fuzz".into(),
            correlation_id: uuid::Uuid::now_v7(),
            causation_id: None,
        };
        log.append(AppendRequest::new(
            format!("fuzz/{}", i % 2),
            ExpectedRevision::Any,
            vec![event],
        ))
        .expect("append");
    }
    let events = log.read_all(vmplane_store::Position(0), 100).expect("read");
    let path = dir.join("backup.vmp");
    let header = Header {
        format_version: 1,
        event_count: events.len() as u64,
        first_position: 1,
        last_position: events.len() as u64,
        created_at: "2026-11-22T00:00:00Z".into(),
        server_version: "fuzz".into(),
    };
    let mut w = BackupWriter::create(&path, header).expect("create backup");
    for e in &events {
        w.event(e).expect("write event");
    }
    w.finish().expect("finish backup");
    (std::fs::read(&path).expect("read backup"), events)
}

/// Reads `bytes` as a backup file; `Ok` carries the events it handed out.
fn read(dir: &Path, bytes: &[u8]) -> anyhow::Result<Vec<RecordedEvent>> {
    let path = dir.join("candidate.vmp");
    std::fs::write(&path, bytes)?;
    let mut seen = Vec::new();
    dr::read_backup(&path, |e| {
        seen.push(e.clone());
        Ok(())
    })?;
    Ok(seen)
}

#[test]
fn backup_import_refuses_every_truncation_and_every_flipped_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bytes, events) = real_backup(dir.path());
    assert_eq!(
        read(dir.path(), &bytes).expect("the real backup reads"),
        events
    );
    let mut runs = 0usize;
    for len in 0..bytes.len() {
        assert!(
            read(dir.path(), &bytes[..len]).is_err(),
            "a truncation to {len} bytes was accepted"
        );
        runs += 1;
    }
    for i in 0..bytes.len() {
        for bit in [0x01u8, 0x80] {
            let mut m = bytes.clone();
            m[i] ^= bit;
            if let Ok(seen) = read(dir.path(), &m) {
                // Only a flip the format ignores (none today) could pass, and then the events
                // handed out must be exactly the originals.
                assert_eq!(
                    seen, events,
                    "byte {i} flipped ({bit:#x}) changed what was imported"
                );
            }
            runs += 1;
        }
    }
    println!(
        "backup import: {runs} mutated files checked ({} bytes each)",
        bytes.len()
    );
}

#[test]
fn backup_import_random_inputs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bytes, _) = real_backup(dir.path());
    let prefix = bytes[..16].to_vec();
    let iterations: usize = std::env::var("VMPLANE_FUZZ_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        * 2_000;
    bolero::check!()
        .with_iterations(iterations)
        .for_each(|input: &[u8]| {
            // Half the inputs keep a valid preamble and header start, so the reader gets past
            // the magic bytes and into the records.
            let mut candidate = input.to_vec();
            if input.first().is_some_and(|b| b % 2 == 0) {
                candidate = [prefix.as_slice(), input].concat();
            }
            let _ = read(dir.path(), &candidate);
        });
}
