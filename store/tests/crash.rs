//! Crash safety, shown: a child process appends from several threads (group commit) and prints
//! every acknowledged append; the parent kills it with SIGKILL at a random moment, again and
//! again, and after each restart every acknowledged event must be there, intact, with gapless
//! positions and a verified hash chain.
//!
//! Like sled's own crash test, the child is this test binary run again with an environment
//! variable (`crash_child` below does nothing without it). `VMPLANE_CRASH_CYCLES` sets the number
//! of kills (default 20); `VMPLANE_CRASH_SEED` replays a run.
//!
//! SIGKILL leaves the OS page cache intact, so this proves durability across process crashes; the
//! fdatasync before every acknowledgement is what power-loss durability rests on.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use uuid::Uuid;
use vmplane_store::{
    AppendRequest, EventLog, ExpectedRevision, FileLog, Position, ProposedEvent, SledLog,
};

const CHILD_DIR_ENV: &str = "VMPLANE_CRASH_CHILD_DIR";
/// Which backend the child opens: `sled` or `file`.
const CHILD_BACKEND_ENV: &str = "VMPLANE_CRASH_CHILD_BACKEND";

/// Opens the log of `backend` in `dir`.
fn open(backend: &str, dir: &Path) -> Arc<dyn EventLog> {
    match backend {
        "file" => Arc::new(FileLog::open(dir).expect("open the file log")),
        _ => Arc::new(SledLog::open(dir).expect("open the sled log")),
    }
}
const WRITERS: usize = 6;

/// One acknowledged append, as the child printed it.
#[derive(Debug)]
struct Ack {
    first_position: u64,
    stream: String,
    first_revision: u64,
    ids: Vec<Uuid>,
}

fn payload_of(id: &Uuid) -> Vec<u8> {
    let len = 64 + (id.as_bytes()[15] as usize % 192);
    id.as_bytes().iter().copied().cycle().take(len).collect()
}

/// The child: check what previous runs acknowledged, then append until killed.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let backend = std::env::var(CHILD_BACKEND_ENV).unwrap_or_default();
    let log = open(&backend, &dir);
    let acks = read_acks(&dir.join("acks"));
    match check(&*log, &acks) {
        Ok(head) => println!("verified {head}"),
        Err(reason) => println!("FAILED {reason}"),
    }
    std::io::stdout().flush().expect("flush stdout");
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let threads: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let (log, out) = (Arc::clone(&log), Arc::clone(&out));
            std::thread::spawn(move || write_forever(&*log, writer, &out))
        })
        .collect();
    for thread in threads {
        let _ = thread.join();
    }
}

fn write_forever(log: &dyn EventLog, writer: usize, out: &Mutex<std::io::Stdout>) {
    let mut rng = rand::rngs::StdRng::from_entropy();
    let streams: Vec<String> = (0..3).map(|s| format!("w{writer}/{s}")).collect();
    let mut revisions: HashMap<&str, u64> = streams
        .iter()
        .map(|s| {
            (
                s.as_str(),
                log.stream_revision(s).expect("revision").unwrap_or(0),
            )
        })
        .collect();
    loop {
        let stream = &streams[rng.gen_range(0..streams.len())];
        let count = rng.gen_range(1..=3);
        let events: Vec<ProposedEvent> = (0..count)
            .map(|_| {
                let id = Uuid::now_v7();
                ProposedEvent {
                    id,
                    event_type: "CrashTestEvent".into(),
                    schema_version: 1,
                    payload: payload_of(&id),
                    actor: format!("writer-{writer}"),
                    correlation_id: id,
                    causation_id: None,
                }
            })
            .collect();
        let ids: Vec<String> = events.iter().map(|e| e.id.to_string()).collect();
        let expected = ExpectedRevision::Exact(revisions[stream.as_str()]);
        let result = log
            .append(AppendRequest::new(stream.clone(), expected, events))
            .expect("append");
        revisions.insert(stream, result.last_revision);
        let mut out = out.lock().unwrap_or_else(|p| p.into_inner());
        let line = format!(
            "ack {} {} {} {}\n",
            result.first_position.0,
            stream,
            result.first_revision,
            ids.join(",")
        );
        if out
            .write_all(line.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            return;
        }
    }
}

fn parse_ack(line: &str) -> Option<Ack> {
    let mut parts = line.strip_prefix("ack ")?.trim_end().split(' ');
    let first_position = parts.next()?.parse().ok()?;
    let stream = parts.next()?.to_owned();
    let first_revision = parts.next()?.parse().ok()?;
    let ids = parts
        .next()?
        .split(',')
        .map(|id| id.parse().ok())
        .collect::<Option<Vec<Uuid>>>()?;
    Some(Ack {
        first_position,
        stream,
        first_revision,
        ids,
    })
}

fn read_acks(path: &Path) -> Vec<Ack> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .map(|line| parse_ack(line).expect("a recorded ack parses"))
        .collect()
}

/// Every acknowledged event is present and intact; positions are gapless; the chain verifies.
fn check(log: &dyn EventLog, acks: &[Ack]) -> Result<u64, String> {
    let report = log
        .verify(&|_, _, _| Ok(()))
        .map_err(|err| format!("verify: {err}"))?;
    let head = log.head().0;
    if report.events != head {
        return Err(format!(
            "verify walked {} events, head is {head}",
            report.events
        ));
    }
    for ack in acks {
        for (offset, id) in ack.ids.iter().enumerate() {
            let position = Position(ack.first_position + offset as u64);
            let event = log
                .read_event(position)
                .map_err(|err| format!("read {position}: {err}"))?
                .ok_or_else(|| {
                    format!("acknowledged position {position} is missing (head {head})")
                })?;
            let revision = ack.first_revision + offset as u64;
            if event.id != *id || event.stream != ack.stream || event.revision != revision {
                return Err(format!(
                    "position {position}: expected {id} {}@{revision}, found {} {}@{}",
                    ack.stream, event.id, event.stream, event.revision
                ));
            }
            if event.payload != payload_of(id) {
                return Err(format!("position {position}: payload differs"));
            }
        }
    }
    Ok(head)
}

#[test]
fn acknowledged_appends_survive_sigkill_at_random_moments() {
    survive_sigkill("sled");
}

#[test]
fn acknowledged_appends_to_the_file_log_survive_sigkill_at_random_moments() {
    survive_sigkill("file");
}

fn survive_sigkill(backend: &str) {
    let cycles: usize = std::env::var("VMPLANE_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("VMPLANE_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().r#gen());
    eprintln!("crash test ({backend}): {cycles} cycles, VMPLANE_CRASH_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("store");
    std::fs::create_dir_all(&store).expect("store dir");
    let acks_path = store.join("acks");
    let exe = std::env::current_exe().expect("test binary");
    let mut acked_total = 0usize;
    let mut verified_runs = 0usize;
    let mut late_kills = 0usize;
    for cycle in 0..=cycles {
        let mut child = Command::new(&exe)
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR_ENV, &store)
            .env(CHILD_BACKEND_ENV, backend)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("child stdout");
        let (verified_tx, verified_rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut lines = Vec::new();
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                if line.ends_with('\n') {
                    if line.contains("verified ") || line.contains("FAILED ") {
                        let _ = verified_tx.send(());
                    }
                    lines.push(std::mem::take(&mut line));
                }
                line.clear();
            }
            lines
        });
        // One run in ten dies early, during open and recovery. The others are killed while
        // appending, once they have checked the previous runs' acknowledgements.
        let early = cycle != cycles && rng.gen_ratio(1, 10);
        late_kills += usize::from(!early);
        if !early {
            let _ = verified_rx.recv_timeout(Duration::from_secs(60));
        }
        let wait_ms = if cycle == cycles {
            0
        } else if early {
            rng.gen_range(0..40)
        } else {
            rng.gen_range(5..300)
        };
        std::thread::sleep(Duration::from_millis(wait_ms));
        child.kill().expect("SIGKILL the child");
        child.wait().expect("reap the child");
        let lines = reader.join().expect("reader thread");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&acks_path)
            .expect("acks file");
        for line in &lines {
            // The test harness may print "test crash_child ... " in front of the first line.
            if let Some(at) = line.find("FAILED ") {
                panic!(
                    "cycle {cycle} (seed {seed}): after restart: {}",
                    &line[at..]
                );
            }
            if line.contains("verified ") {
                verified_runs += 1;
            }
            if parse_ack(line).is_some() {
                file.write_all(line.as_bytes()).expect("record ack");
                acked_total += 1;
            }
        }
        file.sync_all().expect("sync acks");
    }
    eprintln!("crash test: {acked_total} acknowledged appends, {verified_runs} verified restarts");
    assert!(
        verified_runs >= late_kills,
        "every restart not killed early verified"
    );
    assert!(acked_total > cycles, "the children made progress");
    // The final restart (the last child verified too; check once more from this process).
    let log = open(backend, &store);
    let acks = read_acks(&acks_path);
    let head = check(&*log, &acks).unwrap_or_else(|err| panic!("seed {seed}: {err}"));
    assert!(head >= acks.len() as u64);
}
