//! A real QEMU guest through a real libvirtd, driven by `vmplane serve --hypervisor` and the
//! CLI: apply, start, the firmware UUID on QEMU's command line, stop (the guest has no OS, so
//! the grace period ends in destroy).
//!
//! If the daemon or the emulator cannot run here, the test **fails** with the reason; set
//! `VMPLANE_SKIP_QEMU=1` to skip it instead (it then prints a SKIPPED line).

use std::time::{Duration, Instant};

use vmplane_tests::qemu_harness::{Daemons, PROCESS_GONE_MS, process_running, processes_with_uuid};
use vmplane_tests::{Cli, Server, wait_for};

/// How long the reconciler may take to bring the VMI to Running, and to stop it (the grace
/// period is 2 s).
const RUNNING_MS: u64 = 60_000;
const STOPPED_MS: u64 = 30_000;

const VM_YAML: &str = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: qemu-e2e, namespace: default}
spec:
  runStrategy: Manual
  template:
    spec:
      terminationGracePeriodSeconds: 2
      domain:
        cpu: {sockets: 1}
        memory: {guest: 64Mi}
        devices: {autoattachPodInterface: false}
"#;

#[test]
fn a_vm_started_with_the_cli_runs_on_real_qemu_with_its_firmware_uuid_and_stops() {
    if std::env::var("VMPLANE_SKIP_QEMU").is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED: real-QEMU end-to-end test (VMPLANE_SKIP_QEMU=1)");
        return;
    }
    let begun = Instant::now();
    let daemons = Daemons::start().unwrap_or_else(|reason| {
        panic!(
            "REAL QEMU UNAVAILABLE: {reason}\n\
             Run `sudo scripts/install-qemu.sh`, or set VMPLANE_SKIP_QEMU=1 to skip this test."
        )
    });
    let hypervisor = format!("qemu1={}", daemons.socket_uri());
    // This test's domain left by an interrupted earlier run (qemu:///system keeps domain
    // definitions on the machine): a server with a fresh log never touches a domain whose VMI
    // it did not record, and the name would be taken, so the test removes its own leftover.
    {
        use vmplane_hypervisor::{Hypervisor, LibvirtHypervisor};
        let libvirt = LibvirtHypervisor::open(&daemons.socket_uri()).expect("connect to libvirtd");
        for leftover in libvirt
            .list_owned()
            .expect("list domains")
            .into_iter()
            .filter(|d| d.name == "vmplane_default_qemu-e2e")
        {
            let _ = libvirt.destroy(leftover.uuid);
            libvirt
                .undefine(leftover.uuid)
                .expect("undefine a leftover of an earlier run");
        }
    }
    let data = tempfile::tempdir().expect("temp dir");
    // Declared after `daemons`: the server (and its reconciler) stops before libvirtd does.
    let server = Server::start(data.path(), &["--hypervisor", &hypervisor]);
    let vmplane = Cli::new(&server);
    let context = || {
        format!(
            "server stderr:\n{}\nlibvirtd errors:\n{}",
            server.stderr(),
            daemons.log()
        )
    };

    let dir = tempfile::tempdir().expect("temp dir");
    let manifest = dir.path().join("vm.yaml");
    std::fs::write(&manifest, VM_YAML).expect("write the manifest");
    vmplane.ok(&["apply", "-f", manifest.to_str().expect("utf-8")]);
    let vm: serde_json::Value =
        serde_json::from_str(&vmplane.ok(&["get", "vm", "qemu-e2e", "-o", "json"])).expect("json");
    let fw = vm["spec"]["template"]["spec"]["domain"]["firmware"]["uuid"]
        .as_str()
        .unwrap_or_else(|| panic!("a firmware UUID in {vm:#}"))
        .to_owned();

    vmplane.ok(&["start", "qemu-e2e"]);
    let started = Instant::now();
    wait_for(
        "`get vmi qemu-e2e` to show Running",
        RUNNING_MS,
        || {
            let (code, out, _) = vmplane.run(&["get", "vmi", "qemu-e2e"]);
            (code == 0 && out.contains("Running")).then_some(())
        },
        context,
    );
    eprintln!("start to Running on real QEMU: {:?}", started.elapsed());

    // The QEMU process carries the firmware UUID as its UUID and SMBIOS system UUID.
    let (pid, args) = wait_for(
        "a QEMU process with `-uuid <firmware uuid>`",
        PROCESS_GONE_MS,
        || processes_with_uuid(&fw).into_iter().next(),
        context,
    );
    assert!(
        args.first().is_some_and(|a| a.contains("qemu-system")),
        "{args:?}"
    );
    let smbios = args
        .windows(2)
        .find(|w| w[0] == "-smbios" && w[1].starts_with("type=1"))
        .map(|w| w[1].clone())
        .unwrap_or_default();
    assert!(
        smbios.split(',').any(|kv| kv == format!("uuid={fw}")),
        "SMBIOS type 1 without uuid={fw}: {args:?}"
    );

    // A stop: the guest (no OS) ignores the ACPI shutdown, so the grace period ends in destroy.
    vmplane.ok(&["stop", "qemu-e2e"]);
    let stopping = Instant::now();
    wait_for(
        "QEMU to exit",
        STOPPED_MS,
        || (!process_running(pid)).then_some(()),
        context,
    );
    let gone = stopping.elapsed();
    assert!(
        gone >= Duration::from_millis(1_500),
        "QEMU went after {gone:?}, before the 2 s grace period ended"
    );
    wait_for(
        "`get vm qemu-e2e` to show Stopped",
        STOPPED_MS,
        || {
            let (code, out, _) = vmplane.run(&["get", "vm", "qemu-e2e"]);
            (code == 0 && out.contains("Stopped")).then_some(())
        },
        context,
    );
    eprintln!(
        "stop to gone on real QEMU: {gone:?}; whole test: {:?}",
        begun.elapsed()
    );
    drop(server);
    drop(daemons);
}
