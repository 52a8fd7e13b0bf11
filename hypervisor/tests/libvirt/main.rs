//! vmplane-hypervisor against real libvirt (the built-in test driver) and real
//! `virt-xml-validate`. One binary, one module per area.
//!
//! Every test opens its own private test-driver node (`test://<temp dir>/node.xml`), except
//! `ownership`, which needs the shared `test:///default` for its `test` domain, and `qemu`,
//! which starts its own libvirtd for a real QEMU guest (`scripts/install-qemu.sh` first; it
//! fails loudly when QEMU cannot run here unless `VMPLANE_SKIP_QEMU=1`). `reconciler` runs the
//! reconciler against the real log and `core` (`log_control_plane`).

mod common;
mod events;
mod first_validation;
mod lifecycle;
mod log_control_plane;
mod ownership;
mod placement;
mod qemu;
mod quiet;
mod reconciler;
mod reconnect;
mod xml_props;
mod xml_validate;
