//! # vmplane-tests
//!
//! Workspace-level end-to-end tests: they drive the real `vmplane` binary as a user would, on a
//! loopback port the server picks itself (`--listen 127.0.0.1:0`; the ready line says which).
//! This library holds the harness; the tests are in `e2e/`, one module per area.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a server may take from spawn to its ready line.
pub const SERVER_READY_TIMEOUT_MS: u64 = 30_000;

/// Path of the `vmplane` binary, built once per test run (`cargo build` is quick when fresh).
pub fn vmplane_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let target_dir = target_dir();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args([
                "build",
                "--quiet",
                "-p",
                "vmplane-gateway",
                "--bin",
                "vmplane",
            ])
            .status()
            .expect("run cargo build for the vmplane binary");
        assert!(status.success(), "cargo build of the vmplane binary failed");
        let bin = target_dir.join("debug").join("vmplane");
        assert!(
            bin.exists(),
            "vmplane binary not found at {}",
            bin.display()
        );
        bin
    })
    .clone()
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
        let mut child = Command::new(vmplane_bin())
            .arg("serve")
            .arg("--data")
            .arg(data)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn vmplane serve");
        let stderr = child.stderr.take().expect("piped stderr");
        let lines = std::sync::Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Some(addr) = parse_ready_line(&line) {
                        let _ = tx.send(addr);
                    }
                    lines.lock().expect("lines lock").push(line);
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
        Server {
            child,
            url: format!("http://{addr}"),
            addr,
            stderr_lines: lines,
        }
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
