//! Instancetypes and preferences: conflicts, preference requirements, application and
//! `expand` (kubevirt.md §2, KubeVirt's pkg/instancetype).
//!
//! Everything here is a pure function of a VM and the *captured* instancetype/preference specs
//! (the VM's stream holds them, see `InstancetypeRevisionCaptured`), so deleting or changing an
//! instancetype later never changes what a VM expands to.

use serde_json::{Value, json};

use crate::error::{Category, Cause, Causes, Rejection, codes};
use crate::quantity::Quantity;
use crate::types::{
    InstancetypeSpec, JsonMap, Kind, Matcher, PreferenceSpec, VirtualMachine, VmiSpec,
};

/// Prefix of every preference requirement message (KubeVirt's vms-admitter).
pub const REQUIREMENTS_PREFIX: &str = "failure checking preference requirements: ";

/// The kind a matcher points at. Case-insensitive, singular or plural; the default is the
/// cluster kind (KubeVirt's `strings.ToLower(kind)` switch).
pub fn matcher_kind(m: &Matcher, is_instancetype: bool) -> Result<Kind, String> {
    let k = m.kind.as_deref().unwrap_or("").to_ascii_lowercase();
    let r = if is_instancetype {
        match k.as_str() {
            "" | "virtualmachineclusterinstancetype" | "virtualmachineclusterinstancetypes" => {
                Some(Kind::VirtualMachineClusterInstancetype)
            }
            "virtualmachineinstancetype" | "virtualmachineinstancetypes" => {
                Some(Kind::VirtualMachineInstancetype)
            }
            _ => None,
        }
    } else {
        match k.as_str() {
            "" | "virtualmachineclusterpreference" | "virtualmachineclusterpreferences" => {
                Some(Kind::VirtualMachineClusterPreference)
            }
            "virtualmachinepreference" | "virtualmachinepreferences" => {
                Some(Kind::VirtualMachinePreference)
            }
            _ => None,
        }
    };
    r.ok_or_else(|| {
        let what = if is_instancetype {
            "InstancetypeMatcher"
        } else {
            "PreferenceMatcher"
        };
        format!(
            "got unexpected kind in {what}: {}",
            m.kind.as_deref().unwrap_or("")
        )
    })
}

/// What a VM references: `(kind, name)` of its instancetype and preference, if any.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct References {
    /// The instancetype reference.
    pub instancetype: Option<(Kind, String)>,
    /// The preference reference.
    pub preference: Option<(Kind, String)>,
}

/// The references of a VM (ignoring malformed matchers, which validation reports).
pub fn references(vm: &VirtualMachine) -> References {
    let get = |m: &Option<Matcher>, it: bool| {
        let m = m.as_ref()?;
        Some((matcher_kind(m, it).ok()?, m.name.clone()?))
    };
    References {
        instancetype: get(&vm.spec.instancetype, true),
        preference: get(&vm.spec.preference, false),
    }
}

/// A preferred CPU topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// vCPUs as sockets (default).
    Sockets,
    /// vCPUs as cores.
    Cores,
    /// vCPUs as threads.
    Threads,
    /// Spread across sockets/cores/threads by a ratio.
    Spread,
    /// No preference (treated like sockets for placement, checked as the total).
    Any,
}

impl Topology {
    /// Parses `sockets|cores|threads|spread|any` and the deprecated `prefer*` forms.
    pub fn parse(s: &str) -> Option<Topology> {
        Some(match s {
            "sockets" | "preferSockets" => Topology::Sockets,
            "cores" | "preferCores" => Topology::Cores,
            "threads" | "preferThreads" => Topology::Threads,
            "spread" | "preferSpread" => Topology::Spread,
            "any" | "preferAny" => Topology::Any,
            _ => return None,
        })
    }

    fn of(pref: Option<&PreferenceSpec>) -> Topology {
        pref.and_then(|p| p.cpu.as_ref())
            .and_then(|c| c.preferred_cpu_topology.as_deref())
            .and_then(Topology::parse)
            .unwrap_or(Topology::Sockets)
    }

    fn word(self) -> &'static str {
        match self {
            Topology::Sockets => "sockets",
            Topology::Cores => "cores",
            Topology::Threads => "threads",
            Topology::Spread => "spread",
            Topology::Any => "any",
        }
    }
}

/// `(sockets, cores, threads)` for `vcpus` under the preference's topology.
pub fn cpu_topology(vcpus: u32, pref: Option<&PreferenceSpec>) -> Result<(u32, u32, u32), String> {
    Ok(match Topology::of(pref) {
        Topology::Sockets | Topology::Any => (vcpus, 1, 1),
        Topology::Cores => (1, vcpus, 1),
        Topology::Threads => (1, 1, vcpus),
        Topology::Spread => {
            let cpu = pref.and_then(|p| p.cpu.as_ref());
            let opts = cpu.and_then(|c| c.spread_options.as_ref());
            let ratio = opts
                .and_then(|o| o.ratio)
                .or_else(|| pref.and_then(|p| p.prefer_spread_socket_to_core_ratio))
                .unwrap_or(2)
                .max(1);
            let across = opts
                .and_then(|o| o.across.as_deref())
                .unwrap_or("SocketsCores");
            let divisor = if across == "SocketsCoresThreads" {
                ratio * 2
            } else {
                ratio
            };
            if !vcpus.is_multiple_of(divisor) {
                return Err(format!(
                    "{vcpus} vCPUs provided by the instance type are not divisible by the Spec.PreferSpreadSocketToCoreRatio or Spec.CPU.PreferredCPUTopology.SpreadOptions.Ratio of {ratio} provided by the preference"
                ));
            }
            match across {
                "CoresThreads" => (1, vcpus / ratio, ratio),
                "SocketsCoresThreads" => (vcpus / divisor, ratio, 2),
                _ => (vcpus / ratio, ratio, 1),
            }
        }
    })
}

const T: &str = "spec.template.spec.";

/// The VM fields that conflict with the instancetype (KubeVirt's pkg/instancetype/apply).
pub fn conflicts(vm: &VirtualMachine, it: &InstancetypeSpec) -> Vec<String> {
    let mut out = Vec::new();
    let Some(s) = vm.vmi_spec() else { return out };
    let d = &s.domain;
    let mut add = |p: &str| out.push(format!("{T}{p}"));
    if let Some(r) = &d.resources {
        let has = |l: &Option<JsonMap>, k: &str| l.as_ref().is_some_and(|m| m.contains_key(k));
        if has(&r.requests, "cpu") {
            add("domain.resources.requests.cpu");
        }
        if has(&r.limits, "cpu") {
            add("domain.resources.limits.cpu");
        }
        if has(&r.requests, "memory") {
            add("domain.resources.requests.memory");
        }
        if has(&r.limits, "memory") {
            add("domain.resources.limits.memory");
        }
    }
    if let Some(cpu) = &d.cpu {
        if cpu.sockets.is_some_and(|v| v != 0) {
            add("domain.cpu.sockets");
        }
        if cpu.cores.is_some_and(|v| v != 0) {
            add("domain.cpu.cores");
        }
        if cpu.threads.is_some_and(|v| v != 0) {
            add("domain.cpu.threads");
        }
        if cpu.model.is_some() && it.cpu.model.is_some() {
            add("domain.cpu.model");
        }
        if cpu.dedicated_cpu_placement.is_some() && it.cpu.dedicated_cpu_placement.is_some() {
            add("domain.cpu.dedicatedCpuPlacement");
        }
        if cpu.isolate_emulator_thread.is_some() && it.cpu.isolate_emulator_thread.is_some() {
            add("domain.cpu.isolateEmulatorThread");
        }
        if cpu.numa.is_some() && it.cpu.numa.is_some() {
            add("domain.cpu.numa");
        }
        if cpu.realtime.is_some() && it.cpu.realtime.is_some() {
            add("domain.cpu.realtime");
        }
    }
    if let Some(m) = &d.memory {
        if m.guest.is_some() {
            add("domain.memory.guest");
        }
        if m.hugepages.is_some() && it.memory.hugepages.is_some() {
            add("domain.memory.hugepages");
        }
        if m.max_guest.is_some() && it.memory.max_guest.is_some() {
            add("domain.memory.maxGuest");
        }
    }
    if s.node_selector.is_some() && it.node_selector.is_some() {
        add("nodeSelector");
    }
    if s.scheduler_name.is_some() && it.scheduler_name.is_some() {
        add("schedulerName");
    }
    let devices = d.devices.as_ref();
    if devices.is_some_and(|x| x.gpus.is_some()) && it.gpus.is_some() {
        add("domain.devices.gpus");
    }
    if devices.is_some_and(|x| x.host_devices.is_some()) && it.host_devices.is_some() {
        add("domain.devices.hostDevices");
    }
    if d.io_threads_policy.is_some() && it.io_threads_policy.is_some() {
        add("domain.ioThreadsPolicy");
    }
    let pool = |m: &Option<JsonMap>| {
        m.as_ref()
            .is_some_and(|m| m.contains_key("supplementalPoolThreadCount"))
    };
    if pool(&d.io_threads) && pool(&it.io_threads) {
        add("domain.ioThreads.supplementalPoolThreadCount");
    }
    if d.launch_security.is_some() && it.launch_security.is_some() {
        add("domain.launchSecurity");
    }
    let vm_ann = vm
        .spec
        .template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref());
    if let (Some(vm_ann), Some(it_ann)) = (vm_ann, &it.annotations) {
        for (k, v) in it_ann {
            if vm_ann.get(k).is_some_and(|x| x != v) {
                out.push(format!("spec.template.metadata.annotations.{k}"));
            }
        }
    }
    out
}

/// KubeVirt's conflict message: `VM field(s) <p>, <q> conflicts with selected instance type`
/// (its `Conflicts.Error()`, every field once).
pub fn conflict_message(paths: &[String]) -> String {
    format!(
        "VM field(s) {} conflicts with selected instance type",
        paths.join(", ")
    )
}

/// Every instancetype conflict and unmet preference requirement, as causes. The conflicts are
/// one cause, KubeVirt's [`conflict_message`] naming every conflicting field once, at no
/// field of its own: a rejection is said as its causes' `field: reason`, `; `-joined, so a
/// cause per field would say each field twice, or the whole list once per field. The fields
/// themselves are [`conflicts`]'.
pub fn check(
    vm: &VirtualMachine,
    it: Option<&InstancetypeSpec>,
    pref: Option<&PreferenceSpec>,
) -> Result<(), Rejection> {
    let mut c = Causes::new();
    if let Some(it) = it {
        let paths = conflicts(vm, it);
        if !paths.is_empty() {
            c.invalid("", codes::INSTANCETYPE_CONFLICT, conflict_message(&paths));
        }
        if let Err(why) = cpu_topology(it.cpu.guest, pref) {
            c.invalid("spec.preference", codes::PREFERENCE_REQUIREMENT, why);
        }
    }
    if let Some(pref) = pref {
        requirements(vm, it, pref, &mut c);
        preferred_values(vm, pref, &mut c);
    }
    c.finish()
}

/// What a preference fills that vmplane could not run: a preferred machine type or
/// interface model that [`crate::validate`] would refuse in the VM itself, where the VM
/// leaves the field to the preference. Said at `spec.preference`, as the VM is what names it.
fn preferred_values(vm: &VirtualMachine, pref: &PreferenceSpec, c: &mut Causes) {
    let spec = vm.vmi_spec();
    let machine_unset = spec
        .and_then(|s| s.domain.machine.as_ref())
        .and_then(|m| m.get("type"))
        .is_none_or(|t| t.is_null() || t.as_str() == Some(""));
    let preferred_machine = pref
        .machine
        .as_ref()
        .and_then(|m| m.get("preferredMachineType"))
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty());
    if machine_unset
        && let Some(mt) = preferred_machine
        && let Some(why) = crate::validate::machine_type_problem(mt)
    {
        c.push(
            Category::Invalid,
            Cause::new(
                "spec.preference",
                codes::UNSUPPORTED,
                format!("the preference's machine.preferredMachineType: {why}"),
            ),
        );
    }
    let model = pref
        .devices
        .as_ref()
        .and_then(|d| d.preferred_interface_model.as_deref())
        .filter(|m| !m.is_empty());
    // An interface without a model, or none at all when the pod interface is attached.
    let devices = spec.and_then(|s| s.domain.devices.as_ref());
    let fills_a_model = match devices.and_then(|d| d.interfaces.as_ref()) {
        Some(ifaces) if !ifaces.is_empty() => ifaces
            .iter()
            .any(|i| i.model.as_deref().is_none_or(str::is_empty)),
        _ => devices.and_then(|d| d.autoattach_pod_interface) != Some(false),
    };
    if fills_a_model
        && let Some(model) = model
        && !crate::validate::INTERFACE_MODELS.contains(&model)
    {
        c.push(
            Category::Invalid,
            Cause::new(
                "spec.preference",
                codes::UNSUPPORTED,
                format!(
                    "the preference's devices.preferredInterfaceModel {model} is not supported by \
                     vmplane: vmplane renders {}",
                    crate::validate::INTERFACE_MODELS.join(", ")
                ),
            ),
        );
    }
}

fn requirements(
    vm: &VirtualMachine,
    it: Option<&InstancetypeSpec>,
    pref: &PreferenceSpec,
    c: &mut Causes,
) {
    let Some(req) = &pref.requirements else {
        return;
    };
    let mut fail = |field: &str, msg: String| {
        c.push(
            Category::Invalid,
            Cause::new(
                field,
                codes::PREFERENCE_REQUIREMENT,
                format!("{REQUIREMENTS_PREFIX}{msg}"),
            ),
        );
    };
    let spec = vm.vmi_spec();
    if let Some(cpu_req) = &req.cpu {
        let need = cpu_req.guest;
        match it {
            Some(it) if it.cpu.guest < need => fail(
                "spec.instancetype",
                format!(
                    "insufficient CPU resources of {} vCPU provided by instance type, preference requires {need} vCPU",
                    it.cpu.guest
                ),
            ),
            Some(_) => {}
            None => {
                let topo = Topology::of(Some(pref));
                match spec.and_then(|s| s.domain.cpu.as_ref()) {
                    None => fail(
                        &format!("{T}domain.cpu"),
                        format!(
                            "no CPU resources provided by VirtualMachine, preference requires {need} vCPU"
                        ),
                    ),
                    Some(cpu) => {
                        let one = |v: Option<u32>| v.unwrap_or(1);
                        let (have, field) = match topo {
                            Topology::Sockets => (one(cpu.sockets), "sockets"),
                            Topology::Cores => (one(cpu.cores), "cores"),
                            Topology::Threads => (one(cpu.threads), "threads"),
                            Topology::Spread => (one(cpu.sockets) * one(cpu.cores), "sockets"),
                            Topology::Any => (
                                one(cpu.sockets) * one(cpu.cores) * one(cpu.threads),
                                "sockets",
                            ),
                        };
                        if have < need {
                            fail(
                                &format!("{T}domain.cpu.{field}"),
                                format!(
                                    "insufficient CPU resources of {have} vCPU provided by VirtualMachine, preference requires {need} vCPU provided as {}",
                                    topo.word()
                                ),
                            );
                        }
                    }
                }
            }
        }
    }
    if let Some(mem_req) = &req.memory {
        let need = &mem_req.guest;
        match it {
            Some(it) if it.memory.guest < *need => fail(
                "spec.instancetype",
                format!(
                    "insufficient Memory resources of {} provided by instance type, preference requires {need}",
                    it.memory.guest
                ),
            ),
            Some(_) => {}
            None => match spec
                .and_then(|s| s.domain.memory.as_ref())
                .and_then(|m| m.guest.as_ref())
            {
                None => fail(
                    &format!("{T}domain.memory"),
                    format!(
                        "no Memory resources provided by VirtualMachine, preference requires {need}"
                    ),
                ),
                Some(have) if have < need => fail(
                    &format!("{T}domain.memory.guest"),
                    format!(
                        "insufficient Memory resources of {have} provided by VirtualMachine, preference requires {need}"
                    ),
                ),
                Some(_) => {}
            },
        }
    }
    if let Some(arch) = &req.architecture {
        let requested = spec
            .and_then(|s| s.architecture.clone())
            .or_else(|| pref.preferred_architecture.clone())
            .unwrap_or_else(|| crate::defaults::DEFAULT_ARCHITECTURE.to_owned());
        if &requested != arch {
            fail(
                &format!("{T}architecture"),
                format!(
                    "preference requires architecture {arch} but {requested} is being requested"
                ),
            );
        }
    }
}

/// Applies an instancetype to a VMI spec (after [`check`] found no conflict).
pub fn apply_instancetype(
    spec: &mut VmiSpec,
    annotations: &mut JsonMap,
    it: &InstancetypeSpec,
    pref: Option<&PreferenceSpec>,
) {
    let (sockets, cores, threads) =
        cpu_topology(it.cpu.guest, pref).unwrap_or((it.cpu.guest, 1, 1));
    let d = &mut spec.domain;
    let cpu = d.cpu_mut();
    cpu.sockets = Some(sockets);
    cpu.cores = Some(cores);
    cpu.threads = Some(threads);
    set_if_some(&mut cpu.model, &it.cpu.model);
    set_if_some(
        &mut cpu.dedicated_cpu_placement,
        &it.cpu.dedicated_cpu_placement,
    );
    set_if_some(
        &mut cpu.isolate_emulator_thread,
        &it.cpu.isolate_emulator_thread,
    );
    set_if_some(&mut cpu.numa, &it.cpu.numa);
    set_if_some(&mut cpu.realtime, &it.cpu.realtime);
    set_if_some(&mut cpu.max_sockets, &it.cpu.max_sockets);
    let mem = d.memory_mut();
    mem.guest = Some(it.memory.guest.clone());
    set_if_some(&mut mem.hugepages, &it.memory.hugepages);
    set_if_some(&mut mem.max_guest, &it.memory.max_guest);
    if let Some(pct) = it
        .memory
        .overcommit_percent
        .filter(|p| (1..=100).contains(p))
    {
        let guest = it.memory.guest.units_ceil();
        let request = guest * i128::from(100 - pct) / 100;
        let r = d.resources.get_or_insert_with(Default::default);
        r.requests.get_or_insert_with(JsonMap::new).insert(
            "memory".into(),
            Value::String(Quantity::from_units(request).to_string()),
        );
    }
    set_if_some(&mut d.io_threads_policy, &it.io_threads_policy);
    set_if_some(&mut d.io_threads, &it.io_threads);
    set_if_some(&mut d.launch_security, &it.launch_security);
    let devices = d.devices_mut();
    set_if_some(&mut devices.gpus, &it.gpus);
    set_if_some(&mut devices.host_devices, &it.host_devices);
    set_if_some(&mut spec.node_selector, &it.node_selector);
    set_if_some(&mut spec.scheduler_name, &it.scheduler_name);
    for (k, v) in it.annotations.iter().flatten() {
        annotations.entry(k.clone()).or_insert_with(|| v.clone());
    }
}

fn set_if_some<T: Clone>(target: &mut Option<T>, value: &Option<T>) {
    if value.is_some() {
        target.clone_from(value);
    }
}

fn fill<T: Clone>(target: &mut Option<T>, value: &Option<T>) {
    if target.is_none() {
        target.clone_from(value);
    }
}

/// Applies a preference: fills only what the VM left unset. Preferences never conflict.
pub fn apply_preference(spec: &mut VmiSpec, annotations: &mut JsonMap, pref: &PreferenceSpec) {
    fill(&mut spec.architecture, &pref.preferred_architecture);
    fill(
        &mut spec.termination_grace_period_seconds,
        &pref.preferred_termination_grace_period_seconds,
    );
    fill(&mut spec.subdomain, &pref.preferred_subdomain);
    let d = &mut spec.domain;
    if let Some(pd) = &pref.devices {
        let devices = d.devices_mut();
        fill(
            &mut devices.autoattach_input_device,
            &pd.preferred_autoattach_input_device,
        );
        fill(
            &mut devices.autoattach_pod_interface,
            &pd.preferred_autoattach_pod_interface,
        );
        fill(&mut devices.rng, &pd.preferred_rng);
        if let Some(tpm) = &pd.preferred_tpm {
            devices.extra.entry("tpm").or_insert_with(|| tpm.clone());
        }
        for disk in devices.disks.iter_mut().flatten() {
            if let Some(t) = disk.disk.as_mut() {
                fill(&mut t.bus, &pd.preferred_disk_bus);
            }
            if let Some(t) = disk.cdrom.as_mut() {
                fill(&mut t.bus, &pd.preferred_cdrom_bus);
            }
            if let Some(t) = disk.lun.as_mut() {
                fill(&mut t.bus, &pd.preferred_lun_bus);
            }
        }
        for iface in devices.interfaces.iter_mut().flatten() {
            fill(&mut iface.model, &pd.preferred_interface_model);
        }
        for input in devices.inputs.iter_mut().flatten() {
            fill(&mut input.bus, &pd.preferred_input_bus);
            fill(&mut input.kind, &pd.preferred_input_type);
        }
    }
    if let Some(features) = &pref.features {
        let target = d.features.get_or_insert_with(JsonMap::new);
        for (k, v) in features {
            if let Some(name) = k.strip_prefix("preferred") {
                let mut chars = name.chars();
                let Some(first) = chars.next() else { continue };
                let key = format!("{}{}", first.to_ascii_lowercase(), chars.as_str());
                target.entry(key).or_insert_with(|| v.clone());
            }
        }
        if target.is_empty() {
            d.features = None;
        }
    }
    if let Some(fw) = &pref.firmware {
        let firmware = d.firmware.get_or_insert_with(Default::default);
        if firmware.bootloader.is_none() {
            let bootloader = if let Some(efi) = &fw.preferred_efi {
                Some(json!({ "efi": efi }))
            } else if fw.preferred_use_efi == Some(true) {
                Some(
                    json!({ "efi": { "secureBoot": fw.preferred_use_secure_boot.unwrap_or(false) } }),
                )
            } else if fw.preferred_use_bios == Some(true) {
                Some(
                    json!({ "bios": { "useSerial": fw.preferred_use_bios_serial.unwrap_or(false) } }),
                )
            } else {
                None
            };
            firmware.bootloader = bootloader.and_then(|b| b.as_object().cloned());
        }
    }
    if let Some(mt) = pref
        .machine
        .as_ref()
        .and_then(|m| m.get("preferredMachineType"))
    {
        d.machine
            .get_or_insert_with(JsonMap::new)
            .entry("type")
            .or_insert_with(|| mt.clone());
    }
    if let Some(clock) = &pref.clock {
        let target = d.clock.get_or_insert_with(JsonMap::new);
        if let Some(Value::Object(offset)) = clock.get("preferredClockOffset") {
            let has_offset = target.contains_key("utc") || target.contains_key("timezone");
            if !has_offset {
                for (k, v) in offset {
                    target.insert(k.clone(), v.clone());
                }
            }
        }
        if let Some(timer) = clock.get("preferredTimer") {
            target.entry("timer").or_insert_with(|| timer.clone());
        }
    }
    for (k, v) in pref.annotations.iter().flatten() {
        annotations.entry(k.clone()).or_insert_with(|| v.clone());
    }
}

/// The VM fully rendered: instancetype, preference and VMI defaults applied, matchers removed
/// (KubeVirt's expand-spec). The firmware UUID and serial are whatever the stored VM holds
/// (the effective ones, for a VM read from its stream). A VM with neither matcher still gets
/// the VMI defaults.
pub fn expand(
    vm: &VirtualMachine,
    it: Option<&InstancetypeSpec>,
    pref: Option<&PreferenceSpec>,
) -> Result<VirtualMachine, Rejection> {
    check_expandable(vm, it, pref)?;
    let mut out = vm.clone();
    let template = out.spec.template.get_or_insert_with(Default::default);
    let mut annotations = template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    let spec = template.spec.get_or_insert_with(Default::default);
    expand_in_place(spec, &mut annotations, it, pref);
    if !annotations.is_empty() {
        template
            .metadata
            .get_or_insert_with(Default::default)
            .annotations = Some(annotations);
    }
    out.spec.instancetype = None;
    out.spec.preference = None;
    Ok(out)
}

/// The template's VMI spec of [`expand`]'s VM, without copying or building the rest of the VM
/// (what the features a VM requests are read from, on every create and edit); the same
/// checks and the same result.
pub fn expand_vmi_spec(
    vm: &VirtualMachine,
    it: Option<&InstancetypeSpec>,
    pref: Option<&PreferenceSpec>,
) -> Result<VmiSpec, Rejection> {
    check_expandable(vm, it, pref)?;
    let mut spec = vm.vmi_spec().cloned().unwrap_or_default();
    // The annotations the matchers add go to the template's metadata, not its spec.
    let mut annotations = JsonMap::new();
    expand_in_place(&mut spec, &mut annotations, it, pref);
    Ok(spec)
}

/// What [`expand`] refuses: a matcher whose object was not provided, or what [`check`] finds.
fn check_expandable(
    vm: &VirtualMachine,
    it: Option<&InstancetypeSpec>,
    pref: Option<&PreferenceSpec>,
) -> Result<(), Rejection> {
    if vm.spec.instancetype.is_some() && it.is_none() {
        return Err(Rejection::not_found(
            "spec.instancetype",
            codes::INSTANCETYPE_NOT_FOUND,
            "the referenced instancetype was not provided",
        ));
    }
    if vm.spec.preference.is_some() && pref.is_none() {
        return Err(Rejection::not_found(
            "spec.preference",
            codes::PREFERENCE_NOT_FOUND,
            "the referenced preference was not provided",
        ));
    }
    check(vm, it, pref)
}

/// [`expand`]'s changes to the template's VMI spec (and to its annotations): default devices,
/// the instancetype, the preference, the VMI defaults.
fn expand_in_place(
    spec: &mut VmiSpec,
    annotations: &mut JsonMap,
    it: Option<&InstancetypeSpec>,
    pref: Option<&PreferenceSpec>,
) {
    crate::defaults::attach_default_devices(spec);
    if let Some(it) = it {
        apply_instancetype(spec, annotations, it, pref);
    }
    if let Some(pref) = pref {
        apply_preference(spec, annotations, pref);
    }
    let pd = pref.and_then(|p| p.devices.as_ref());
    crate::defaults::vmi_spec(
        spec,
        pd.and_then(|d| d.preferred_input_bus.as_deref()),
        pd.and_then(|d| d.preferred_input_type.as_deref()),
    );
}
