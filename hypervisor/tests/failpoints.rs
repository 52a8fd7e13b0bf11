//! Fault injection in the libvirt adapter (`fail`, feature `failpoints`), against libvirt's
//! test driver on a private node:
//!
//!   cargo test -p vmplane-hypervisor --features failpoints --test failpoints
//!
//! Points: `hypervisor::libvirt::define` and `hypervisor::libvirt::start` fail before the libvirt
//! call (nothing happens); `hypervisor::libvirt::after_define` and `hypervisor::libvirt::after_start`
//! fail after libvirt did it (the answer is lost). Each is an error to the caller; the retry the
//! reconciler makes on its next pass converges to exactly one domain, running, and never a
//! second one.
//!
//! fail's registry is global, so every test holds [`serial`]; this binary holds no other tests.

#[path = "libvirt/common.rs"]
#[allow(dead_code)]
mod common;

use std::sync::{Mutex, MutexGuard};

use common::{PrivateNode, minimal_spec};
use fail::FailScenario;
use vmplane_hypervisor::{Hypervisor, HypervisorError, LibvirtHypervisor};

static SERIAL: Mutex<()> = Mutex::new(());

struct Serial {
    _scenario: FailScenario<'static>,
    _guard: MutexGuard<'static, ()>,
}

fn serial() -> Serial {
    let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    Serial {
        _scenario: FailScenario::setup(),
        _guard: guard,
    }
}

fn owned(hv: &LibvirtHypervisor) -> Vec<uuid::Uuid> {
    hv.list_owned()
        .expect("list")
        .into_iter()
        .map(|d| d.uuid)
        .collect()
}

fn injected(result: Result<(), HypervisorError>, operation: &str) {
    match result {
        Err(HypervisorError::Domain { operation: op, .. }) if op == operation => {}
        other => panic!("expected an injected {operation} failure, got {other:?}"),
    }
}

#[test]
fn a_define_failing_before_or_after_libvirt_converges_on_retry() {
    let _serial = serial();
    let node = PrivateNode::empty();
    let hv = node.open();

    // Before the call: an error, and nothing is defined.
    let spec = minimal_spec("team-a", "before");
    fail::cfg("hypervisor::libvirt::define", "return").expect("configure");
    injected(hv.define(&spec), "define");
    fail::remove("hypervisor::libvirt::define");
    assert!(owned(&hv).is_empty(), "nothing defined");
    hv.define(&spec).expect("retry");
    assert_eq!(owned(&hv), [spec.firmware_uuid]);

    // After the call: an error although libvirt defined it; the retry redefines the same
    // domain (same UUID), never a second one.
    let spec2 = minimal_spec("team-a", "after");
    fail::cfg("hypervisor::libvirt::after_define", "return").expect("configure");
    injected(hv.define(&spec2), "define");
    fail::remove("hypervisor::libvirt::after_define");
    assert!(
        owned(&hv).contains(&spec2.firmware_uuid),
        "defined all the same"
    );
    hv.define(&spec2).expect("retry");
    let mut domains = owned(&hv);
    domains.sort();
    let mut expected = vec![spec.firmware_uuid, spec2.firmware_uuid];
    expected.sort();
    assert_eq!(domains, expected, "one domain each");
}

#[test]
fn a_start_failing_before_or_after_libvirt_converges_on_retry() {
    let _serial = serial();
    let node = PrivateNode::empty();
    let hv = node.open();
    let spec = minimal_spec("team-a", "before");
    hv.define(&spec).expect("define");
    let uuid = spec.firmware_uuid;

    fail::cfg("hypervisor::libvirt::start", "return").expect("configure");
    injected(hv.start(uuid), "start");
    fail::remove("hypervisor::libvirt::start");
    assert!(!hv.state(uuid).expect("state").is_active(), "not started");
    hv.start(uuid).expect("retry");
    assert!(hv.state(uuid).expect("state").is_active());

    let spec2 = minimal_spec("team-a", "after");
    hv.define(&spec2).expect("define");
    fail::cfg("hypervisor::libvirt::after_start", "return").expect("configure");
    injected(hv.start(spec2.firmware_uuid), "start");
    fail::remove("hypervisor::libvirt::after_start");
    assert!(
        hv.state(spec2.firmware_uuid).expect("state").is_active(),
        "started all the same"
    );
    hv.start(spec2.firmware_uuid)
        .expect("the retry finds it running");
    assert!(hv.state(spec2.firmware_uuid).expect("state").is_active());
    assert_eq!(owned(&hv).len(), 2);
}
