//! vmplane-hypervisor against real libvirt (the built-in test driver) and real
//! `virt-xml-validate`. One binary, one module per area.
//!
//! Every test opens its own private test-driver node (`test://<temp dir>/node.xml`), except
//! `ownership`, which needs the shared `test:///default` for its `test` domain.

mod common;
mod events;
mod lifecycle;
mod ownership;
mod placement;
mod xml_props;
mod xml_validate;
