//! What a durable group commit costs on sled 0.34, against a plain append-only file in the same
//! run: `cargo run --release -p vmplane-store --example sled_commit_cost -- [COMMITS] [EVENTS]
//! [BYTES]` (defaults 2000 commits of 64 events of 256 bytes).
//!
//! It drives sled directly with the shapes of [`vmplane_store::SledLog`]'s layout (one value
//! per commit holding its events, a time key, and per event an id key and a stream key with
//! random names; see `src/sled_log/keys.rs`), so the figures isolate the engine from the
//! log's own code. Three ways to make the same events durable, one after the other:
//!
//! - **sled, the log's layout**: `apply_batch` of the commit's value, its time key and two
//!   random-key index entries per event, then `flush` and `fdatasync` of sled's data file;
//! - **sled, commit value only**: the same without the index entries (what a log that kept its
//!   indexes elsewhere would ask of sled);
//! - **plain file**: `write` of the same bytes at the end of a file, then `fdatasync`.
//!
//! For each: commits/s and events/s, processor time per event (this process, every thread, so
//! sled's I/O threads are counted), bytes the process wrote per byte of commit values (from
//! `/proc/self/io`), and the latency of one commit split into its steps.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// Bytes the process has caused to be written to storage so far (`/proc/self/io`).
fn written_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|io| {
            io.lines()
                .find_map(|line| line.strip_prefix("write_bytes:"))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Processor time of the whole process so far (user + system, every thread).
fn process_cpu() -> Duration {
    // SAFETY: `rusage` is plain data, valid when zeroed.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct it is given and reads nothing else.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let time = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// A small xorshift generator: index keys as random as the log's (UUIDs, VM names).
struct Keys(u64);

impl Keys {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Way {
    SledLayout,
    SledValueOnly,
    PlainFile,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::SledLayout => "sled, the log's layout",
            Way::SledValueOnly => "sled, commit value only",
            Way::PlainFile => "plain file",
        }
    }
}

/// One commit's steps: (build/apply, write/flush, fdatasync).
type Steps = (Duration, Duration, Duration);

struct Run {
    seconds: f64,
    cpu: Duration,
    written: u64,
    steps: Vec<Steps>,
}

fn sled_commits(dir: &Path, way: Way, commits: u64, events: usize, value_len: usize) -> Run {
    let db = sled::Config::new()
        .path(dir)
        // As `SledLog` opens it: 8 MiB segments, a 32 MiB page cache, no background flusher.
        .segment_size(8 << 20)
        .cache_capacity(32 << 20)
        .flush_every_ms(None)
        .open()
        .expect("open sled");
    let data = OpenOptions::new()
        .write(true)
        .open(dir.join("db"))
        .expect("sled's data file");
    let mut keys = Keys(0x9E37_79B9_7F4A_7C15);
    measure(commits, |commit| {
        let t0 = Instant::now();
        let mut batch = sled::Batch::default();
        let mut key = vec![b'b'];
        key.extend_from_slice(&commit.to_be_bytes());
        batch.insert(key, vec![0x5a; value_len]);
        // The time key: recorded-at and last position.
        let mut key = vec![b't'];
        key.extend_from_slice(&commit.to_be_bytes());
        key.extend_from_slice(&commit.to_be_bytes());
        batch.insert(key, Vec::new());
        if way == Way::SledLayout {
            for _ in 0..events {
                let mut id = vec![b'i'];
                id.extend_from_slice(&keys.next().to_be_bytes());
                id.extend_from_slice(&keys.next().to_be_bytes());
                batch.insert(id, vec![0x11; 40]);
                // The stream key: its name, then the append's first revision.
                let mut stream = format!("s/vm/load/vm-{:016x}/", keys.next()).into_bytes();
                stream.extend_from_slice(&1u64.to_be_bytes());
                batch.insert(stream, vec![0x22; 20]);
            }
        }
        db.apply_batch(batch).expect("apply_batch");
        let t1 = Instant::now();
        db.flush().expect("flush");
        let t2 = Instant::now();
        data.sync_data().expect("fdatasync");
        (t1 - t0, t2 - t1, t2.elapsed())
    })
}

fn file_commits(dir: &Path, commits: u64, value_len: usize) -> Run {
    let mut file = File::create(dir.join("log")).expect("create the file");
    measure(commits, |_| {
        let t0 = Instant::now();
        let value = vec![0x5a; value_len];
        let t1 = Instant::now();
        file.write_all(&value).expect("write");
        let t2 = Instant::now();
        file.sync_data().expect("fdatasync");
        (t1 - t0, t2 - t1, t2.elapsed())
    })
}

/// Runs `commit` for commits `0..commits`, with the process's processor time and bytes written
/// around them all.
fn measure(commits: u64, mut commit: impl FnMut(u64) -> Steps) -> Run {
    let mut steps = Vec::with_capacity(usize::try_from(commits).unwrap_or(0));
    let (written, cpu, started) = (written_bytes(), process_cpu(), Instant::now());
    for n in 0..commits {
        steps.push(commit(n));
    }
    Run {
        seconds: started.elapsed().as_secs_f64(),
        cpu: process_cpu() - cpu,
        written: written_bytes() - written,
        steps,
    }
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: u64| {
        args.get(i)
            .and_then(|a| a.parse::<u64>().ok())
            .unwrap_or(default)
    };
    let commits = arg(0, 2000);
    let events = usize::try_from(arg(1, 64)).unwrap_or(64).max(1);
    let bytes = usize::try_from(arg(2, 256)).unwrap_or(256);
    // An event in a commit's value: its payload plus the envelope (ids, stream, hashes: ~150 B).
    let value_len = events * (bytes + 150);
    println!(
        "{commits} commits of {events} events of {bytes} bytes ({value_len} bytes per commit value)"
    );
    println!(
        "{:<24} | {:>9} {:>10} | {:>12} | {:>15} | median step µs: {:>8} {:>8} {:>9}",
        "way",
        "commits/s",
        "events/s",
        "cpu µs/event",
        "written/value",
        "apply",
        "flush",
        "fdatasync"
    );
    for way in [Way::SledLayout, Way::SledValueOnly, Way::PlainFile] {
        let dir = tempfile::tempdir().expect("temp dir");
        let run = match way {
            Way::PlainFile => file_commits(dir.path(), commits, value_len),
            _ => sled_commits(dir.path(), way, commits, events, value_len),
        };
        let total_events = commits as f64 * events as f64;
        let values = commits as f64 * value_len as f64;
        let step = |pick: fn(&Steps) -> Duration| {
            median(run.steps.iter().map(pick).collect()).as_secs_f64() * 1e6
        };
        println!(
            "{:<24} | {:>9.0} {:>10.0} | {:>12.1} | {:>14.1}x | {:>23.0} {:>8.0} {:>9.0}",
            way.name(),
            commits as f64 / run.seconds,
            total_events / run.seconds,
            run.cpu.as_secs_f64() * 1e6 / total_events,
            run.written as f64 / values,
            step(|s| s.0),
            step(|s| s.1),
            step(|s| s.2),
        );
    }
}
