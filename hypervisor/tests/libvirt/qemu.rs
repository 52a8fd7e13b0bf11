//! A real QEMU domain through a real libvirtd, driven by the reconciler.
//!
//! The harness starts `virtlogd` (unless one already serves libvirt's standard socket) and
//! `libvirtd` itself — there is no systemd here — with a private socket directory and pid
//! files, connects with `qemu:///system?socket=<dir>/libvirt-sock`, and kills what it started
//! by PID at the end. Prerequisites: `scripts/install-qemu.sh` (root).
//!
//! If the daemon or the emulator cannot run here, the test **fails** with the reason; set
//! `VMPLANE_SKIP_QEMU=1` to skip it instead (it then prints a SKIPPED line).

use std::sync::Arc;
use std::time::{Duration, Instant};

use vmplane_core::VmCommand;
use vmplane_core::event::VmiPhase;
use vmplane_hypervisor::mapping::DomainDefaults;
use vmplane_hypervisor::{
    ControlPlane, Hypervisor, LibvirtHypervisor, Nodes, Reconciler, ReconcilerOptions, VirtType,
};

use crate::log_control_plane::LogControlPlane;

use vmplane_hypervisor::qemu_harness::{Daemons, PROCESS_GONE_MS, process_running};

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
    // KubeVirt's default machine type, which the VMI says it has (`spec.domain.machine.type`).
    let machine = args
        .windows(2)
        .find(|w| w[0] == "-machine")
        .map(|w| w[1].clone())
        .unwrap_or_default();
    assert!(machine.starts_with("pc-q35-"), "{machine}");
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
    // Only this test's domain: the machine's libvirt may keep other vmplanes' domains (an
    // interrupted end-to-end run leaves its own), which this log never touches.
    let left: Vec<_> = hv
        .list_owned()
        .expect("list")
        .into_iter()
        .filter(|d| d.uuid == fw)
        .collect();
    assert!(left.is_empty(), "the domain is undefined: {left:#?}");
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
