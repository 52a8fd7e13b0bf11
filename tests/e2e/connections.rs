//! The gRPC listener's connections (from a security audit): a connection that never opens
//! (no HTTP/2 preface) is closed after `--connection-open-timeout-ms`, so silent connections
//! cannot fill the server's slots or descriptors; one with no call open for
//! `--max-connection-idle-seconds` is closed with a GOAWAY, whatever pings it sends, while a
//! watch holds its own open; failed accepts (out of descriptors) back off and are logged once a
//! second instead of spinning; the cap and the open-file limit are said at startup; a TLS
//! certificate clients will refuse is warned about. Deadlines are shortened by flag, so each
//! test runs in seconds.

use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vmplane_tests::{AuthToken, Cli, Server, vm_manifest, write_auth_file};

use crate::rt;

const OPS: &str = "ops-connections-7c2d91e4b05a";

/// An `--auth` file in `dir` with one admin token, [`OPS`].
fn auth_file(dir: &Path) -> String {
    let path = dir.join("auth.yaml");
    write_auth_file(
        &path,
        &[AuthToken {
            principal: "ops",
            token: OPS,
            roles: &[("admin", &[])],
        }],
    );
    path.to_str().expect("utf-8 path").to_string()
}

/// Waits for `child` to exit within `within`; kills it and fails the test when it does not.
#[track_caller]
fn finished_within(mut child: Child, within: Duration, what: &str) -> (i32, String, String) {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait for vmplane") {
            let mut out = String::new();
            let mut err = String::new();
            if let Some(mut stdout) = child.stdout.take() {
                let _ = stdout.read_to_string(&mut out);
            }
            if let Some(mut stderr) = child.stderr.take() {
                let _ = stderr.read_to_string(&mut err);
            }
            return (status.code().unwrap_or(-1), out, err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `conn` is closed by the server within `within` (its end read, or a reset).
fn closed_within(conn: &mut std::net::TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 256];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        conn.set_read_timeout(Some(left)).expect("read timeout");
        match conn.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(err)
                if matches!(
                    err.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn silent_connections_are_closed_after_the_open_timeout_and_an_authenticated_call_gets_through() {
    let dir = tempfile::tempdir().expect("tempdir");
    let auth = auth_file(dir.path());
    let server = Server::start(
        &dir.path().join("data"),
        &[
            "--auth",
            &auth,
            "--hypervisor",
            "none",
            "--max-connections",
            "4",
            "--connection-open-timeout-ms",
            "1000",
        ],
    );
    assert!(
        server.stderr().contains("max_connections=4"),
        "the startup trace says the cap:\n{}",
        server.stderr()
    );
    // Three times the cap of connections that say nothing: 4 served, the rest in the backlog.
    let mut silent: Vec<std::net::TcpStream> = (0..12)
        .map(|_| std::net::TcpStream::connect(server.addr).expect("connect"))
        .collect();
    let started = Instant::now();
    let (code, out, err) = finished_within(
        Cli::new(&server).with_token(OPS).spawn(&["get", "vms"]),
        Duration::from_secs(30),
        "`vmplane get vms` behind 12 silent connections",
    );
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    // Its turn came after three rounds of silent connections, closed 1 s after each accept.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    for (i, conn) in silent.iter_mut().enumerate() {
        assert!(
            closed_within(conn, Duration::from_secs(10)),
            "silent connection {i} is still open"
        );
    }
}

/// HTTP/2 frame types and the flag this test uses (RFC 9113, section 6).
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;

/// One HTTP/2 frame on the connection (stream 0).
fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("small payload");
    let mut bytes = len.to_be_bytes()[1..].to_vec();
    bytes.extend([kind, flags, 0, 0, 0, 0]);
    bytes.extend_from_slice(payload);
    bytes
}

/// The next whole frame at the start of `buf` (type, flags, payload), taken off it.
fn take_frame(buf: &mut Vec<u8>) -> Option<(u8, u8, Vec<u8>)> {
    if buf.len() < 9 {
        return None;
    }
    let len = usize::from(buf[0]) << 16 | usize::from(buf[1]) << 8 | usize::from(buf[2]);
    if buf.len() < 9 + len {
        return None;
    }
    let frame: Vec<u8> = buf.drain(..9 + len).collect();
    Some((frame[3], frame[4], frame[9..].to_vec()))
}

/// What an HTTP/2 client that opened a connection and then only pinged saw.
#[derive(Debug)]
struct Pinged {
    /// When the server's GOAWAY came, after the connection opened.
    goaway_after: Option<Duration>,
    /// When the server closed the connection.
    closed_after: Duration,
    /// How many of its pings the server answered.
    pings_answered: usize,
}

/// Opens an HTTP/2 connection to `addr` (preface and SETTINGS), then sends a PING every
/// 300 ms and answers the server's, until the server closes it (or 30 s pass). Its local
/// address, and what it saw.
async fn open_and_only_ping(addr: SocketAddr) -> (SocketAddr, tokio::task::JoinHandle<Pinged>) {
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let local = conn.local_addr().expect("local address");
    let task = tokio::spawn(async move {
        let started = Instant::now();
        let mut opening = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        opening.extend(frame(SETTINGS, 0, &[]));
        conn.write_all(&opening).await.expect("open");
        let mut tick = tokio::time::interval(Duration::from_millis(300));
        let (mut buf, mut chunk) = (Vec::new(), [0u8; 4096]);
        let mut seen = Pinged {
            goaway_after: None,
            closed_after: Duration::MAX,
            pings_answered: 0,
        };
        while started.elapsed() < Duration::from_secs(30) {
            tokio::select! {
                _ = tick.tick() => {
                    if seen.goaway_after.is_none() {
                        let _ = conn.write_all(&frame(PING, 0, b"keepaliv")).await;
                    }
                }
                read = conn.read(&mut chunk) => match read {
                    Ok(0) | Err(_) => {
                        seen.closed_after = started.elapsed();
                        break;
                    }
                    Ok(n) => {
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some((kind, flags, payload)) = take_frame(&mut buf) {
                            match (kind, flags & ACK != 0) {
                                (GOAWAY, _) => {
                                    seen.goaway_after.get_or_insert(started.elapsed());
                                }
                                (PING, true) => seen.pings_answered += 1,
                                (PING, false) => {
                                    let _ = conn.write_all(&frame(PING, ACK, &payload)).await;
                                }
                                (SETTINGS, false) => {
                                    let _ = conn.write_all(&frame(SETTINGS, ACK, &[])).await;
                                }
                                _ => {}
                            }
                        }
                    }
                },
            }
        }
        seen
    });
    (local, task)
}

/// The server's "connection idle: GOAWAY" lines.
fn idle_lines(server: &Server) -> Vec<String> {
    server
        .stderr()
        .lines()
        .filter(|line| line.contains("connection idle: GOAWAY"))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_connection_with_no_call_open_gets_a_goaway_whatever_it_pings_while_a_watch_stays_open() {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_logging(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &[
            "--hypervisor",
            "none",
            "--max-connection-idle-seconds",
            "2",
            "--connection-open-timeout-ms",
            "1000",
        ],
        "info,vmplane_gateway::connections=debug",
    );
    rt().block_on(async {
        // A watch on a connection of its own, opened with the pinging connection.
        let mut watch = crate::watch_all(&server, None, None)
            .await
            .expect("watch")
            .into_inner();
        let (pinger, pinged) = open_and_only_ping(server.addr).await;
        let seen = pinged.await.expect("the pinging client");
        let goaway = seen
            .goaway_after
            .unwrap_or_else(|| panic!("no GOAWAY: {seen:?}"));
        assert!(
            goaway >= Duration::from_millis(1_800) && goaway < Duration::from_secs(8),
            "the GOAWAY comes 2 s after the last call ended (none here), pings or not: {seen:?}"
        );
        assert!(
            seen.pings_answered >= 3,
            "its pings were answered: {seen:?}"
        );
        assert!(
            seen.closed_after < goaway + Duration::from_secs(3),
            "closed once it answered the GOAWAY's ping: {seen:?}"
        );
        let lines = idle_lines(&server);
        assert_eq!(
            lines.len(),
            1,
            "only the pinging connection was idle: {lines:#?}"
        );
        assert!(
            lines[0].contains(&format!(":{})", pinger.port())),
            "{lines:#?} name {pinger}"
        );

        // The watch, older than the idle limit, still delivers.
        Cli::new(&server).apply_in("connections", &vm_manifest("after-idle", "64Mi"));
        let event = crate::next_event(&mut watch).await;
        assert!(event.position > 0, "{event:?}");

        // A client whose connection was closed for idleness calls again on the same channel,
        // with no error: it reconnects.
        let mut health = HealthClient::new(crate::channel(&server).await);
        let ask = || HealthCheckRequest {
            service: String::new(),
        };
        health.check(ask()).await.expect("a first call");
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        assert_eq!(
            idle_lines(&server).len(),
            2,
            "the health client's connection was closed, the watch's was not: {:#?}",
            idle_lines(&server)
        );
        health.check(ask()).await.expect("a call after the GOAWAY");
        let event_again = async {
            Cli::new(&server).apply_in("connections", &vm_manifest("later", "64Mi"));
            crate::next_event(&mut watch).await
        };
        assert!(event_again.await.position > event.position);
        assert_eq!(idle_lines(&server).len(), 2, "{:#?}", idle_lines(&server));
    });
}

/// `(utime + stime)` of process `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    // After the command name's closing parenthesis: state is field 3, utime 14, stime 15.
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

#[test]
fn out_of_descriptors_the_server_backs_off_logs_once_a_second_and_serves_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(
        &dir.path().join("data"),
        &[
            "--hypervisor",
            "none",
            "--max-connections",
            "1000",
            "--connection-open-timeout-ms",
            "1000",
        ],
    );
    let pid = server.pid();
    // The server's open-file limit lowered under it: room for a few connections only.
    let open_fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the server's descriptors")
        .count();
    let low = u64::try_from(open_fds + 6).expect("fds");
    let limit = libc::rlimit {
        rlim_cur: low,
        rlim_max: low,
    };
    // SAFETY: prlimit(2) on our own child, reading the struct given, writing nothing back.
    let set = unsafe {
        libc::prlimit(
            libc::pid_t::try_from(pid).expect("pid"),
            libc::RLIMIT_NOFILE,
            &limit,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(set, 0, "prlimit: {}", std::io::Error::last_os_error());
    let silent: Vec<std::net::TcpStream> = (0..24)
        .map(|_| std::net::TcpStream::connect(server.addr).expect("connect"))
        .collect();
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_millis(2_500));
    let spent = cpu_ticks(pid) - before;
    assert!(
        spent < 50,
        "the server spent {spent} ticks of 2.5 s out of descriptors: it spins on accept"
    );
    let failures = server
        .stderr()
        .lines()
        .filter(|line| line.contains("accepting a connection failed"))
        .count();
    assert!(
        (1..=5).contains(&failures),
        "failed accepts logged once a second at most, with a count: {failures} lines\n{}",
        server.stderr()
    );
    assert!(
        server.stderr().contains("Too many open files") && server.stderr().contains("failures="),
        "{}",
        server.stderr()
    );
    // The silent connections are closed in turn, and a call gets through, under the same limit.
    let (code, out, err) = finished_within(
        Cli::new(&server).spawn(&["get", "vms"]),
        Duration::from_secs(30),
        "`vmplane get vms` after running out of descriptors",
    );
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    drop(silent);
}

/// A self-signed certificate for 127.0.0.1 made by `edit`, and its key, as PEM files in `dir`;
/// `serve`'s `--tls-cert` and `--tls-key` arguments.
fn certificate(dir: &Path, edit: impl FnOnce(&mut rcgen::CertificateParams)) -> [String; 4] {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".into()]).expect("params");
    edit(&mut params);
    let cert = params.self_signed(&key).expect("certificate");
    let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_path, cert.pem()).expect("write the certificate");
    std::fs::write(&key_path, key.serialize_pem()).expect("write the key");
    let shown = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    [
        "--tls-cert".into(),
        shown(&cert_path),
        "--tls-key".into(),
        shown(&key_path),
    ]
}

#[test]
fn serve_warns_of_an_expired_certificate_and_of_a_ca_certificate_as_its_own() {
    use rcgen::{BasicConstraints, IsCa, date_time_ymd};
    type Case = (
        &'static str,
        fn(&mut rcgen::CertificateParams),
        &'static str,
    );
    let cases: [Case; 3] = [
        (
            "expired",
            |p| {
                p.not_before = date_time_ymd(2000, 1, 1);
                p.not_after = date_time_ymd(2001, 1, 1);
            },
            "the certificate expired on 2001-01-01 00:00:00 UTC",
        ),
        (
            "ca",
            |p| p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained),
            "the certificate is a CA certificate (basic constraints CA:TRUE)",
        ),
        ("good", |_| {}, ""),
    ];
    for (name, edit, warning) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut extra: Vec<String> = certificate(dir.path(), edit).into();
        extra.extend(["--hypervisor".into(), "none".into()]);
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let server = Server::start(&dir.path().join("data"), &extra);
        let stderr = server.stderr();
        let said: Vec<&str> = stderr
            .lines()
            .filter(|line| line.starts_with("vmplane: warning: --tls-cert "))
            .collect();
        if warning.is_empty() {
            assert!(said.is_empty(), "{name}: {stderr}");
            continue;
        }
        assert_eq!(said.len(), 1, "{name}: one line on stderr: {stderr}");
        assert!(said[0].contains(warning), "{name}: {stderr}");
        assert!(
            stderr
                .lines()
                .any(|line| line.contains("WARN") && line.contains(warning)),
            "{name}: and in the log: {stderr}"
        );
    }
}
