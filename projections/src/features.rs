//! Which cluster features a VM's spec requests (semantics.md §6), for the "which VMs use
//! feature X" index — core's rule ([`vmplane_core::features`]), reduced to gate names.

use vmplane_core::VmState;
use vmplane_core::features::vm_features_requested;
use vmplane_core::types::VirtualMachine;

/// KubeVirt feature-gate names the VM requests, sorted and unique.
#[must_use]
pub fn features_requested(vm: &VirtualMachine) -> Vec<String> {
    let mut names: Vec<String> = vm_features_requested(vm)
        .into_iter()
        .map(|u| u.feature.to_owned())
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// What a VM state requests: its spec expanded with the captured instancetype and preference
/// (what its next VMI would ask for), or the stored spec if expansion fails.
#[must_use]
pub fn state_features(state: &VmState) -> Vec<String> {
    match state.expand() {
        Ok(vm) => features_requested(&vm),
        Err(_) => state
            .vm
            .as_deref()
            .map(features_requested)
            .unwrap_or_default(),
    }
}

/// What a standalone VMI requests, by KubeVirt gate name, sorted and unique.
#[must_use]
pub fn vmi_state_features(state: &vmplane_core::VmiState) -> Vec<String> {
    let mut names: Vec<String> = state
        .vmi
        .as_ref()
        .map(vmplane_core::features::vmi_features_requested)
        .unwrap_or_default()
        .into_iter()
        .map(|u| u.feature.to_owned())
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}
