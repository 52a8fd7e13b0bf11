//! # vmplane-tests
//!
//! Workspace-level end-to-end tests: they drive the real `vmplane` binary as a user would, on a
//! loopback port the server picks itself (`--listen 127.0.0.1:0`; the ready line says which).
//! This library holds the harness; the tests are in `e2e/`, one module per area.

/// The real-QEMU harness (virtlogd + libvirtd with a private socket), shared with the
/// hypervisor crate's own QEMU test.
pub use vmplane_hypervisor::qemu_harness;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a server may take from spawn to its ready line.
pub const SERVER_READY_TIMEOUT_MS: u64 = 30_000;

/// Path of the `vmplane` binary, built once per test run (`cargo build` is quick when fresh),
/// in the profile the tests were built in (`cargo test --release` drives a release binary, and
/// does not build a second, debug tree for it). `VMPLANE_E2E_BIN=PATH` tests that binary instead,
/// unbuilt (e.g. an older build, to see a new test fail on it).
pub fn vmplane_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("VMPLANE_E2E_BIN") {
            return PathBuf::from(bin);
        }
        let target_dir = target_dir();
        let profile = test_profile();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut args = vec![
            "build",
            "--quiet",
            "-p",
            "vmplane-gateway",
            "--bin",
            "vmplane",
        ];
        if profile == "release" {
            args.push("--release");
        }
        let status = Command::new(cargo)
            .args(&args)
            .status()
            .expect("run cargo build for the vmplane binary");
        assert!(status.success(), "cargo build of the vmplane binary failed");
        let bin = target_dir.join(profile).join("vmplane");
        assert!(
            bin.exists(),
            "vmplane binary not found at {}",
            bin.display()
        );
        bin
    })
    .clone()
}

/// `release` when this test executable is in `<target>/release/deps/`, else `debug`.
fn test_profile() -> &'static str {
    let exe = std::env::current_exe().unwrap_or_default();
    let profile = exe.ancestors().nth(2).and_then(Path::file_name);
    if profile.is_some_and(|p| p == "release") {
        "release"
    } else {
        "debug"
    }
}

fn target_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    // The test executable lives in <target>/debug/deps/.
    let exe = std::env::current_exe().expect("current_exe");
    exe.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .expect("test executable is inside <target>/debug/deps")
}

/// A running `vmplane serve`, killed on drop.
pub struct Server {
    child: Child,
    /// `http://ADDR`, for gRPC clients.
    pub url: String,
    /// The address it serves on.
    pub addr: std::net::SocketAddr,
    stderr_lines: std::sync::Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Starts `vmplane serve --data DIR --listen 127.0.0.1:0 EXTRA...` and waits for its ready
    /// line.
    pub fn start(data: &Path, extra: &[&str]) -> Server {
        Server::start_listening(data, "127.0.0.1:0", extra)
    }

    /// Starts `vmplane serve --data DIR --listen LISTEN EXTRA...` and waits for its ready line.
    /// The URL clients use points at loopback when the server listens on every address.
    pub fn start_listening(data: &Path, listen: &str, extra: &[&str]) -> Server {
        Server::start_logging(data, listen, extra, "info")
    }

    /// [`Server::start_listening`] with `RUST_LOG=rust_log` (what [`Server::stderr`] then holds).
    pub fn start_logging(data: &Path, listen: &str, extra: &[&str], rust_log: &str) -> Server {
        let mut command = Command::new(vmplane_bin());
        command
            .arg("serve")
            .arg("--data")
            .arg(data)
            .args(["--listen", listen])
            .args(extra)
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        Server::wait_ready(command.spawn().expect("spawn vmplane serve"))
    }

    /// Starts a server on a fresh data directory that lives as long as the test process: for
    /// the tests of one module to share (each in its own namespaces). It is killed, and its
    /// directory removed, when the test process exits, however it exits.
    pub fn start_shared(extra: &[&str]) -> Server {
        let data = kept_tempdir();
        let mut command = Command::new(vmplane_bin());
        command
            .arg("serve")
            .arg("--data")
            .arg(data.join("data"))
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let child = spawn_tied_to_this_process(command);
        register_exit_cleanup(Some(child.id()), data);
        Server::wait_ready(child)
    }

    fn wait_ready(mut child: Child) -> Server {
        let stderr = child.stderr.take().expect("piped stderr");
        let lines = std::sync::Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    let ready = parse_ready_line(&line);
                    // Kept before it is announced: `stderr()` has the ready line once `start`
                    // returns.
                    lines.lock().expect("lines lock").push(line);
                    if let Some(addr) = ready {
                        let _ = tx.send(addr);
                    }
                }
            });
        }
        let deadline = Instant::now() + Duration::from_millis(SERVER_READY_TIMEOUT_MS);
        let addr = loop {
            if let Ok(addr) = rx.recv_timeout(Duration::from_millis(50)) {
                break addr;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "vmplane serve exited with {status} before it was ready; stderr:\n{}",
                    lines.lock().expect("lines lock").join("\n")
                );
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "vmplane serve not ready within {SERVER_READY_TIMEOUT_MS} ms; stderr:\n{}",
                    lines.lock().expect("lines lock").join("\n")
                );
            }
        };
        // A server listening on every address is reached through loopback.
        let reach = if addr.ip().is_unspecified() {
            std::net::SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
        } else {
            addr
        };
        Server {
            child,
            url: format!("http://{reach}"),
            addr,
            stderr_lines: lines,
        }
    }

    /// `https://ADDR`: the URL of a server started with `--tls-cert`/`--tls-key` (`url` keeps
    /// `http://`, for tests of what a plaintext client meets).
    pub fn https_url(&self) -> String {
        format!("https://{}", self.url.trim_start_matches("http://"))
    }

    /// The server process's id (for fault tests that signal it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the server printed on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr_lines.lock().expect("lines lock").join("\n")
    }

    /// Sends SIGTERM and waits for the exit status (killing it after `timeout`).
    pub fn terminate(mut self, timeout: Duration) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("vmplane serve did not exit within {timeout:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server's ready line is `vmplane: ready: serving gRPC on ADDR ...`.
pub fn parse_ready_line(line: &str) -> Option<std::net::SocketAddr> {
    let rest = line.split("ready: serving gRPC on ").nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

/// Runs `vmplane ARGS...` to completion and returns (exit code, stdout, stderr).
pub fn run_cli(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(vmplane_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run vmplane");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Spawns `command` from a thread that lives as long as the test process, with the parent-death
/// signal set: when the process ends, however it ends, the child gets SIGKILL. (The signal
/// follows the spawning *thread*, so a test thread, which ends with its test, must not spawn.)
fn spawn_tied_to_this_process(command: Command) -> Child {
    use std::os::unix::process::CommandExt;
    use std::sync::mpsc;
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("e2e-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    // SAFETY: prctl(2) is async-signal-safe; it touches only the new process.
                    unsafe {
                        command.pre_exec(|| {
                            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                                return Err(std::io::Error::last_os_error());
                            }
                            Ok(())
                        });
                    }
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("start the spawner thread");
        Mutex::new(tx)
    });
    let (reply, answer) = mpsc::channel();
    spawner
        .lock()
        .expect("spawner lock")
        .send((command, reply))
        .expect("spawner thread is alive");
    answer
        .recv()
        .expect("spawner answers")
        .expect("spawn vmplane serve")
}

/// Shared servers (pid, directory) and shared directories (no pid) to kill and remove when the
/// test process exits normally.
static SHARED: Mutex<Vec<(Option<u32>, PathBuf)>> = Mutex::new(Vec::new());

/// A fresh directory that lives as long as the test process and is removed when it exits: for
/// files a module's shared server reads (a static's `TempDir` is never dropped, so it would be
/// left behind).
pub fn shared_dir() -> PathBuf {
    let dir = kept_tempdir();
    register_exit_cleanup(None, dir.clone());
    dir
}

/// A fresh directory that is not removed when dropped: whoever makes it registers it with
/// [`register_exit_cleanup`].
fn kept_tempdir() -> PathBuf {
    tempfile::Builder::new()
        .prefix("vmplane-e2e-")
        .tempdir()
        .expect("tempdir")
        .keep()
}

fn register_exit_cleanup(pid: Option<u32>, dir: PathBuf) {
    static HOOK: OnceLock<()> = OnceLock::new();
    HOOK.get_or_init(|| {
        extern "C" fn cleanup() {
            let Ok(mut shared) = SHARED.lock() else {
                return;
            };
            for (pid, dir) in shared.drain(..) {
                if let Some(pid) = pid {
                    // SAFETY: kill(2) and waitpid(2) on our own child.
                    unsafe {
                        libc::kill(pid as libc::pid_t, libc::SIGKILL);
                        libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0);
                    }
                }
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        // SAFETY: registers a plain function without captured state.
        unsafe { libc::atexit(cleanup) };
    });
    SHARED.lock().expect("shared lock").push((pid, dir));
}

/// A small VM manifest named `name` (runStrategy Manual) with `memory` of guest memory, for
/// tests that only need some VM to exist.
pub fn vm_manifest(name: &str, memory: &str) -> String {
    format!(
        "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: {name}
spec:
  runStrategy: Manual
  template:
    spec:
      domain:
        memory:
          guest: {memory}
"
    )
}

/// The repository's root (holds `examples/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_path_buf()
}

#[path = "testdata_dir.rs"]
mod testdata_dir;
pub use testdata_dir::kubevirt_testdata;

/// The `vmplane` client pointed at one server, with an optional token and CA certificate. The
/// environment's `VMPLANE_SERVER`, `VMPLANE_TOKEN` and `VMPLANE_CA_CERT` are ignored.
#[derive(Debug, Clone)]
pub struct Cli {
    server: String,
    token: Option<String>,
    ca_cert: Option<PathBuf>,
}

impl Cli {
    /// A client of `server` without a token.
    pub fn new(server: &Server) -> Cli {
        Cli::at(&server.url)
    }

    /// A client of the server at `url`.
    pub fn at(url: &str) -> Cli {
        Cli {
            server: url.to_string(),
            token: None,
            ca_cert: None,
        }
    }

    /// The same client, sending `token`.
    pub fn with_token(&self, token: &str) -> Cli {
        Cli {
            token: Some(token.to_string()),
            ..self.clone()
        }
    }

    /// The same client, verifying an `https://` server against the CA in `ca_cert`.
    pub fn with_ca_cert(&self, ca_cert: &Path) -> Cli {
        Cli {
            ca_cert: Some(ca_cert.to_path_buf()),
            ..self.clone()
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(vmplane_bin());
        command
            .args(args)
            .arg("--server")
            .arg(&self.server)
            .env_remove("VMPLANE_SERVER")
            .env_remove("VMPLANE_TOKEN")
            .env_remove("VMPLANE_CA_CERT");
        if let Some(token) = &self.token {
            command.arg("--token").arg(token);
        }
        if let Some(ca_cert) = &self.ca_cert {
            command.arg("--ca-cert").arg(ca_cert);
        }
        command
    }

    /// Runs `vmplane ARGS... --server URL [--token T]` and returns (exit code, stdout, stderr).
    pub fn run(&self, args: &[&str]) -> (i32, String, String) {
        self.run_with_stdin(args, "")
    }

    /// Like [`Cli::run`], with `stdin` on standard input.
    pub fn run_with_stdin(&self, args: &[&str], stdin: &str) -> (i32, String, String) {
        use std::io::Write;
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run vmplane");
        let mut input = child.stdin.take().expect("piped stdin");
        let stdin = stdin.to_string();
        let writer = std::thread::spawn(move || {
            let _ = input.write_all(stdin.as_bytes());
        });
        let out = child.wait_with_output().expect("wait for vmplane");
        let _ = writer.join();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs the command, asserts it succeeded, and returns its standard output.
    #[track_caller]
    pub fn ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.run(args);
        assert_eq!(
            code, 0,
            "vmplane {args:?} failed with {code}\nstdout:\n{out}\nstderr:\n{err}"
        );
        out
    }

    /// Runs the command, asserts it failed with exactly one `vmplane: error:` line on stderr,
    /// and returns that line.
    #[track_caller]
    pub fn fails(&self, args: &[&str]) -> String {
        let (code, out, err) = self.run(args);
        assert!(
            code != 0,
            "vmplane {args:?} succeeded but should have failed\nstdout:\n{out}\nstderr:\n{err}"
        );
        one_error_line(&err)
    }

    /// `vmplane apply -n NS -f -` of `manifest`, which must succeed.
    #[track_caller]
    pub fn apply_in(&self, ns: &str, manifest: &str) {
        let (code, out, err) = self.run_with_stdin(&["apply", "-n", ns, "-f", "-"], manifest);
        assert_eq!(code, 0, "apply failed: {out}\n{err}");
    }

    /// Starts a long-running command (`watch`) with its standard output piped.
    pub fn spawn(&self, args: &[&str]) -> Child {
        self.command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn vmplane")
    }
}

/// Asserts `stderr` holds exactly one line, starting `vmplane: error: `, and returns it.
#[track_caller]
pub fn one_error_line(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one error line on stderr, got:\n{stderr}"
    );
    assert!(
        lines[0].starts_with("vmplane: error: "),
        "the error line must start with `vmplane: error: `: {stderr}"
    );
    lines[0].to_string()
}

/// One principal of an `--auth` file: its token (stored only as a SHA-256 digest) and roles
/// as `(role, namespaces)`.
pub struct AuthToken<'a> {
    /// Recorded as the actor of what it does.
    pub principal: &'a str,
    /// What the client sends.
    pub token: &'a str,
    /// `("admin", &[])`, `("edit", &["team-a"])`, `("view", &["shared"])`.
    pub roles: &'a [(&'a str, &'a [&'a str])],
}

/// Writes an `--auth` file to `path` in INTERFACE.md's format: tokens as SHA-256 hex digests.
pub fn write_auth_file(path: &Path, tokens: &[AuthToken<'_>]) {
    use sha2::{Digest, Sha256};
    let mut yaml = String::from("tokens:\n");
    for t in tokens {
        let digest = hex::encode(Sha256::digest(t.token.as_bytes()));
        yaml.push_str(&format!(
            "  - principal: {}\n    sha256: {digest}\n",
            t.principal
        ));
        if t.roles.is_empty() {
            yaml.push_str("    roles: []\n");
            continue;
        }
        yaml.push_str("    roles:\n");
        for (role, namespaces) in t.roles {
            if namespaces.is_empty() {
                yaml.push_str(&format!("      - {{role: {role}}}\n"));
            } else {
                yaml.push_str(&format!(
                    "      - {{role: {role}, namespaces: [{}]}}\n",
                    namespaces.join(", ")
                ));
            }
        }
    }
    std::fs::write(path, yaml).expect("write the auth file");
}

/// Picks a free loopback port (for a metrics listener: the gRPC one is chosen by the server).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// `GET /metrics` of a server's metrics listener on `port`, which must answer 200.
pub fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to metrics");
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    assert!(
        out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200"),
        "{out}"
    );
    out
}

/// Polls `check` every 100 ms until it returns `Some`, failing with `what` and `context()`.
#[track_caller]
pub fn wait_for<T>(
    what: &str,
    timeout_ms: u64,
    mut check: impl FnMut() -> Option<T>,
    context: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout_ms} ms waiting for {what}\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
