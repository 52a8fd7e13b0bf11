//! The offline disaster-recovery tools on what an outside audit tried: `admin verify` on
//! damaged data directories (a torn or damaged tail of a file log, a damaged projection
//! checkpoint, damaged sled files) reports and changes nothing; a point-in-time restore never
//! keeps half of one commit; a restore fills an existing empty directory; the messages of a
//! backup cut short, of a directory given as a backup, of an empty backup.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use vmplane_gateway::pb;
use vmplane_tests::{Cli, Server, run_cli};

fn vm(name: &str, memory: &str) -> String {
    vmplane_tests::vm_manifest(name, memory)
}

fn apply(cli: &Cli, manifest: &str) {
    cli.apply_in("dr-offline", manifest);
}

fn admin(args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["admin"];
    all.extend_from_slice(args);
    run_cli(&all)
}

#[track_caller]
fn ok(args: &[&str]) -> String {
    let (code, out, err) = admin(args);
    assert_eq!(code, 0, "vmplane admin {args:?} failed:\n{out}\n{err}");
    out
}

/// Runs `vmplane admin ARGS`, expecting it to fail with one error line; returns the line.
#[track_caller]
fn fails(args: &[&str]) -> String {
    let (code, out, err) = admin(args);
    assert_ne!(code, 0, "vmplane admin {args:?} succeeded:\n{out}\n{err}");
    assert!(!out.contains("ok:"), "a failed verify said ok: {out}");
    vmplane_tests::one_error_line(&err)
}

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// One event of the backup: (position, stream, recorded_at).
type Seen = (u64, String, i64);

/// A backup of a small log whose events include one commit of two events (a snapshot's
/// `ObjectCreated` and `SnapshotTaken`), shared by the tests of this module.
struct Fixture {
    backup: PathBuf,
    events: Vec<Seen>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = vmplane_tests::shared_dir();
        let server = Server::start(&dir.join("data"), &["--hypervisor", "none"]);
        let cli = Cli::new(&server);
        apply(&cli, &vm("off-a", "128Mi"));
        apply(&cli, &vm("off-b", "128Mi"));
        apply(&cli, &vm("off-a", "256Mi"));
        cli.ok(&["snapshot", "off-a", "off-snap", "-n", "dr-offline"]);
        apply(&cli, &vm("off-c", "128Mi"));
        let backup = dir.join("fixture.backup");
        cli.ok(&["admin", "backup", "--out", path(&backup)]);
        server.terminate(Duration::from_secs(20));
        let mut events = Vec::new();
        vmplane_gateway::dr::read_backup(&backup, |e| {
            events.push((e.position.0, e.stream.clone(), e.recorded_at.0));
            Ok(())
        })
        .expect("read the fixture's backup");
        Fixture { backup, events }
    })
}

/// Restores the fixture into a new directory `name` of `root` with `backend`.
fn restored(root: &Path, name: &str, backend: &str) -> PathBuf {
    let data = root.join(name);
    ok(&[
        "restore",
        "--from",
        path(&fixture().backup),
        "--data",
        path(&data),
        "--backend",
        backend,
    ]);
    data
}

/// Every file under `dir` (relative name, bytes) and every directory: what `admin verify` must
/// leave exactly as it found it.
fn tree(dir: &Path) -> Vec<(String, Option<Vec<u8>>)> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, Option<Vec<u8>>)>) {
        for entry in std::fs::read_dir(dir).expect("ls").flatten() {
            let p = entry.path();
            let name = p.strip_prefix(base).expect("inside").display().to_string();
            if p.is_dir() {
                out.push((name, None));
                walk(base, &p, out);
            } else {
                out.push((name, Some(std::fs::read(&p).expect("read"))));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[track_caller]
fn assert_unchanged(before: &[(String, Option<Vec<u8>>)], dir: &Path) {
    let after = tree(dir);
    let names = |t: &[(String, Option<Vec<u8>>)]| -> Vec<(String, Option<usize>)> {
        t.iter()
            .map(|(n, b)| (n.clone(), b.as_ref().map(Vec::len)))
            .collect()
    };
    assert_eq!(
        names(before),
        names(&after),
        "admin verify changed the files of {}",
        dir.display()
    );
    assert!(
        before == after.as_slice(),
        "admin verify changed the bytes of a file in {}",
        dir.display()
    );
}

#[test]
fn verify_changes_nothing_in_a_sound_data_directory_of_either_backend() {
    let root = tempfile::tempdir().expect("tempdir");
    let events = fixture().events.len();
    for backend in ["sled", "file"] {
        let data = restored(root.path(), backend, backend);
        let before = tree(&data);
        let (code, out, err) = admin(&["verify", "--data", path(&data)]);
        assert_eq!(code, 0, "{backend}: {out}\n{err}");
        assert!(out.starts_with(&format!("ok: {events} events")), "{out}");
        // Nothing extra on a pipe: no progress bar, no log line.
        assert_eq!(err, "", "{backend}: verify wrote to a piped stderr");
        assert_unchanged(&before, &data);
    }
}

#[test]
fn verify_reports_a_torn_tail_of_a_file_log_and_cuts_nothing() {
    let root = tempfile::tempdir().expect("tempdir");
    let data = restored(root.path(), "torn", "file");
    let log_file = data.join("events.vpl");
    let end = std::fs::metadata(&log_file).expect("log").len();
    // 37 bytes of junk after the last record (no zero among them), as the audit appended.
    let junk: Vec<u8> = (0..37u8).map(|i| i.wrapping_mul(37) | 0x80).collect();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&log_file)
        .expect("open")
        .write_all_at(&junk, end)
        .expect("append junk");
    let before = tree(&data);
    let line = fails(&["verify", "--data", path(&data)]);
    assert!(line.contains(path(&log_file)), "names the file: {line}");
    assert!(line.contains("torn"), "{line}");
    assert!(line.contains(&format!("byte {end}")), "names where: {line}");
    assert!(line.contains("37 bytes"), "{line}");
    let head = fixture().events.len();
    assert!(line.contains(&format!("after position {head}")), "{line}");
    assert!(line.contains("serve"), "says what serve would do: {line}");
    assert_unchanged(&before, &data);
}

#[test]
fn verify_reports_a_damaged_last_record_that_serve_would_cut_and_keeps_it() {
    let root = tempfile::tempdir().expect("tempdir");
    let data = restored(root.path(), "flipped", "file");
    let log_file = data.join("events.vpl");
    std::fs::remove_file(data.join("vmplane-head")).expect("rm vmplane-head");
    // One byte of the last record flipped: the file's last byte (a restore leaves no room).
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&log_file)
        .expect("open");
    let end = file.metadata().expect("meta").len();
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, end - 1).expect("read");
    file.write_all_at(&[byte[0] ^ 0x01], end - 1).expect("flip");
    drop(file);
    let before = tree(&data);
    let line = fails(&["verify", "--data", path(&data)]);
    let head = fixture().events.len() as u64;
    assert!(line.contains(path(&log_file)), "{line}");
    assert!(
        line.contains("checksum"),
        "says what is wrong with it: {line}"
    );
    // The committed last event, which a serve would now cut, is named.
    assert!(
        line.contains(&format!("..={head}")) || line.contains(&format!("position {head}")),
        "names the positions it holds: {line}"
    );
    assert!(line.contains("vmplane-head"), "{line}");
    assert_unchanged(&before, &data);
}

#[test]
fn verify_reports_a_damaged_projection_checkpoint_and_accepts_a_missing_one() {
    let root = tempfile::tempdir().expect("tempdir");
    for backend in ["sled", "file"] {
        let data = restored(root.path(), &format!("ckpt-{backend}"), backend);
        let checkpoint = data.join("projections").join("readmodel.ckpt");
        let sound = std::fs::read(&checkpoint).expect("a restore writes a checkpoint");

        // Cut to 10 bytes: no header line.
        std::fs::write(&checkpoint, &sound[..10]).expect("truncate");
        let before = tree(&data);
        let line = fails(&["verify", "--data", path(&data)]);
        assert!(line.contains(path(&checkpoint)), "{backend}: {line}");
        assert!(line.contains("no header line"), "{backend}: {line}");
        assert_unchanged(&before, &data);

        // A byte of the body flipped: its checksum.
        let mut flipped = sound.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 0x01;
        std::fs::write(&checkpoint, &flipped).expect("flip");
        let line = fails(&["verify", "--data", path(&data)]);
        assert!(line.contains("checksum"), "{backend}: {line}");

        // None at all: a cache not written yet (a server killed before its first checkpoint);
        // serve rebuilds it, verify says so and passes.
        std::fs::remove_file(&checkpoint).expect("rm");
        let out = ok(&["verify", "--data", path(&data)]);
        assert!(out.contains("no projection checkpoint"), "{backend}: {out}");
        assert!(!checkpoint.exists(), "verify wrote a checkpoint");

        std::fs::write(&checkpoint, &sound).expect("put back");
        let out = ok(&["verify", "--data", path(&data)]);
        assert!(!out.contains("no projection checkpoint"), "{out}");
    }
}

/// The first multi-event commit of the fixture: its first and last positions.
fn snapshot_commit() -> (u64, u64) {
    let events = &fixture().events;
    let at = events
        .windows(2)
        .position(|w| w[0].1 == w[1].1 && w[0].2 == w[1].2)
        .expect("the snapshot's commit holds two events");
    let first = events[at].0;
    let mut last = first;
    while let Some(next) = events.get(last as usize) {
        if next.1 == events[at].1 && next.2 == events[at].2 {
            last = next.0;
        } else {
            break;
        }
    }
    (first, last)
}

#[test]
fn a_point_in_time_restore_refuses_a_position_inside_one_commit() {
    let root = tempfile::tempdir().expect("tempdir");
    let (first, last) = snapshot_commit();
    assert!(last > first, "{first}..={last}");
    let from = path(&fixture().backup);
    let inside = root.path().join("inside");
    for p in first..last {
        let line = fails(&[
            "restore",
            "--from",
            from,
            "--data",
            path(&inside),
            "--to-position",
            &p.to_string(),
        ]);
        assert!(line.contains(&format!("{first}..={last}")), "{line}");
        assert!(
            line.contains(&format!("--to-position {}", first - 1))
                && line.contains(&format!("--to-position {last}")),
            "suggests both boundaries: {line}"
        );
        assert!(
            !inside.exists(),
            "a refused restore created {}",
            inside.display()
        );
    }
    // Either boundary is a restore.
    for (name, p) in [("before", first - 1), ("with", last)] {
        let target = root.path().join(name);
        let out = ok(&[
            "restore",
            "--from",
            from,
            "--data",
            path(&target),
            "--to-position",
            &p.to_string(),
        ]);
        assert!(out.contains(&format!("cut at position {p}")), "{out}");
    }
    // `--to-time`: the events of one commit share their instant, so a cut by time keeps the
    // commit whole (at its instant) or leaves it whole (just before).
    let instant = fixture().events[first as usize - 1].2;
    let rfc3339 = |ns: i64| {
        chrono::DateTime::from_timestamp_nanos(ns)
            .to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
    };
    for (name, at, cut) in [
        ("at-its-instant", instant, last),
        ("just-before", instant - 1, first - 1),
    ] {
        let target = root.path().join(name);
        let out = ok(&[
            "restore",
            "--from",
            from,
            "--data",
            path(&target),
            "--to-time",
            &rfc3339(at),
        ]);
        assert!(
            out.contains(&format!("cut at position {cut}")),
            "{name}: {out}"
        );
    }
}

#[test]
fn a_restore_fills_an_existing_empty_directory_and_refuses_a_non_empty_one() {
    let root = tempfile::tempdir().expect("tempdir");
    let from = path(&fixture().backup);
    let events = fixture().events.len();
    for backend in ["sled", "file"] {
        // An empty directory (a mount point, say) is a target.
        let empty = root.path().join(format!("empty-{backend}"));
        std::fs::create_dir(&empty).expect("mkdir");
        let out = ok(&[
            "restore",
            "--from",
            from,
            "--data",
            path(&empty),
            "--backend",
            backend,
        ]);
        assert!(
            out.contains(&format!("restored {events} of {events} events")),
            "{out}"
        );
        let out = ok(&["verify", "--data", path(&empty)]);
        assert!(out.starts_with(&format!("ok: {events} events")), "{out}");
        let names: Vec<String> = std::fs::read_dir(&empty)
            .expect("ls")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| !n.starts_with('.')),
            "staging left in the target: {names:?}"
        );
    }
    // A directory holding anything is refused, named, and left as it was.
    let full = root.path().join("full");
    std::fs::create_dir(&full).expect("mkdir");
    std::fs::write(full.join("notes.txt"), b"mine").expect("write");
    let line = fails(&["restore", "--from", from, "--data", path(&full)]);
    assert!(line.contains("not empty"), "{line}");
    assert!(line.contains("notes.txt"), "names what is there: {line}");
    assert_eq!(tree(&full).len(), 1);
    // A failed restore into an empty directory leaves it empty.
    let mut bytes = std::fs::read(&fixture().backup).expect("read");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    let tampered = root.path().join("tampered.backup");
    std::fs::write(&tampered, bytes).expect("write");
    let empty = root.path().join("stays-empty");
    std::fs::create_dir(&empty).expect("mkdir");
    fails(&["restore", "--from", path(&tampered), "--data", path(&empty)]);
    assert!(tree(&empty).is_empty(), "{:?}", tree(&empty));
    let leftovers: Vec<String> = std::fs::read_dir(root.path())
        .expect("ls")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-") || n.contains("restore-lock"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_restore_from_a_directory_says_it_is_a_directory() {
    let root = tempfile::tempdir().expect("tempdir");
    let data = root.path().join("data");
    let line = fails(&[
        "restore",
        "--from",
        path(root.path()),
        "--data",
        path(&data),
    ]);
    assert!(line.contains("is a directory"), "{line}");
    assert!(!line.contains("truncated"), "{line}");
    assert!(!line.contains("os error"), "{line}");
    assert!(!data.exists());
}

#[test]
fn a_backup_of_an_empty_log_says_so() {
    let root = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&root.path().join("data"), &["--hypervisor", "none"]);
    let out_file = root.path().join("empty.backup");
    let out = Cli::new(&server).ok(&["admin", "backup", "--out", path(&out_file)]);
    server.terminate(Duration::from_secs(20));
    assert!(out.contains("0 events (an empty log)"), "{out}");
    assert!(!out.contains("1..=0"), "{out}");
    // And it restores, into an empty log.
    let data = root.path().join("restored");
    let out = ok(&["restore", "--from", path(&out_file), "--data", path(&data)]);
    assert!(out.contains("restored 0 of 0 events"), "{out}");
    ok(&["verify", "--data", path(&data)]);
}

/// A server that starts a backup of 3 events, sends its first (empty) chunk, and then never
/// another: the test stops it, as a server killed in the middle of a backup.
struct CutShort;

type Chunks = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<pb::BackupChunk, tonic::Status>> + Send>,
>;

#[tonic::async_trait]
impl pb::admin_server::Admin for CutShort {
    async fn log_info(
        &self,
        _: tonic::Request<pb::LogInfoRequest>,
    ) -> Result<tonic::Response<pb::LogInfoResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not this test's"))
    }

    type BackupStream = Chunks;

    async fn backup(
        &self,
        _: tonic::Request<pb::BackupRequest>,
    ) -> Result<tonic::Response<Chunks>, tonic::Status> {
        use tokio_stream::StreamExt;
        let first = pb::BackupChunk {
            head_position: 3,
            events: Vec::new(),
        };
        let chunks = tokio_stream::once(Ok(first)).chain(tokio_stream::pending());
        Ok(tonic::Response::new(Box::pin(chunks)))
    }
}

#[test]
fn a_backup_cut_short_by_the_server_says_it_is_incomplete_and_leaves_nothing() {
    let root = tempfile::tempdir().expect("tempdir");
    let out_file = root.path().join("cut.backup");
    let tmp = root.path().join("cut.backup.tmp");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(pb::admin_server::AdminServer::new(CutShort))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let client = Cli::at(&url).spawn(&["admin", "backup", "--out", path(&out_file)]);
    // The client has the first chunk once it created the temporary file; then the server dies.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !tmp.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the backup never began"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    runtime.shutdown_timeout(Duration::from_millis(100));
    let out = client.wait_with_output().expect("wait for the client");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{err}");
    let line = vmplane_tests::one_error_line(&err);
    assert!(line.contains("incomplete"), "{line}");
    assert!(line.contains(path(&out_file)), "{line}");
    assert!(line.contains("0 of 3 events"), "{line}");
    assert!(!tmp.exists(), "{} left behind", tmp.display());
    assert!(!out_file.exists());
}

#[test]
fn verify_of_damaged_sled_files_names_the_file_and_changes_nothing() {
    let root = tempfile::tempdir().expect("tempdir");
    let data = restored(root.path(), "sled", "sled");
    // Served once, so sled has written its snapshot file (`snap.*`); then a byte of it flipped.
    let server = Server::start(&data, &["--hypervisor", "none"]);
    server.terminate(Duration::from_secs(20));
    let snap = std::fs::read_dir(&data)
        .expect("ls")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("snap."))
        })
        .expect("sled's snapshot file");
    let mut bytes = std::fs::read(&snap).expect("read");
    bytes[10] ^= 0xff;
    std::fs::write(&snap, bytes).expect("write");
    let before = tree(&data);
    let line = fails(&["verify", "--data", path(&data)]);
    assert!(line.contains(path(&snap)), "names the file: {line}");
    assert!(!line.contains("backtrace"), "{line}");
    assert!(!line.contains("offset None"), "{line}");
    assert_unchanged(&before, &data);
}

#[test]
fn verify_shows_its_progress_on_a_terminal() {
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: no `script` to give vmplane a terminal");
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    let data = restored(root.path(), "tty", "sled");
    let command = format!(
        "{} admin verify --data {}",
        vmplane_tests::vmplane_bin().display(),
        data.display()
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .output()
        .expect("script");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("ok: "), "{text}");
    assert!(
        text.contains("verifying the log"),
        "no progress shown: {text}"
    );
}
