//! Data directories prepared directly through the store, for tests that start a server on an
//! existing log.

use std::path::Path;

use vmplane_store::{AppendRequest, EventLog, ExpectedRevision, ProposedEvent};

/// Appends `n` opaque events to one stream of a log at `data` and returns the head position.
pub fn append_events(data: &Path, n: u64) -> u64 {
    let log = vmplane_store::SledLog::open(data).expect("open the log");
    let correlation_id = uuid::Uuid::now_v7();
    for i in 0..n {
        let event = ProposedEvent {
            id: uuid::Uuid::now_v7(),
            event_type: "TestEventAppended".into(),
            schema_version: 1,
            payload: format!("payload {i}").into_bytes(),
            actor: "test".into(),
            correlation_id,
            causation_id: None,
        };
        log.append(AppendRequest::new(
            "test/fixture",
            ExpectedRevision::Any,
            vec![event],
        ))
        .expect("append");
    }
    log.head().0
}

/// Overwrites the middle of every file in the log's directory with garbage.
pub fn damage_log(data: &Path) {
    for entry in walk(data) {
        let len = std::fs::metadata(&entry).expect("metadata").len();
        if len < 64 {
            continue;
        }
        let mut bytes = std::fs::read(&entry).expect("read");
        let start = bytes.len() / 4;
        let end = bytes.len() * 3 / 4;
        for (i, b) in bytes[start..end].iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31) ^ 0xA5;
        }
        std::fs::write(&entry, bytes).expect("write");
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}
