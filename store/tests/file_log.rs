//! The file backend's own promises, beyond the contract every backend keeps: a torn last record
//! (a commit cut short by a crash, never acknowledged) is cut off at open, and zeros after the
//! last record are room, not damage; damage anywhere
//! before it is refused, naming the position; one process holds a directory at a time; `verify`
//! reads what is stored, not what is in memory.

use std::os::unix::fs::FileExt;
use std::path::Path;

use vmplane_store::file_log::LOG_FILE;
use vmplane_store::head_record::HEAD_RECORD_FILE;
use vmplane_store::{
    AppendRequest, Error, EventLog, ExpectedRevision, FileLog, Position, ProposedEvent,
};

fn event(n: u8) -> ProposedEvent {
    ProposedEvent {
        id: uuid::Uuid::now_v7(),
        event_type: "Tested".into(),
        schema_version: 1,
        payload: vec![n; 200],
        actor: "tester".into(),
        correlation_id: uuid::Uuid::now_v7(),
        causation_id: None,
    }
}

/// One append of `events` events to `stream` (one record each, appended one after another).
fn append(log: &FileLog, stream: &str, events: u8) {
    let request = AppendRequest::new(
        stream,
        ExpectedRevision::Any,
        (0..events).map(event).collect(),
    );
    log.append(request).expect("append");
}

fn file_len(dir: &Path) -> u64 {
    std::fs::metadata(dir.join(LOG_FILE))
        .expect("log file")
        .len()
}

/// The log file, opened to read and write it behind the log's back.
fn open_log_file(dir: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.join(LOG_FILE))
        .expect("log file")
}

/// Reopens the log in `dir`, commits with `commit`, closes it, then puts the head record back
/// as it was before: the directory as a crash during that commit would leave it (a clean close
/// records the head). Returns where the records ended after the commit.
fn commit_unrecorded(dir: &Path, commit: impl FnOnce(&FileLog)) -> u64 {
    let recorded = std::fs::read(dir.join(HEAD_RECORD_FILE)).expect("head record");
    let log = FileLog::open(dir).expect("reopen");
    commit(&log);
    let end = log.records_end();
    drop(log);
    std::fs::write(dir.join(HEAD_RECORD_FILE), &recorded).expect("head record");
    end
}

fn accept_all(_: &str, _: u16, _: &[u8]) -> Result<(), String> {
    Ok(())
}

#[test]
fn a_torn_last_record_is_cut_off_at_open_and_the_log_goes_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = FileLog::open(dir.path()).expect("open");
    append(&log, "vm/a", 2);
    append(&log, "vm/b", 1);
    let whole = log.records_end();
    drop(log);
    let with_third = commit_unrecorded(dir.path(), |log| append(log, "vm/a", 3));
    // The third commit's record, half written.
    let torn = (with_third - whole) / 2;
    let file = open_log_file(dir.path());
    file.set_len(whole + torn).expect("tear the last record");
    drop(file);

    let log = FileLog::open(dir.path()).expect("open cuts the torn record off");
    let report = log.open_report();
    assert_eq!(report.torn_tail_bytes, torn);
    assert_eq!((report.events, report.records), (3, 2));
    assert_eq!(log.head(), Position(3));
    assert_eq!(
        file_len(dir.path()),
        whole,
        "the torn bytes are gone from the file"
    );
    assert_eq!(log.stream_revision("vm/a").expect("revision"), Some(2));
    log.verify(&accept_all).expect("what is left verifies");
    append(&log, "vm/a", 1);
    assert_eq!(log.head(), Position(4));
    assert_eq!(log.stream_revision("vm/a").expect("revision"), Some(3));
    drop(log);
    let log = FileLog::open(dir.path()).expect("reopen after the cut");
    assert_eq!(log.open_report().torn_tail_bytes, 0);
    assert_eq!(log.verify(&accept_all).expect("verify").events, 4);
}

#[test]
fn a_last_record_the_head_record_says_was_committed_is_never_cut() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = FileLog::open(dir.path()).expect("open");
    append(&log, "vm/a", 2);
    let first_end = log.records_end();
    append(&log, "vm/a", 2);
    let len = log.records_end();
    // A clean close records the head (position 4).
    drop(log);
    // The last record damaged, or the file cut short: either looks like a torn write.
    let file = open_log_file(dir.path());
    file.set_len(first_end + (len - first_end) / 2)
        .expect("cut");
    drop(file);
    let cut = file_len(dir.path());
    match FileLog::open(dir.path()) {
        Err(Error::Damaged { reason }) => {
            assert!(
                reason.contains("ends at position 2, but position 4 was committed"),
                "{reason}"
            );
        }
        other => panic!("expected Damaged, got {other:?}"),
    }
    assert_eq!(
        file_len(dir.path()),
        cut,
        "nothing is cut when the head says otherwise"
    );
}

#[test]
fn zeros_after_the_last_record_are_room_and_the_next_records_overwrite_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = FileLog::open(dir.path()).expect("open");
    append(&log, "vm/a", 1);
    append(&log, "vm/a", 1);
    let end = log.records_end();
    // The committer has written room after the records: zeros, up to the file's end.
    let len = file_len(dir.path());
    assert!(
        len > end,
        "room after the records: file {len}, records {end}"
    );
    let mut room = vec![1u8; (len - end) as usize];
    open_log_file(dir.path())
        .read_exact_at(&mut room, end)
        .expect("read the room");
    assert!(room.iter().all(|b| *b == 0), "the room is zeros");
    drop(log);
    // More zeros, as a file extended but never written can hold after a power loss.
    open_log_file(dir.path())
        .set_len(file_len(dir.path()) + 4096)
        .expect("extend");
    let extended = file_len(dir.path());
    let log = FileLog::open(dir.path()).expect("open");
    assert_eq!(
        log.open_report().torn_tail_bytes,
        0,
        "zeros are not a torn record"
    );
    assert_eq!((log.head(), log.records_end()), (Position(2), end));
    assert_eq!(file_len(dir.path()), extended, "nothing is cut");
    append(&log, "vm/a", 1);
    assert!(log.records_end() > end);
    drop(log);
    let log = FileLog::open(dir.path()).expect("reopen");
    assert_eq!(log.open_report().torn_tail_bytes, 0);
    assert_eq!(log.verify(&accept_all).expect("verify").events, 3);
    assert_eq!(log.stream_revision("vm/a").expect("revision"), Some(3));
}

#[test]
fn a_torn_last_record_followed_by_room_is_cut_off_at_open() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = FileLog::open(dir.path()).expect("open");
    append(&log, "vm/a", 1);
    let first_end = log.records_end();
    drop(log);
    let second_end = commit_unrecorded(dir.path(), |log| append(log, "vm/a", 2));
    // The second record's second half never reached the disk: zeros, like the room after it.
    let half = first_end + (second_end - first_end) / 2;
    open_log_file(dir.path())
        .write_all_at(&vec![0u8; (second_end - half) as usize], half)
        .expect("tear the second record");
    let len = file_len(dir.path());
    assert!(len > second_end, "room follows the torn record");

    let log = FileLog::open(dir.path()).expect("open cuts the torn record off");
    let report = log.open_report();
    assert_eq!(report.torn_tail_bytes, len - first_end);
    assert_eq!((report.events, report.records), (1, 1));
    assert_eq!(log.records_end(), first_end);
    append(&log, "vm/b", 1);
    drop(log);
    let log = FileLog::open(dir.path()).expect("reopen after the cut");
    assert_eq!(log.open_report().torn_tail_bytes, 0);
    assert_eq!(log.verify(&accept_all).expect("verify").events, 2);
}

#[test]
fn damage_before_the_last_record_is_refused_naming_its_position_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = FileLog::open(dir.path()).expect("open");
    append(&log, "vm/a", 1);
    let first_end = log.records_end();
    append(&log, "vm/b", 2);
    let second_end = log.records_end();
    append(&log, "vm/c", 1);
    drop(log);
    let len = file_len(dir.path());
    // One byte flipped in the middle of the second record (positions 2 and 3).
    let file = open_log_file(dir.path());
    let at = (first_end + second_end) / 2;
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).expect("read");
    file.write_all_at(&[byte[0] ^ 0x40], at).expect("flip");
    drop(file);

    match FileLog::open(dir.path()) {
        Err(Error::Corrupt { position, reason }) => {
            assert_eq!(position, Position(2), "{reason}");
            assert!(reason.contains("checksum"), "{reason}");
        }
        other => panic!("expected Corrupt at position 2, got {other:?}"),
    }
    assert_eq!(file_len(dir.path()), len, "a refused open cuts nothing");
}

#[test]
fn verify_checks_the_stored_bytes_not_the_records_in_memory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = FileLog::open(dir.path()).expect("open");
    append(&log, "vm/a", 1);
    append(&log, "vm/a", 1);
    log.verify(&accept_all).expect("intact");
    let end = log.records_end();
    let file = open_log_file(dir.path());
    // The last byte belongs to the second record's last event.
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, end - 1).expect("read");
    file.write_all_at(&[byte[0] ^ 1], end - 1).expect("flip");
    drop(file);
    match log.verify(&accept_all) {
        Err(Error::Corrupt { position, .. }) => assert_eq!(position, Position(2)),
        other => panic!("expected Corrupt at position 2, got {other:?}"),
    }
}

#[test]
fn one_open_log_per_directory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = FileLog::open(dir.path()).expect("open");
    match FileLog::open(dir.path()) {
        Err(Error::Unavailable { reason }) => {
            assert!(reason.contains("in use by another process"), "{reason}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    drop(log);
    FileLog::open(dir.path()).expect("open once the first is closed");
}

#[test]
fn a_file_that_is_not_a_file_log_is_refused_naming_its_header() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join(LOG_FILE),
        b"this is not a vmplane log file, but long enough",
    )
    .expect("write");
    match FileLog::open(dir.path()) {
        Err(Error::Damaged { reason }) => {
            assert!(reason.contains("header"), "{reason}");
        }
        other => panic!("expected Damaged, got {other:?}"),
    }
}

/// The log in `dir`, its committer lingering `linger` for company.
fn open_lingering(dir: &Path, linger: std::time::Duration) -> FileLog {
    let options = vmplane_store::file_log::FileOptions {
        group_commit_linger: linger,
        ..Default::default()
    };
    FileLog::open_with(dir, options).expect("open")
}

#[test]
fn a_lone_appender_never_waits_for_company() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = open_lingering(dir.path(), std::time::Duration::from_millis(500));
    let started = std::time::Instant::now();
    for _ in 0..10 {
        append(&log, "vm/alone", 1);
    }
    // Lingering after each of its own appends would take 5 s at least.
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_millis(2_500), "{took:?}");
    assert_eq!(log.open_report().records, 0, "opened empty");
    drop(log);
    assert_eq!(
        FileLog::open(dir.path())
            .expect("reopen")
            .open_report()
            .records,
        10
    );
}

#[test]
fn appenders_who_come_back_share_records_and_the_committer_goes_as_soon_as_they_are_all_back() {
    // More than the 8 a group must hold before the committer lingers after it.
    const THREADS: usize = 16;
    const APPENDS: usize = 40;
    let linger = std::time::Duration::from_millis(300);
    let dir = tempfile::tempdir().expect("temp dir");
    let log = std::sync::Arc::new(open_lingering(dir.path(), linger));
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(THREADS));
    let started = std::time::Instant::now();
    let appenders: Vec<_> = (0..THREADS)
        .map(|t| {
            let (log, barrier) = (log.clone(), barrier.clone());
            std::thread::spawn(move || {
                // All at once first: some of them share a group, which starts the lingering.
                barrier.wait();
                // Then each comes back 2 ms after its answer: alone, each would mostly commit
                // on its own.
                for _ in 0..APPENDS {
                    append(&log, &format!("vm/{t}"), 1);
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            })
        })
        .collect();
    for appender in appenders {
        appender.join().expect("appender");
    }
    let took = started.elapsed();
    // The committer waits for as many as its last group held, and goes the moment they are
    // queued. It waits its linger out only when fewer come back: here, as appenders finish
    // (until the groups are smaller than 8: 2.4 s at most). Waiting it out after every group
    // would take ~12 s.
    assert!(
        took < linger * 20,
        "{took:?}: the committer waited out its linger"
    );
    // Closing does not wait for company either.
    let log = std::sync::Arc::into_inner(log).expect("the only reference");
    let closing = std::time::Instant::now();
    drop(log);
    assert!(closing.elapsed() < linger / 2, "{:?}", closing.elapsed());
    let report = FileLog::open(dir.path()).expect("reopen").open_report();
    assert_eq!(report.events, (THREADS * APPENDS) as u64);
    // Without lingering: about two appends a record (314 records for 640 events here). With it, the
    // appenders keep sharing: ~1 record per round.
    assert!(
        report.records <= 3 * APPENDS as u64,
        "{} records for {} events",
        report.records,
        report.events
    );
}

/// Every file of `dir` with its bytes (`admin verify` must leave them as they were).
fn files_of(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("ls")
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(e.path()).unwrap_or_default())
        })
        .collect();
    files.sort();
    files
}

fn open_read_only(dir: &Path) -> vmplane_store::Result<FileLog> {
    FileLog::open_read_only(dir, vmplane_store::FileOptions::default())
}

#[test]
fn a_read_only_open_reports_a_torn_last_record_and_leaves_it_in_place() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = FileLog::open(dir.path()).expect("open");
    append(&log, "vm/a", 2);
    let whole = log.records_end();
    drop(log);
    // What the audit did: 37 bytes of junk (no zeros) after the last record.
    let file = open_log_file(dir.path());
    let junk: Vec<u8> = (0..37u8).map(|i| i.wrapping_mul(7) | 1).collect();
    file.write_all_at(&junk, whole).expect("junk");
    drop(file);
    let before = files_of(dir.path());

    // The junk went into the committer's zeroed room: the tail runs to the end of the file.
    let tail = file_len(dir.path()) - whole;
    let log = open_read_only(dir.path()).expect("a read-only open");
    let report = log.open_report();
    assert_eq!((report.events, report.records), (2, 1));
    assert_eq!(report.torn_tail_bytes, tail);
    let torn = report.torn_tail.expect("the torn tail is reported");
    assert_eq!((torn.offset, torn.bytes, torn.cut), (whole, tail, false));
    assert_eq!(torn.positions, None, "junk says nothing of its positions");
    assert_eq!(log.head(), Position(2));
    assert_eq!(log.verify(&accept_all).expect("verify").events, 2);
    // Nothing can be written through it.
    let refused = log.append(AppendRequest::new(
        "vm/b",
        ExpectedRevision::Any,
        vec![event(1)],
    ));
    assert!(
        matches!(&refused, Err(Error::Unavailable { reason }) if reason.contains("read-only")),
        "{refused:?}"
    );
    drop(log);
    assert_eq!(
        files_of(dir.path()),
        before,
        "a read-only open changed the directory"
    );

    // A writable open cuts it, as before, and says so.
    let log = FileLog::open(dir.path()).expect("open");
    let torn = log.open_report().torn_tail.expect("reported");
    assert!(torn.cut);
    assert_eq!(file_len(dir.path()), whole);
}

#[test]
fn a_read_only_open_names_the_positions_of_a_damaged_last_record_it_cannot_vouch_for() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = FileLog::open(dir.path()).expect("open");
    append(&log, "vm/a", 2);
    let first_end = log.records_end();
    append(&log, "vm/b", 3);
    let end = log.records_end();
    drop(log);
    // No head record to prove the last record committed, and one byte of it flipped (its last:
    // inside the batch, where a payload ends).
    std::fs::remove_file(dir.path().join(HEAD_RECORD_FILE)).expect("rm head record");
    let file = open_log_file(dir.path());
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, end - 1).expect("read");
    file.write_all_at(&[byte[0] ^ 0x40], end - 1).expect("flip");
    drop(file);
    let before = files_of(dir.path());

    let log = open_read_only(dir.path()).expect("a read-only open");
    let torn = log.open_report().torn_tail.expect("reported");
    assert_eq!(torn.offset, first_end);
    assert_eq!(torn.reason, "a checksum that does not match");
    assert_eq!(
        torn.positions,
        Some((3, 5)),
        "the committed events it would lose"
    );
    assert!(!torn.cut);
    assert_eq!(log.head(), Position(2));
    drop(log);
    assert_eq!(files_of(dir.path()), before);
}

#[test]
fn a_read_only_open_creates_nothing_and_is_refused_while_a_writer_holds_the_log() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("missing");
    assert!(open_read_only(&missing).is_err());
    assert!(!missing.exists(), "a read-only open created the directory");

    let log = FileLog::open(dir.path()).expect("open");
    append(&log, "vm/a", 1);
    let err = open_read_only(dir.path()).expect_err("the writer holds it");
    assert!(
        err.to_string().contains("in use by another process"),
        "{err}"
    );
    drop(log);
    // Readers share it; a writer waits for them.
    let reader = open_read_only(dir.path()).expect("a reader");
    let other = open_read_only(dir.path()).expect("another reader");
    assert!(
        FileLog::open(dir.path()).is_err(),
        "a writer beside a reader"
    );
    drop((reader, other));
    // A file created but never given its header reads as an empty log, and stays empty.
    let fresh = dir.path().join("fresh");
    std::fs::create_dir(&fresh).expect("mkdir");
    std::fs::write(fresh.join(LOG_FILE), b"").expect("empty file");
    let log = open_read_only(&fresh).expect("read-only open of an empty file");
    assert_eq!(log.head(), Position(0));
    drop(log);
    assert_eq!(file_len(&fresh), 0);
}
