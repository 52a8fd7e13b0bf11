//! `wait`: scripts wait for a condition, a field's value, a creation or a deletion, woken by the
//! object's events, and get a timeout that says what was last seen.

use std::time::{Duration, Instant};

use vmplane_tests::{Cli, repo_root};

use crate::shared_server;

#[test]
fn wait_returns_once_the_object_is_what_was_asked_and_times_out_saying_what_it_is() {
    let vmplane = Cli::new(shared_server());
    let ns = "wait-vm";
    let vm = repo_root().join("examples/vm.yaml");
    vmplane.ok(&["apply", "-f", vm.to_str().expect("utf-8"), "-n", ns]);
    // Already true: at once.
    assert_eq!(
        vmplane.ok(&["wait", "vm", "demo", "-n", ns, "--for", "create"]),
        "virtualmachine/demo condition met\n"
    );
    // Not before the timeout: one line saying what was waited for and what it was.
    let started = Instant::now();
    let line = vmplane.fails(&[
        "wait",
        "vm",
        "demo",
        "-n",
        ns,
        "--for",
        "jsonpath={.status.printableStatus}=Running",
        "--timeout",
        "1s",
    ]);
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(
        line.contains("timed out after 1s waiting for {.status.printableStatus}=Running of vm demo: {.status.printableStatus} is Stopped"),
        "{line}"
    );
    // Started while a wait is under way: the wait sees the VMI become Ready.
    let waiting = vmplane.spawn(&[
        "wait",
        "vmi",
        "demo",
        "-n",
        ns,
        "--for",
        "condition=Ready",
        "--timeout",
        "60s",
    ]);
    std::thread::sleep(Duration::from_millis(300));
    vmplane.ok(&["start", "demo", "-n", ns]);
    let out = waiting.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "virtualmachineinstance/demo condition met\n"
    );
    vmplane.ok(&[
        "wait",
        "vm",
        "demo",
        "-n",
        ns,
        "--for",
        "jsonpath={.status.printableStatus}=Running",
        "--timeout",
        "30s",
    ]);
    // Deleted while a wait is under way.
    let waiting = vmplane.spawn(&[
        "wait",
        "vm",
        "demo",
        "-n",
        ns,
        "--for",
        "delete",
        "--timeout",
        "60s",
    ]);
    std::thread::sleep(Duration::from_millis(300));
    vmplane.ok(&["delete", "vm", "demo", "-n", ns]);
    let out = waiting.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A malformed --for is refused before anything is sent.
    let (code, _, err) = vmplane.run(&["wait", "vm", "demo", "-n", ns, "--for", "ready"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("condition=TYPE"), "{err}");
}
