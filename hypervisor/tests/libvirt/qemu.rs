//! A real QEMU domain through a real libvirtd, driven by the reconciler.
//!
//! The harness starts `virtlogd` (unless one already serves libvirt's standard socket) and
//! `libvirtd` itself — there is no systemd here — with a private socket directory and pid
//! files, connects with `qemu:///system?socket=<dir>/libvirt-sock`, and kills what it started
//! by PID at the end. Prerequisites: `scripts/install-qemu.sh` (root).
//!
//! If the daemon or the emulator cannot run here, the test **fails** with the reason; set
//! `VMPLANE_SKIP_QEMU=1` to skip it instead (it then prints a SKIPPED line).

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmplane_core::VmCommand;
use vmplane_core::event::VmiPhase;
use vmplane_hypervisor::mapping::DomainDefaults;
use vmplane_hypervisor::{
    ControlPlane, Hypervisor, LibvirtHypervisor, Nodes, Reconciler, ReconcilerOptions, VirtType,
};

use crate::log_control_plane::LogControlPlane;

/// How long the daemons may take to come up, and QEMU to go (this sandbox's init reaps
/// orphans slowly: up to ~2 s, see the reference).
const DAEMON_START_MS: u64 = 15_000;
const PROCESS_GONE_MS: u64 = 10_000;

/// The private root `scripts/install-qemu.sh` unpacks QEMU into when it cannot be installed.
const PRIVATE_EMULATOR: &str = "/opt/vmplane-qemu/usr/bin/qemu-system-x86_64";

/// The lock every real-QEMU test of the workspace holds while its libvirtd runs (only one
/// libvirtd QEMU driver can run per machine; `tests/qemu_harness.rs` takes it too).
const QEMU_TEST_LOCK: &str = "/tmp/vmplane-qemu-test.lock";

/// An exclusive `flock` on [`QEMU_TEST_LOCK`], released when dropped (the file closes).
struct QemuLock {
    _file: std::fs::File,
}

impl QemuLock {
    fn acquire() -> Result<QemuLock, String> {
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

/// virtlogd and libvirtd, started by this test (killed by PID on drop).
struct Daemons {
    dir: tempfile::TempDir,
    emulator: PathBuf,
    started_pids: Vec<(&'static str, u32)>,
    // Dropped after the daemons are killed (fields drop after `Drop::drop`).
    _lock: QemuLock,
}

impl Daemons {
    fn socket_uri(&self) -> String {
        format!(
            "qemu:///system?socket={}/libvirt-sock",
            self.dir.path().display()
        )
    }

    fn start() -> Result<Daemons, String> {
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

    fn log(&self) -> String {
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
fn process_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn vm_yaml() -> String {
    r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: qemu-guest, namespace: default}
spec:
  runStrategy: Always
  template:
    spec:
      terminationGracePeriodSeconds: 2
      domain:
        cpu: {sockets: 1}
        memory: {guest: 64Mi}
        devices: {autoattachPodInterface: false}
"#
    .to_owned()
}

#[test]
fn a_real_qemu_guest_has_the_firmware_uuid_and_a_stop_ends_in_destroy_after_the_grace_period() {
    if std::env::var("VMPLANE_SKIP_QEMU").is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED: real-QEMU test (VMPLANE_SKIP_QEMU=1)");
        return;
    }
    let daemons = Daemons::start().unwrap_or_else(|reason| {
        panic!(
            "REAL QEMU UNAVAILABLE: {reason}\n\
             Run `sudo scripts/install-qemu.sh`, or set VMPLANE_SKIP_QEMU=1 to skip this test."
        )
    });
    let uri = daemons.socket_uri();
    let hv = Arc::new(LibvirtHypervisor::open(&uri).unwrap_or_else(|e| {
        panic!(
            "REAL QEMU UNAVAILABLE: cannot connect to {uri}: {e}; log: {}",
            daemons.log()
        )
    }));
    let mut nodes = Nodes::default();
    nodes.add("qemu".into(), hv.clone()).expect("node capacity");
    let log_dir = tempfile::tempdir().expect("temp dir");
    let cp = LogControlPlane::open(log_dir.path());
    let options = ReconcilerOptions {
        domain_defaults: DomainDefaults {
            virt_type: VirtType::Qemu,
            emulator: Some(daemons.emulator.clone()),
        },
        ..ReconcilerOptions::default()
    };
    let dyn_cp: Arc<dyn ControlPlane> = cp.clone();
    let mut reconciler = Reconciler::new(dyn_cp, nodes, options);

    cp.apply_vm(&vm_yaml());
    let started = Instant::now();
    let report = reconciler.run_once();
    assert!(
        report.errors.is_empty(),
        "{:#?}; log: {}",
        report.errors,
        daemons.log()
    );
    let state = cp.vm("default", "qemu-guest");
    let vmi = state.run.vmi.as_ref().expect("a VMI");
    assert_eq!(vmi.phase, VmiPhase::Running, "{:#?}", report.actions);
    eprintln!("launch to Running on real QEMU: {:?}", started.elapsed());
    let fw = state.firmware.as_ref().expect("firmware").uuid;

    // The QEMU process carries the firmware UUID as its UUID and SMBIOS system UUID.
    let pid_file = "/run/libvirt/qemu/vmplane_default_qemu-guest.pid";
    let pid: u32 = std::fs::read_to_string(pid_file)
        .expect("libvirt's pid file of the domain")
        .trim()
        .parse()
        .expect("a pid");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let uuid_arg = args
        .iter()
        .position(|a| a == "-uuid")
        .and_then(|i| args.get(i + 1));
    assert_eq!(uuid_arg, Some(&fw.to_string()), "{args:?}");
    let smbios = args
        .windows(2)
        .find(|w| w[0] == "-smbios" && w[1].starts_with("type=1"))
        .map(|w| w[1].clone())
        .unwrap_or_default();
    assert!(smbios.contains(&format!("uuid={fw}")), "{smbios}");
    assert!(
        args.iter()
            .any(|a| a == "tcg" || a.contains("accel=tcg") || a.contains("tcg")),
        "{args:?}"
    );

    // A stop: the guest (no OS) ignores the ACPI shutdown, so the grace period ends in destroy.
    cp.user_vm("default", "qemu-guest", VmCommand::Stop);
    let report = reconciler.run_once();
    assert!(report.errors.is_empty(), "{:#?}", report.errors);
    assert_eq!(
        report.actions_of("stop_vmi").len(),
        1,
        "{:#?}",
        report.actions
    );
    assert!(
        process_running(pid),
        "the guest without an OS ignores the ACPI shutdown"
    );
    let due = report.next_due_ms.expect("the end of the grace period");
    std::thread::sleep(Duration::from_millis(
        u64::try_from(due - cp.now_ms()).unwrap_or(0) + 50,
    ));
    let report = reconciler.run_once();
    assert!(report.errors.is_empty(), "{:#?}", report.errors);
    assert_eq!(
        report.actions_of("destroy_after_grace_period").len(),
        1,
        "{:#?}",
        report.actions
    );
    let state = cp.vm("default", "qemu-guest");
    assert!(state.run.vmi.is_none(), "Halted: the ended VMI is removed");
    assert!(
        hv.list_owned().expect("list").is_empty(),
        "the domain is undefined"
    );
    let deadline = Instant::now() + Duration::from_millis(PROCESS_GONE_MS);
    while process_running(pid) {
        assert!(Instant::now() < deadline, "QEMU (pid {pid}) still runs");
        std::thread::sleep(Duration::from_millis(50));
    }
    let again = reconciler.run_once();
    assert!(again.changed_nothing(), "{:#?}", again.actions);
    drop(reconciler);
    drop(hv);
    drop(daemons);
}
