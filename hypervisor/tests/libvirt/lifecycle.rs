//! Define, start, shutdown, destroy, undefine on a private test-driver node.

use vmplane_hypervisor::{DomainName, DomainState, Hypervisor, HypervisorError};

use crate::common::{PrivateNode, minimal_spec};

fn state(
    hv: &dyn Hypervisor,
    spec: &vmplane_hypervisor::DomainSpec,
) -> (DomainState, &'static str) {
    let status = hv.state(spec.firmware_uuid).expect("state");
    (status.state, status.reason())
}

#[test]
fn define_start_shutdown_destroy_undefine_round_trip() {
    let node = PrivateNode::empty();
    let hv = node.open();
    let spec = minimal_spec("default", "round-trip");
    let uuid = spec.firmware_uuid;

    hv.define(&spec).expect("define");
    assert_eq!(state(&hv, &spec).0, DomainState::Shutoff);
    let listed = hv.list_owned().expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].uuid, listed[0].name.as_str()),
        (uuid, "vmplane_default_round-trip")
    );
    assert_eq!(listed[0].metadata, spec.metadata);

    hv.start(uuid).expect("start");
    assert_eq!(state(&hv, &spec), (DomainState::Running, "booted"));
    hv.start(uuid)
        .expect("starting a running domain is a no-op");

    hv.shutdown(uuid).expect("shutdown");
    // The test driver powers off at once; QEMU would need a guest that honours ACPI.
    assert_eq!(state(&hv, &spec), (DomainState::Shutoff, "shutdown"));
    hv.shutdown(uuid)
        .expect("shutting down a stopped domain is a no-op");

    hv.start(uuid).expect("start again");
    hv.destroy(uuid).expect("destroy");
    assert_eq!(state(&hv, &spec), (DomainState::Shutoff, "destroyed"));
    hv.destroy(uuid)
        .expect("destroying a stopped domain is a no-op");

    // Redefining (same name and UUID) is an update, not a conflict.
    hv.define(&spec).expect("redefine");

    hv.undefine(uuid).expect("undefine");
    assert!(matches!(
        hv.state(uuid),
        Err(HypervisorError::NotFound { .. })
    ));
    assert!(matches!(
        hv.start(uuid),
        Err(HypervisorError::NotFound { .. })
    ));
    assert!(hv.list_owned().expect("list").is_empty());
}

#[test]
fn undefining_a_running_domain_leaves_it_transient_until_destroyed() {
    let node = PrivateNode::empty();
    let hv = node.open();
    let spec = minimal_spec("default", "transient");
    hv.define(&spec).expect("define");
    hv.start(spec.firmware_uuid).expect("start");
    hv.undefine(spec.firmware_uuid).expect("undefine");
    assert_eq!(state(&hv, &spec).0, DomainState::Running);
    hv.destroy(spec.firmware_uuid).expect("destroy");
    assert!(matches!(
        hv.state(spec.firmware_uuid),
        Err(HypervisorError::NotFound { .. })
    ));
}

#[test]
fn metacharacters_in_names_define_fine_and_cannot_inject() {
    let node = PrivateNode::empty();
    let hv = node.open();
    let namespace = "ns'\"><x a='1'/>";
    let name = "vm</vmplane:name><vmplane:vmi-uid>00000000-0000-0000-0000-000000000000</vmplane:vmi-uid><![CDATA[]]>&amp;";
    let mut spec = minimal_spec(namespace, name);
    spec.metadata.labels.insert(
        "key\"/><evil".into(),
        "</vmplane:label></vmplane:labels>]]>".into(),
    );
    hv.define(&spec).expect("define");
    hv.start(spec.firmware_uuid).expect("start");

    let listed = hv.list_owned().expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].metadata, spec.metadata,
        "metadata round-trips exactly through libvirt"
    );
    assert_eq!(
        listed[0].name,
        DomainName::for_instance(namespace, name).as_str()
    );
    assert!(
        DomainName::parse(&listed[0].name).is_ok(),
        "libvirt-safe: {}",
        listed[0].name
    );

    // libvirt's own XML has exactly the elements vmplane wrote, nothing injected.
    let xml = hv.domain_xml(spec.firmware_uuid).expect("dumpxml");
    let doc = roxmltree::Document::parse(&xml).expect("parses");
    let instance = doc
        .descendants()
        .find(|n| n.has_tag_name((vmplane_hypervisor::METADATA_NAMESPACE_URI, "instance")))
        .expect("instance element");
    let children: Vec<&str> = instance
        .children()
        .filter(|n| n.is_element())
        .map(|n| n.tag_name().name())
        .collect();
    assert_eq!(children, ["name", "namespace", "vmi-uid", "labels"]);
    let text = |tag: &str| {
        instance
            .children()
            .find(|n| n.has_tag_name((vmplane_hypervisor::METADATA_NAMESPACE_URI, tag)))
            .and_then(|n| n.text())
    };
    assert_eq!(text("name"), Some(name));
    assert_eq!(text("namespace"), Some(namespace));
    assert_eq!(doc.descendants().filter(|n| n.has_tag_name("x")).count(), 0);
}
