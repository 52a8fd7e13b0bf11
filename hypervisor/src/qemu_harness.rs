//! The real-QEMU test harness (feature `qemu-harness`, for tests only): `virtlogd` and
//! `libvirtd` started by the test (there is no systemd here) with a private socket directory
//! and pid files, killed by PID on drop. Every real-QEMU test of the workspace uses it and takes
//! its file lock ([`QEMU_TEST_LOCK`]), since only one libvirtd QEMU driver can run per machine.
//! Prerequisites: `scripts/install-qemu.sh` (root).
//!
//! [`SessionLibvirtd`] is a libvirtd of its own for tests that break the connection: a session
//! daemon (as `nobody` when the test runs as root), its sockets and state under a temporary
//! directory, which a test kills and starts again. It serves the test driver
//! (`test+unix:///default?socket=…`) without touching the machine's libvirt state, so it needs
//! neither the QEMU lock nor root.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The lock every real-QEMU test of the workspace holds while its libvirtd runs.
pub const QEMU_TEST_LOCK: &str = "/tmp/vmplane-qemu-test.lock";

/// An exclusive `flock` on [`QEMU_TEST_LOCK`], released when dropped (the file closes).
pub struct QemuLock {
    _file: std::fs::File,
}

impl QemuLock {
    /// Blocks until no other real-QEMU test holds the lock.
    pub fn acquire() -> Result<QemuLock, String> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(QEMU_TEST_LOCK)
            .map_err(|e| format!("open {QEMU_TEST_LOCK}: {e}"))?;
        // SAFETY: flock on a file descriptor this function owns for the call's duration.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        if rc != 0 {
            return Err(format!(
                "flock {QEMU_TEST_LOCK}: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(QemuLock { _file: file })
    }
}

/// How long the daemons may take to come up.
pub const DAEMON_START_MS: u64 = 15_000;
/// How long a QEMU process may take to go once its domain is destroyed (this sandbox's init
/// reaps orphans slowly: up to ~2 s).
pub const PROCESS_GONE_MS: u64 = 10_000;

/// The private root `scripts/install-qemu.sh` unpacks QEMU into when it cannot be installed.
const PRIVATE_EMULATOR: &str = "/opt/vmplane-qemu/usr/bin/qemu-system-x86_64";

/// virtlogd and libvirtd, started by this test (killed by PID on drop).
pub struct Daemons {
    dir: tempfile::TempDir,
    /// The QEMU binary libvirtd finds first on its PATH.
    pub emulator: PathBuf,
    started_pids: Vec<(&'static str, u32)>,
    // Dropped after the daemons are killed (fields drop after `Drop::drop`).
    _lock: QemuLock,
}

impl Daemons {
    /// `qemu:///system?socket=<dir>/libvirt-sock`.
    pub fn socket_uri(&self) -> String {
        format!(
            "qemu:///system?socket={}/libvirt-sock",
            self.dir.path().display()
        )
    }

    /// Takes the lock, then starts the daemons; `Err` says why real QEMU cannot run here.
    pub fn start() -> Result<Daemons, String> {
        let lock = QemuLock::acquire()?;
        let uid = Command::new("id")
            .arg("-u")
            .output()
            .map_err(|e| format!("cannot run `id -u`: {e}"))?;
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            return Err("libvirtd's qemu:///system driver needs root".into());
        }
        let libvirtd = find_program("libvirtd", &["/usr/sbin/libvirtd"]).ok_or(
            "libvirtd not found (package libvirt-daemon-system; run scripts/install-qemu.sh)",
        )?;
        let virtlogd = find_program("virtlogd", &["/usr/sbin/virtlogd"])
            .ok_or("virtlogd not found (package libvirt-daemon; run scripts/install-qemu.sh)")?;
        let emulator = std::env::var_os("VMPLANE_QEMU_EMULATOR")
            .map(PathBuf::from)
            .or_else(|| find_program("qemu-system-x86_64", &[PRIVATE_EMULATOR]))
            .ok_or("qemu-system-x86_64 not found (run scripts/install-qemu.sh)")?;
        let version = Command::new(&emulator)
            .arg("--version")
            .output()
            .map_err(|e| format!("cannot run {}: {e}", emulator.display()))?;
        if !version.status.success() {
            return Err(format!(
                "{} --version failed: {}",
                emulator.display(),
                String::from_utf8_lossy(&version.stderr)
            ));
        }
        if Path::new("/run/libvirt/libvirtd.pid").exists()
            && pid_alive_from("/run/libvirt/libvirtd.pid")
        {
            return Err(
                "another libvirtd runs on this machine; its QEMU driver state would clash".into(),
            );
        }
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let mut daemons = Daemons {
            dir,
            emulator,
            started_pids: Vec::new(),
            _lock: lock,
        };
        let d = daemons.dir.path().to_path_buf();

        // QEMU's default stdio_handler ("logd") needs virtlogd on its standard socket.
        if std::os::unix::net::UnixStream::connect("/run/libvirt/virtlogd-sock").is_err() {
            let pid_file = d.join("virtlogd.pid");
            let status = Command::new(&virtlogd)
                .arg("-d")
                .arg("-p")
                .arg(&pid_file)
                .status()
                .map_err(|e| format!("cannot start virtlogd: {e}"))?;
            if !status.success() {
                return Err(format!("virtlogd -d exited with {status}"));
            }
            let pid = wait_for_pid(&pid_file)?;
            daemons.started_pids.push(("virtlogd", pid));
        }

        let conf = d.join("libvirtd.conf");
        std::fs::write(
            &conf,
            format!(
                "unix_sock_dir = \"{dir}\"\nunix_sock_group = \"root\"\nunix_sock_rw_perms = \"0700\"\n\
                 auth_unix_rw = \"none\"\nauth_unix_ro = \"none\"\n\
                 log_outputs = \"3:file:{dir}/libvirtd.log\"\n",
                dir = d.display()
            ),
        )
        .map_err(|e| format!("write libvirtd.conf: {e}"))?;
        let emulator_dir = daemons
            .emulator
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let path = format!(
            "{}:{}",
            emulator_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let pid_file = d.join("libvirtd.pid");
        let status = Command::new(&libvirtd)
            .arg("-d")
            .arg("-f")
            .arg(&conf)
            .arg("-p")
            .arg(&pid_file)
            .env("PATH", path)
            .status()
            .map_err(|e| format!("cannot start libvirtd: {e}"))?;
        if !status.success() {
            return Err(format!(
                "libvirtd -d exited with {status}; log: {}",
                daemons.log()
            ));
        }
        let pid = wait_for_pid(&pid_file)?;
        daemons.started_pids.push(("libvirtd", pid));
        let socket = d.join("libvirt-sock");
        let deadline = Instant::now() + Duration::from_millis(DAEMON_START_MS);
        while !socket.exists() {
            if Instant::now() > deadline {
                return Err(format!(
                    "libvirtd made no socket at {}; log: {}",
                    socket.display(),
                    daemons.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(daemons)
    }

    /// The last error lines of libvirtd's log.
    pub fn log(&self) -> String {
        let text =
            std::fs::read_to_string(self.dir.path().join("libvirtd.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("error")).collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }
}

impl Drop for Daemons {
    fn drop(&mut self) {
        // libvirtd first (it talks to virtlogd), each by the PID it wrote.
        for (name, pid) in self.started_pids.iter().rev() {
            let _ = Command::new("kill").arg(pid.to_string()).status();
            let deadline = Instant::now() + Duration::from_millis(PROCESS_GONE_MS);
            while process_running(*pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if process_running(*pid) {
                eprintln!("{name} (pid {pid}) did not stop on SIGTERM; sending SIGKILL");
                let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            }
        }
    }
}

fn find_program(name: &str, fallbacks: &[&str]) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .chain(fallbacks.iter().map(PathBuf::from))
        .find(|p| p.is_file())
}

fn wait_for_pid(pid_file: &Path) -> Result<u32, String> {
    let deadline = Instant::now() + Duration::from_millis(DAEMON_START_MS);
    loop {
        if let Some(pid) = std::fs::read_to_string(pid_file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return Ok(pid);
        }
        if Instant::now() > deadline {
            return Err(format!("no pid in {}", pid_file.display()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn pid_alive_from(pid_file: &str) -> bool {
    std::fs::read_to_string(pid_file)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .is_some_and(process_running)
}

/// Running: /proc has it and it is not a zombie waiting for its reaper.
pub fn process_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// The arguments of a process (`/proc/PID/cmdline`), empty when it is gone.
pub fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// The running processes whose arguments hold `-uuid UUID`, with their arguments.
pub fn processes_with_uuid(uuid: &str) -> Vec<(u32, Vec<String>)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| process_running(*pid))
        .map(|pid| (pid, cmdline(pid)))
        .filter(|(_, args)| args.windows(2).any(|w| w[0] == "-uuid" && w[1] == uuid))
        .collect()
}

/// How long a session libvirtd may take to answer on its socket.
pub const SESSION_DAEMON_START_MS: u64 = 15_000;

/// A session `libvirtd` started by a test, with its own `XDG_*` directories under a temporary
/// directory (killed on drop). Run as `nobody` when the test runs as root, so it is a session
/// daemon whatever user runs the tests (root's would be the system daemon, whose state is the
/// machine's).
pub struct SessionLibvirtd {
    dir: tempfile::TempDir,
    child: Option<std::process::Child>,
}

impl SessionLibvirtd {
    /// Starts the daemon and waits until its socket answers; `Err` says why it cannot run.
    pub fn start() -> Result<SessionLibvirtd, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let mut daemon = SessionLibvirtd { dir, child: None };
        for sub in ["run", "config", "cache", "data", "home"] {
            std::fs::create_dir_all(daemon.dir.path().join(sub))
                .map_err(|e| format!("create {sub}: {e}"))?;
        }
        if let Some((uid, gid)) = daemon.user() {
            for path in ["", "run", "config", "cache", "data", "home"] {
                let path = daemon.dir.path().join(path);
                let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                // SAFETY: chown of a path this test created, by a NUL-terminated name.
                if unsafe { libc::chown(c_path.as_ptr(), uid, gid) } != 0 {
                    return Err(format!(
                        "chown {}: {}",
                        path.display(),
                        std::io::Error::last_os_error()
                    ));
                }
            }
        }
        daemon.spawn()?;
        Ok(daemon)
    }

    /// `nobody`'s uid and gid when this process runs as root (`None`: run as ourselves).
    fn user(&self) -> Option<(u32, u32)> {
        // SAFETY: getuid cannot fail.
        if unsafe { libc::getuid() } != 0 {
            return None;
        }
        // SAFETY: getpwnam with a NUL-terminated name; the entry is read before any other
        // call could reuse its static storage.
        let entry = unsafe { libc::getpwnam(c"nobody".as_ptr()) };
        if entry.is_null() {
            return Some((65534, 65534));
        }
        // SAFETY: non-null, see above.
        let entry = unsafe { &*entry };
        Some((entry.pw_uid, entry.pw_gid))
    }

    /// The daemon's read-write socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("run/libvirt/libvirt-sock")
    }

    /// The test driver of this daemon: `test+unix:///default?socket=…`.
    pub fn test_uri(&self) -> String {
        format!("test+unix:///default?socket={}", self.socket().display())
    }

    /// Whether the daemon runs.
    pub fn running(&self) -> bool {
        self.child.as_ref().is_some_and(|c| process_running(c.id()))
    }

    /// Kills the daemon (SIGKILL) and reaps it: every connection to it closes.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the daemon again (after [`SessionLibvirtd::kill`]) and waits for its socket. The
    /// test driver starts over: only its own `test` domain.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        self.spawn()
    }

    fn spawn(&mut self) -> Result<(), String> {
        use std::os::unix::process::CommandExt;
        let libvirtd = find_program("libvirtd", &["/usr/sbin/libvirtd"])
            .ok_or("libvirtd not found (package libvirt-daemon)")?;
        let d = self.dir.path();
        // A killed daemon leaves its socket file: wait for the new daemon's, not the old one.
        let _ = std::fs::remove_file(self.socket());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("libvirtd.log"))
            .map_err(|e| format!("open libvirtd.log: {e}"))?;
        let mut command = Command::new(libvirtd);
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", d.join("home"))
            .env("XDG_RUNTIME_DIR", d.join("run"))
            .env("XDG_CONFIG_HOME", d.join("config"))
            .env("XDG_CACHE_HOME", d.join("cache"))
            .env("XDG_DATA_HOME", d.join("data"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log);
        if let Some((uid, gid)) = self.user() {
            command.uid(uid).gid(gid);
        }
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start libvirtd: {e}"))?;
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_millis(SESSION_DAEMON_START_MS);
        while std::os::unix::net::UnixStream::connect(self.socket()).is_err() {
            if !process_running(pid) || Instant::now() > deadline {
                let log = std::fs::read_to_string(d.join("libvirtd.log")).unwrap_or_default();
                self.kill();
                return Err(format!(
                    "session libvirtd does not answer on {}; its log:\n{log}",
                    self.socket().display()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for SessionLibvirtd {
    fn drop(&mut self) {
        self.kill();
    }
}
