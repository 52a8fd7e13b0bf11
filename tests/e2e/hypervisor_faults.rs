//! The reconciler's faults as the operator audit met them with the real binary, on a libvirtd of
//! the test's own (`SessionLibvirtd`, serving the test driver over its socket, which the test
//! kills and starts again): a second server with a fresh log on the same libvirt, a libvirtd
//! that restarts, and a node file that does not exist.

use std::time::Duration;

use vmplane_hypervisor::{Hypervisor, LibvirtHypervisor};
use vmplane_tests::qemu_harness::SessionLibvirtd;
use vmplane_tests::{Cli, Server, run_cli, wait_for};

/// Passes run at least every 10 s (the reconciler's resync), so 60 s is a few of them.
const PASSES_MS: u64 = 60_000;

const VM_YAML: &str = "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: keeper, namespace: default}
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        cpu: {sockets: 1}
        memory: {guest: 64Mi}
        devices: {autoattachPodInterface: false}
";

/// Audit HIGH: a second server with a fresh `--data` removed the first server's domains ("is
/// wanted by no VM or VMI"); and after libvirtd restarted, a server listed nothing but
/// `client socket is closed` every 10 s, forever.
#[test]
fn a_second_server_leaves_the_first_ones_domains_alone_and_a_restarted_libvirtd_is_reconnected() {
    let mut daemon = SessionLibvirtd::start().expect("a session libvirtd");
    let hypervisor = format!("n1={}", daemon.test_uri());
    let data_a = tempfile::tempdir().expect("temp dir");
    let first = Server::start(data_a.path(), &["--hypervisor", &hypervisor]);
    let vmplane = Cli::new(&first);
    vmplane.apply_in("default", VM_YAML);
    let running = || {
        let (code, out, _) = vmplane.run(&["get", "vm", "keeper"]);
        (code == 0 && out.contains("Running")).then_some(())
    };
    wait_for("the first server's VM to run", PASSES_MS, running, || {
        first.stderr()
    });
    // What libvirt itself has: one vmplane domain, running.
    let libvirt = LibvirtHypervisor::open(&daemon.test_uri()).expect("a connection of ours");
    let domains = libvirt.list_owned().expect("list");
    assert_eq!(domains.len(), 1, "{domains:?}");
    let theirs = domains[0].uuid;
    assert!(domains[0].status.is_active());

    let data_b = tempfile::tempdir().expect("temp dir");
    let second = Server::start(data_b.path(), &["--hypervisor", &hypervisor]);
    let line = wait_for(
        "the second server to say it leaves the first one's domain alone",
        PASSES_MS,
        || {
            second
                .stderr()
                .lines()
                .find(|l| l.contains("another vmplane's domain"))
                .map(str::to_owned)
        },
        || second.stderr(),
    );
    assert!(line.contains("vmplane_default_keeper"), "{line}");
    // Two passes later, still there and running; the second server removed nothing.
    std::thread::sleep(Duration::from_secs(1));
    let after: Vec<_> = libvirt.list_owned().expect("list");
    assert!(
        after
            .iter()
            .any(|d| d.uuid == theirs && d.status.is_active()),
        "{after:?}\nsecond server:\n{}",
        second.stderr()
    );
    let second_log = second.stderr();
    assert!(
        !second_log.contains("remove_unwanted_domain"),
        "{second_log}"
    );
    assert_eq!(
        second_log
            .lines()
            .filter(|l| l.contains("another vmplane's domain: never touched"))
            .count(),
        1,
        "said once:\n{second_log}"
    );
    drop(second);

    // libvirtd restarts (its test driver starts over, without the domain): the first server
    // reconnects, finds its VMI's domain gone and, runStrategy Always, runs the VM again.
    daemon.restart().expect("libvirtd starts again");
    wait_for(
        "the first server to reconnect",
        PASSES_MS,
        || {
            first
                .stderr()
                .contains("reconnected to libvirt")
                .then_some(())
        },
        || first.stderr(),
    );
    wait_for(
        "the first server's VM to run again on a new domain",
        PASSES_MS,
        || {
            let owned = libvirt.list_owned().ok()?;
            owned
                .iter()
                .any(|d| d.metadata.name == "keeper" && d.status.is_active())
                .then_some(())
        },
        || first.stderr(),
    );
    wait_for("the VM to show Running", PASSES_MS, running, || {
        first.stderr()
    });
}

/// Audit LOW: a missing test-driver file printed libxml2's `I/O warning : failed to load
/// external entity` before vmplane's own error.
#[test]
fn a_missing_node_file_stops_serve_with_one_line_and_no_libxml2_noise() {
    let dir = tempfile::tempdir().expect("temp dir");
    let node = format!("n1=test://{}/missing.xml", dir.path().display());
    let data = dir.path().join("data");
    let (code, _, stderr) = run_cli(&[
        "serve",
        "--data",
        data.to_str().expect("utf-8"),
        "--listen",
        "127.0.0.1:0",
        "--hypervisor",
        &node,
    ]);
    assert_ne!(code, 0);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("vmplane: error: "), "{stderr}");
    assert!(lines[0].contains("missing.xml"), "{stderr}");
    assert!(!stderr.contains("I/O warning"), "{stderr}");
}
