//! Lifecycle events through libvirt's event loop.

use std::time::Duration;

use vmplane_hypervisor::{Hypervisor, LifecycleEventKind};

use crate::common::{PrivateNode, minimal_spec, wait_for};

/// Generous for a loaded 2-core machine; events normally arrive in well under a millisecond.
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

#[test]
fn lifecycle_events_arrive_for_define_start_and_destroy() {
    let node = PrivateNode::empty();
    let hv = node.open();
    let events = hv.subscribe().expect("subscribe");
    let spec = minimal_spec("default", "events");
    let uuid = spec.firmware_uuid;

    hv.define(&spec).expect("define");
    let (ok, seen) = wait_for(&events, EVENT_TIMEOUT, |e| {
        e.uuid == uuid && e.kind == LifecycleEventKind::Defined
    });
    assert!(ok, "no Defined event; saw {seen:?}");

    hv.start(uuid).expect("start");
    let (ok, seen) = wait_for(&events, EVENT_TIMEOUT, |e| {
        e.uuid == uuid && e.kind == LifecycleEventKind::Started
    });
    assert!(ok, "no Started event; saw {seen:?}");
    let started = seen.last().expect("the matching event");
    assert_eq!(
        (started.name.as_str(), started.detail),
        (spec.name.as_str(), 0),
        "booted"
    );

    hv.destroy(uuid).expect("destroy");
    let (ok, seen) = wait_for(&events, EVENT_TIMEOUT, |e| {
        e.uuid == uuid && e.kind == LifecycleEventKind::Stopped
    });
    assert!(ok, "no Stopped event; saw {seen:?}");
    assert_eq!(seen.last().map(|e| e.detail), Some(1), "destroyed");

    hv.undefine(uuid).expect("undefine");
    let (ok, seen) = wait_for(&events, EVENT_TIMEOUT, |e| {
        e.uuid == uuid && e.kind == LifecycleEventKind::Undefined
    });
    assert!(ok, "no Undefined event; saw {seen:?}");
}

#[test]
fn every_subscriber_gets_the_events_and_streams_end_with_the_connection() {
    let node = PrivateNode::empty();
    let hv = node.open();
    let first = hv.subscribe().expect("subscribe");
    let second = hv.subscribe().expect("subscribe");
    let spec = minimal_spec("default", "fanout");
    hv.define(&spec).expect("define");
    for rx in [&first, &second] {
        let (ok, seen) = wait_for(rx, EVENT_TIMEOUT, |e| e.uuid == spec.firmware_uuid);
        assert!(ok, "saw {seen:?}");
    }
    // Another private node's events do not leak in.
    let other = PrivateNode::empty();
    let other_hv = other.open();
    let other_spec = minimal_spec("default", "elsewhere");
    other_hv.define(&other_spec).expect("define elsewhere");
    let (leaked, _) = wait_for(&first, Duration::from_millis(200), |e| {
        e.uuid == other_spec.firmware_uuid
    });
    assert!(!leaked);

    drop(hv);
    assert!(matches!(
        first.recv_timeout(EVENT_TIMEOUT),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected)
    ));
}
