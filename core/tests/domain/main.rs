//! core's tests, one binary with a module per area (given events / when command / then events
//! or a specific rejection, through the helpers in `support`).

mod admission;
mod deletion;
mod events;
mod features;
mod firmware_uuid;
mod instancetypes;
mod lifecycle;
mod limits;
mod props;
mod snapshots;
mod support;
mod testdata;
mod vm_aggregate;
mod vmi_and_objects;
