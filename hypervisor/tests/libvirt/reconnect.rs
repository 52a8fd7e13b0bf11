//! A node whose libvirtd restarts: the connection is reopened on the next call after the
//! back-off, and lifecycle events keep coming on the same subscription. A real libvirtd of the
//! test's own (`SessionLibvirtd`, serving the test driver), killed and started again.

use std::time::{Duration, Instant};

use vmplane_hypervisor::qemu_harness::SessionLibvirtd;
use vmplane_hypervisor::{Hypervisor, HypervisorError, LibvirtHypervisor, LifecycleEventKind};

use crate::common::{minimal_spec, wait_for};

/// Polls `check` every 50 ms until it returns `Some`, at most `timeout`.
fn poll<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(found) = check() {
            return Some(found);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_node_whose_libvirtd_restarts_is_reconnected_and_its_events_keep_coming() {
    let mut daemon = SessionLibvirtd::start().expect("a session libvirtd");
    let hv = LibvirtHypervisor::open(&daemon.test_uri()).expect("open the node");
    let events = hv.subscribe().expect("lifecycle events");
    let before = minimal_spec("default", "before");
    hv.define(&before).expect("define");
    assert_eq!(hv.list_owned().expect("list").len(), 1);

    daemon.kill();
    let failed = poll(Duration::from_secs(10), || hv.list_owned().err())
        .expect("listing fails once libvirtd is gone");
    assert!(
        matches!(
            failed,
            HypervisorError::Node { .. }
                | HypervisorError::Connect { .. }
                | HypervisorError::Reconnecting { .. }
        ),
        "{failed:?}"
    );

    daemon.restart().expect("libvirtd starts again");
    // The back-off after failed attempts is at most a few seconds here.
    let listed = poll(Duration::from_secs(20), || hv.list_owned().ok())
        .expect("the node answers again after libvirtd restarted");
    // The test driver started over: `before` went with the old daemon.
    assert!(listed.is_empty(), "{listed:?}");

    let after = minimal_spec("default", "after");
    hv.define(&after).expect("define on the new connection");
    let (seen, all) = wait_for(&events, Duration::from_secs(10), |e| {
        e.uuid == after.firmware_uuid && e.kind == LifecycleEventKind::Defined
    });
    assert!(
        seen,
        "no Defined event of {} on the old subscription: {all:?}",
        after.name
    );
    hv.undefine(after.firmware_uuid).expect("undefine");
}
