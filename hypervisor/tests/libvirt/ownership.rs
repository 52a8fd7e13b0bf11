//! A domain without vmplane's metadata is never listed or touched: the `test` domain that
//! libvirt's default test driver starts with.
//!
//! This is the only module that opens `test:///default`, whose state every connection of the
//! process shares; keep it that way, so tests running in parallel cannot see each other.

use virt::connect::Connect;
use vmplane_hypervisor::{DomainName, Hypervisor, HypervisorError, LibvirtHypervisor};

use crate::common::minimal_spec;

const DEFAULT_URI: &str = "test:///default";

#[test]
fn the_default_test_domain_is_never_listed_nor_touched() {
    let hv = LibvirtHypervisor::open(DEFAULT_URI).expect("open test:///default");
    // A raw connection of our own, to look behind the adapter.
    let raw = Connect::open(Some(DEFAULT_URI)).expect("raw connection");
    let test = raw
        .lookup_domain_by_name("test")
        .expect("the fixture's `test` domain");
    let test_uuid = test.uuid().expect("uuid");
    let running = |dom: &virt::domain::Domain| dom.is_active().expect("is_active");
    assert!(running(&test));

    // Ours is listed, `test` is not.
    let spec = minimal_spec("default", "mine");
    hv.define(&spec).expect("define");
    let listed = hv.list_owned().expect("list");
    assert_eq!(
        listed.iter().map(|d| d.uuid).collect::<Vec<_>>(),
        [spec.firmware_uuid]
    );

    // Every call addressed at `test` is refused, and `test` is unchanged.
    let refused = |result: Result<(), HypervisorError>, op: &str| match result {
        Err(HypervisorError::NotOwned { domain, .. }) => {
            assert_eq!(
                (domain.uuid, domain.name.as_deref()),
                (test_uuid, Some("test")),
                "{op}"
            );
        }
        other => panic!("{op} of `test` must be refused as NotOwned, got {other:?}"),
    };
    refused(hv.destroy(test_uuid), "destroy");
    refused(hv.shutdown(test_uuid), "shutdown");
    refused(hv.undefine(test_uuid), "undefine");
    refused(hv.start(test_uuid), "start");
    refused(hv.state(test_uuid).map(drop), "state");
    refused(hv.domain_xml(test_uuid).map(drop), "dumpxml");
    // Defining a vmplane domain over `test` (same UUID) is refused before libvirt sees it.
    let mut takeover = minimal_spec("default", "takeover");
    takeover.firmware_uuid = test_uuid;
    refused(hv.define(&takeover), "define over");
    // Same name, other UUID: libvirt itself refuses, and `test` keeps its definition.
    let mut same_name = minimal_spec("default", "same-name");
    same_name.name = DomainName::parse("test").expect("a valid name");
    assert!(matches!(
        hv.define(&same_name),
        Err(HypervisorError::Domain {
            operation: "define",
            ..
        })
    ));

    let test = raw
        .lookup_domain_by_name("test")
        .expect("`test` still exists");
    assert_eq!(test.uuid().expect("uuid"), test_uuid);
    assert!(running(&test));
    assert!(!test.xml_desc(0).expect("xml").contains("vmplane"));

    // Clean up our own domain; `test` still runs.
    hv.undefine(spec.firmware_uuid).expect("undefine ours");
    assert!(hv.list_owned().expect("list").is_empty());
    assert!(running(&raw.lookup_domain_by_name("test").expect("test")));
}
