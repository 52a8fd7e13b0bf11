//! Validation like a KubeVirt admitter: every problem, each with its field path and reason
//! (KubeVirt's wording where it has one). Pure; never changes its input (that is
//! [`crate::defaults`]).

use std::collections::HashSet;

use serde_json::Value;
use uuid::Uuid;

use crate::error::{Category, Cause, Causes, Rejection, codes};
use crate::limits::*;
use crate::quantity::Quantity;
use crate::types::{
    GenericObject, Instancetype, JsonMap, Matcher, ObjectMeta, Preference, VirtualMachine,
    VirtualMachineInstance, VmiSpec,
};

/// KubeVirt's message when both `running` and `runStrategy` are set.
pub const RUNNING_AND_RUN_STRATEGY_MESSAGE: &str = "Running and RunStrategy are mutually exclusive. Note that Running is deprecated, please use RunStrategy instead";

/// Run strategies vmplane implements.
pub const RUN_STRATEGIES: [&str; 5] = ["Always", "RerunOnFailure", "Manual", "Halted", "Once"];

/// Validates a VirtualMachine manifest (after [`crate::defaults::normalize_vm`]).
pub fn vm(vm: &VirtualMachine) -> Result<(), Rejection> {
    let mut c = Causes::new();
    metadata(&vm.metadata, true, &mut c);
    let spec = &vm.spec;
    match (spec.running, spec.run_strategy.as_deref()) {
        (Some(_), Some(_)) => c.invalid(
            "spec.running",
            codes::RUNNING_AND_RUN_STRATEGY,
            RUNNING_AND_RUN_STRATEGY_MESSAGE,
        ),
        (None, None) => c.invalid(
            "spec.runStrategy",
            codes::RUN_STRATEGY_REQUIRED,
            "RunStrategy must be specified",
        ),
        (None, Some("WaitAsReceiver")) => c.invalid(
            "spec.runStrategy",
            codes::RUN_STRATEGY_INVALID,
            "RunStrategy WaitAsReceiver (decentralized live migration) is not supported by vmplane",
        ),
        (None, Some(s)) if !RUN_STRATEGIES.contains(&s) => c.invalid(
            "spec.runStrategy",
            codes::RUN_STRATEGY_INVALID,
            format!("Invalid RunStrategy ({s})"),
        ),
        _ => {}
    }
    if let Some(m) = &spec.instancetype {
        matcher(m, "spec.instancetype", true, &mut c);
    }
    if let Some(m) = &spec.preference {
        matcher(m, "spec.preference", false, &mut c);
    }
    match spec.template.as_ref() {
        None => c.invalid("spec.template", codes::REQUIRED, "Required value"),
        Some(t) => {
            if let Some(m) = &t.metadata {
                labels_and_annotations(m, "spec.template.metadata", &mut c);
            }
            match &t.spec {
                None => c.invalid("spec.template.spec", codes::REQUIRED, "Required value"),
                Some(s) => {
                    vmi_spec(s, "spec.template.spec", &mut c);
                    // An instancetype always supplies `memory.guest` (its own validation requires
                    // it), so only a VM without one must name its memory itself. The expanded
                    // spec is what runs; the raw manifest is what is judged here.
                    if spec.instancetype.is_none() {
                        memory_requested(s, "spec.template.spec", &mut c);
                    }
                }
            }
        }
    }
    c.finish()
}

/// Validates a standalone VirtualMachineInstance manifest.
pub fn vmi(vmi: &VirtualMachineInstance) -> Result<(), Rejection> {
    let mut c = Causes::new();
    metadata(&vmi.metadata, true, &mut c);
    vmi_spec(&vmi.spec, "spec", &mut c);
    memory_requested(&vmi.spec, "spec", &mut c);
    c.finish()
}

/// Validates an instancetype (either scope).
pub fn instancetype(o: &Instancetype) -> Result<(), Rejection> {
    let mut c = Causes::new();
    metadata(&o.metadata, o.kind == "VirtualMachineInstancetype", &mut c);
    let guest = u64::from(o.spec.cpu.guest);
    if guest == 0 || guest > VCPUS_MAX {
        c.invalid(
            "spec.cpu.guest",
            codes::INVALID_VALUE,
            format!("must be between 1 and {VCPUS_MAX}"),
        );
    }
    if o.spec.memory.guest.nanos() <= 0 {
        c.invalid(
            "spec.memory.guest",
            codes::INVALID_VALUE,
            "must be greater than 0",
        );
    }
    if let Some(p) = o.spec.memory.overcommit_percent
        && !(0..=100).contains(&p)
    {
        c.invalid(
            "spec.memory.overcommitPercent",
            codes::INVALID_VALUE,
            "must be between 0 and 100",
        );
    }
    c.finish()
}

/// Validates a preference (either scope).
pub fn preference(o: &Preference) -> Result<(), Rejection> {
    let mut c = Causes::new();
    metadata(&o.metadata, o.kind == "VirtualMachinePreference", &mut c);
    if let Some(cpu) = &o.spec.cpu {
        if let Some(t) = cpu.preferred_cpu_topology.as_deref()
            && crate::instancetype::Topology::parse(t).is_none()
        {
            c.invalid(
                "spec.cpu.preferredCPUTopology",
                codes::INVALID_VALUE,
                format!("unknown topology {t:?}"),
            );
        }
        if let Some(r) = cpu.spread_options.as_ref().and_then(|s| s.ratio)
            && r == 0
        {
            c.invalid(
                "spec.cpu.spreadOptions.ratio",
                codes::INVALID_VALUE,
                "must be at least 1",
            );
        }
    }
    c.finish()
}

/// Validates any other object (snapshot, restore, clone; `KubeVirt` has [`kubevirt`]).
pub fn object(o: &GenericObject, namespaced: bool) -> Result<(), Rejection> {
    let mut c = Causes::new();
    metadata(&o.metadata, namespaced, &mut c);
    c.finish()
}

/// Validates the `KubeVirt` cluster configuration: metadata plus its feature configuration
/// ([`crate::features::validate_config`]), every cause collected.
pub fn kubevirt(o: &GenericObject) -> Result<(), Rejection> {
    let mut c = Causes::new();
    metadata(&o.metadata, true, &mut c);
    crate::features::validate_config(o, &mut c);
    c.finish()
}

/// Name, namespace, labels and annotations.
pub fn metadata(m: &ObjectMeta, namespaced: bool, c: &mut Causes) {
    match m.name.as_deref() {
        None | Some("") => {
            let generate_name = m
                .extra
                .get("generateName")
                .and_then(Value::as_str)
                .filter(|g| !g.is_empty());
            match generate_name {
                // kubectl refuses it too ("cannot use generate name with apply"): an apply
                // names the object it creates or updates, and vmplane keys every object by
                // its name.
                Some(_) => c.push(
                    Category::Invalid,
                    Cause::new(
                        "metadata.generateName",
                        codes::UNSUPPORTED,
                        GENERATE_NAME_MESSAGE,
                    ),
                ),
                None => c.invalid(
                    "metadata.name",
                    codes::REQUIRED,
                    "Required value: name is required",
                ),
            }
        }
        Some(n) => {
            if let Some(why) = dns_subdomain(n, NAME_BYTES_MAX) {
                c.invalid(
                    "metadata.name",
                    codes::INVALID_VALUE,
                    format!("Invalid value: {}: {why}", shown(n)),
                );
            }
        }
    }
    if namespaced
        && let Some(ns) = m.namespace.as_deref()
        && let Some(why) = dns_label(ns)
    {
        c.invalid(
            "metadata.namespace",
            codes::INVALID_VALUE,
            format!("Invalid value: {}: {why}", shown(ns)),
        );
    }
    labels_and_annotations(m, "metadata", c);
}

/// Why a manifest with `metadata.generateName` and no name is refused.
pub const GENERATE_NAME_MESSAGE: &str = "generateName is not supported by apply: cannot use generate name with apply; give the object a metadata.name";

/// The field path of one entry of `map` (`labels` or `annotations`) under `path`: the key
/// itself when it is short enough to say, else the map (the reason quotes the key, cut).
fn entry_field(path: &str, map: &str, key: &str) -> String {
    if key.len() <= LABEL_KEY_BYTES_MAX {
        format!("{path}.{map}.{key}")
    } else {
        format!("{path}.{map}")
    }
}

/// Labels and annotations at `path` (`metadata`, `spec.template.metadata`), by Kubernetes'
/// rules, the same ones `vmplane label` and `annotate` check before they send anything
/// ([`crate::selector::check_label_key`], [`crate::selector::check_label_value`]): a label
/// key is a qualified name (`[prefix/]name`), its value empty or a name of at most 63
/// characters; an annotation key is a qualified name too (its prefix compared in lower case,
/// as Kubernetes does), its value any string. (Kubernetes also caps all annotations together
/// at 256 KiB; vmplane's bound is the manifest's, [`MANIFEST_BYTES_MAX`].)
fn labels_and_annotations(m: &ObjectMeta, path: &str, c: &mut Causes) {
    let count =
        m.labels.as_ref().map_or(0, JsonMap::len) + m.annotations.as_ref().map_or(0, JsonMap::len);
    if count > METADATA_ENTRIES_MAX {
        c.push(
            Category::ResourceExhausted,
            Cause::new(
                path,
                codes::TOO_MANY,
                format!("more than {METADATA_ENTRIES_MAX} labels and annotations"),
            ),
        );
        return;
    }
    for (k, v) in m.labels.iter().flatten() {
        let field = entry_field(path, "labels", k);
        if let Err(why) = crate::selector::check_label_key(k) {
            c.invalid(
                field.clone(),
                codes::INVALID_VALUE,
                format!("Invalid value: {}: {why}", shown(k)),
            );
        }
        match v {
            Value::String(s) => {
                if let Err(why) = crate::selector::check_label_value(s) {
                    c.invalid(
                        field,
                        codes::INVALID_VALUE,
                        format!("Invalid value: {}: {why}", shown(s)),
                    );
                }
            }
            _ => c.invalid(field, codes::INVALID_VALUE, "must be a string"),
        }
    }
    for (k, v) in m.annotations.iter().flatten() {
        let field = entry_field(path, "annotations", k);
        if let Err(why) = crate::selector::check_label_key(&k.to_ascii_lowercase()) {
            c.invalid(
                field.clone(),
                codes::INVALID_VALUE,
                format!("Invalid value: {}: {why}", shown(k)),
            );
        }
        match v {
            Value::String(_) => {}
            _ => c.invalid(field, codes::INVALID_VALUE, "must be a string"),
        }
    }
}

fn matcher(m: &Matcher, path: &str, is_instancetype: bool, c: &mut Causes) {
    if m.infer_from_volume.is_some() {
        c.push(
            Category::Invalid,
            Cause::new(
                format!("{path}.inferFromVolume"),
                codes::UNSUPPORTED,
                "inferFromVolume is not supported by vmplane; name the object instead",
            ),
        );
        return;
    }
    if m.name.as_deref().is_none_or(str::is_empty) {
        c.invalid(
            format!("{path}.name"),
            codes::REQUIRED,
            if is_instancetype {
                "Either Name or InferFromVolume should be provided within the InstancetypeMatcher"
            } else {
                "Either Name or InferFromVolume should be provided within the PreferenceMatcher"
            },
        );
    }
    if let Err(why) = crate::instancetype::matcher_kind(m, is_instancetype) {
        c.invalid(format!("{path}.kind"), codes::INVALID_VALUE, why);
    }
    // KubeVirt reads a pinned ControllerRevision by this name. vmplane names no revisions: it
    // captures the referenced object at creation (`InstancetypeRevisionCaptured`), so a name
    // from another cluster cannot be found here, and taking the current revision instead
    // would silently run another spec than the one pinned.
    if m.revision_name.as_deref().is_some_and(|r| !r.is_empty()) {
        c.push(
            Category::Invalid,
            Cause::new(
                format!("{path}.revisionName"),
                codes::UNSUPPORTED,
                revision_name_message(is_instancetype),
            ),
        );
    }
}

/// Why a matcher's `revisionName` is refused.
pub fn revision_name_message(is_instancetype: bool) -> String {
    let status = if is_instancetype {
        "status.instancetypeRef.revision"
    } else {
        "status.preferenceRef.revision"
    };
    format!(
        "revisionName is not supported by vmplane: vmplane captures the revision at creation, \
         see {status}; remove revisionName to use the object's current revision"
    )
}

/// The VMI spec at `path` (`spec.template.spec` for a VM, `spec` for a VMI).
pub fn vmi_spec(s: &VmiSpec, path: &str, c: &mut Causes) {
    let domain = format!("{path}.domain");
    let volumes = s.volumes.as_deref().unwrap_or_default();
    let networks = s.networks.as_deref().unwrap_or_default();
    let devices = s.domain.devices.as_ref();
    let disks = devices.and_then(|d| d.disks.as_deref()).unwrap_or_default();
    let ifaces = devices
        .and_then(|d| d.interfaces.as_deref())
        .unwrap_or_default();

    // Field paths are made only for what is reported: this runs on every write.
    let mut too_many = false;
    for ((base, field), n, max) in [
        ((domain.as_str(), "devices.disks"), disks.len(), DISKS_MAX),
        ((path, "volumes"), volumes.len(), VOLUMES_MAX),
        (
            (domain.as_str(), "devices.interfaces"),
            ifaces.len(),
            INTERFACES_MAX,
        ),
        ((path, "networks"), networks.len(), NETWORKS_MAX),
    ] {
        if n > max {
            too_many = true;
            c.push(
                Category::ResourceExhausted,
                Cause::new(
                    format!("{base}.{field}"),
                    codes::TOO_MANY,
                    format!("must have at most {max} items"),
                ),
            );
        }
    }
    if too_many {
        return;
    }

    let volume_names: HashSet<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
    unique(volumes.iter().map(|v| v.name.as_str()), path, "volumes", c);
    unique(
        disks.iter().map(|d| d.name.as_str()),
        &domain,
        "devices.disks",
        c,
    );
    for (i, d) in disks.iter().enumerate() {
        if !volume_names.contains(d.name.as_str()) {
            c.invalid(
                format!("{domain}.devices.disks[{i}].name"),
                codes::NOT_FOUND_REF,
                format!("{domain}.devices.disks[{i}].name '{}' not found.", d.name),
            );
        }
        let targets = [d.disk.is_some(), d.cdrom.is_some(), d.lun.is_some()]
            .iter()
            .filter(|x| **x)
            .count();
        if targets > 1 {
            c.invalid(
                format!("{domain}.devices.disks[{i}]"),
                codes::INVALID_VALUE,
                "should have only one of disk, cdrom, lun",
            );
        }
    }
    let network_names: HashSet<&str> = networks.iter().map(|n| n.name.as_str()).collect();
    unique(
        networks.iter().map(|n| n.name.as_str()),
        path,
        "networks",
        c,
    );
    unique(
        ifaces.iter().map(|i| i.name.as_str()),
        &domain,
        "devices.interfaces",
        c,
    );
    for (i, iface) in ifaces.iter().enumerate() {
        if !network_names.contains(iface.name.as_str()) {
            c.invalid(
                format!("{domain}.devices.interfaces[{i}].name"),
                codes::NOT_FOUND_REF,
                format!(
                    "{domain}.devices.interfaces[{i}].name '{}' not found.",
                    iface.name
                ),
            );
        }
        if let Some(mac) = iface.mac_address.as_deref()
            && !mac.is_empty()
            && !is_mac(mac)
        {
            c.invalid(
                format!("{domain}.devices.interfaces[{i}].macAddress"),
                codes::INVALID_VALUE,
                format!(
                    "interface {} has malformed MAC address ({mac}).",
                    iface.name
                ),
            );
        }
    }

    if let Some(cpu) = &s.domain.cpu {
        for (name, v) in [
            ("sockets", cpu.sockets),
            ("cores", cpu.cores),
            ("threads", cpu.threads),
        ] {
            if v == Some(0) {
                c.invalid(
                    format!("{domain}.cpu.{name}"),
                    codes::INVALID_VALUE,
                    "must be greater than 0",
                );
            }
        }
        if let Some(n) = cpu.vcpus()
            && n > VCPUS_MAX
        {
            c.invalid(
                format!("{domain}.cpu"),
                codes::INVALID_VALUE,
                format!("{n} vCPUs is more than {VCPUS_MAX}"),
            );
        }
    }
    if let Some(g) = s.domain.memory.as_ref().and_then(|m| m.guest.as_ref())
        && g.nanos() <= 0
    {
        c.invalid(
            format!("{domain}.memory.guest"),
            codes::INVALID_VALUE,
            "must be greater than 0",
        );
    }
    if let Some(r) = &s.domain.resources {
        for (what, list) in [("requests", &r.requests), ("limits", &r.limits)] {
            for (k, v) in list.iter().flatten() {
                if let Err(why) = quantity_of(v) {
                    c.invalid(
                        format!("{domain}.resources.{what}.{k}"),
                        codes::BAD_QUANTITY,
                        why,
                    );
                }
            }
        }
    }
    resources(s, &domain, c);
    if let Some(fw) = &s.domain.firmware {
        if let Some(u) = fw.uuid.as_deref()
            && Uuid::parse_str(u).is_err()
        {
            c.invalid(
                format!("{domain}.firmware.uuid"),
                codes::FIRMWARE_UUID_INVALID,
                format!("{u:?} is not a UUID"),
            );
        }
        if let Some(serial) = fw.serial.as_deref() {
            let field = format!("{domain}.firmware.serial");
            if serial.len() > FIRMWARE_SERIAL_BYTES_MAX {
                c.invalid(
                    field.clone(),
                    codes::TOO_MANY,
                    format!("must be no more than {FIRMWARE_SERIAL_BYTES_MAX} characters"),
                );
            }
            // KubeVirt's `validateFirmwareSerial`: what libvirt takes in an SMBIOS string.
            if !serial.is_empty()
                && !serial
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'+' | b'-'))
            {
                c.invalid(
                    field.clone(),
                    codes::INVALID_VALUE,
                    "must be made up of the following characters [A-Za-z0-9_.+-], if specified",
                );
            }
        }
    }
    if let Some(machine) = &s.domain.machine {
        let field = format!("{domain}.machine.type");
        match machine.get("type") {
            None | Some(Value::Null) => {}
            // KubeVirt's defaults fill an empty type ([`crate::defaults::vmi_spec`] too).
            Some(Value::String(t)) if t.is_empty() => {}
            Some(Value::String(t)) => {
                if let Some(why) = machine_type_problem(t) {
                    c.push(
                        Category::Invalid,
                        Cause::new(field, codes::UNSUPPORTED, why),
                    );
                }
            }
            Some(_) => c.invalid(field, codes::INVALID_VALUE, "must be a string"),
        }
    }
    for (i, iface) in ifaces.iter().enumerate() {
        if let Some(model) = iface.model.as_deref() {
            let field = format!("{domain}.devices.interfaces[{i}].model");
            if let Some((code, why)) = interface_model_problem(model, &domain, i) {
                c.push(Category::Invalid, Cause::new(field, code, why));
            }
        }
    }
    host_names(s, path, c);
    start_strategy(s, path, c);
    affinity(s, path, c);
}

/// A resource quantity as written in `requests` or `limits` (a string or a number).
fn quantity_of(v: &Value) -> Result<Quantity, String> {
    match v {
        Value::String(t) => Quantity::parse(t).map_err(|e| e.to_string()),
        Value::Number(_) => serde_json::from_value(v.clone()).map_err(|e| e.to_string()),
        _ => Err("must be a quantity".to_owned()),
    }
}

/// `domain.resources.<what>.<key>`, when it is a quantity (a bad one is reported apart).
fn resource(s: &VmiSpec, what: &str, key: &str) -> Option<Quantity> {
    let r = s.domain.resources.as_ref()?;
    let list = match what {
        "requests" => r.requests.as_ref(),
        _ => r.limits.as_ref(),
    }?;
    quantity_of(list.get(key)?).ok()
}

/// KubeVirt's resource rules (`ValidateVirtualMachineInstanceSpec`): requests and limits of
/// memory and CPU not negative, a memory request of at least 1M, no request above its limit,
/// and the guest memory within the memory limit. KubeVirt checks the last only without the
/// `LiveUpdate` rollout strategy, where memory can be hot-plugged up to `maxGuest`; vmplane
/// hot-plugs nothing, so a guest larger than its limit could never run, and is refused
/// always. A memory request above `memory.guest` is accepted, as in KubeVirt (the request
/// covers the VM's overhead too).
fn resources(s: &VmiSpec, domain: &str, c: &mut Causes) {
    let at = |what: &str, key: &str| format!("{domain}.resources.{what}.{key}");
    for key in ["memory", "cpu"] {
        for what in ["requests", "limits"] {
            if let Some(q) = resource(s, what, key)
                && q.nanos() < 0
            {
                let field = at(what, key);
                c.invalid(
                    field.clone(),
                    codes::INVALID_VALUE,
                    format!("'{q}': must be greater than or equal to 0."),
                );
            }
        }
        if let (Some(request), Some(limit)) =
            (resource(s, "requests", key), resource(s, "limits", key))
            && limit.nanos() > 0
            && request > limit
        {
            let field = at("requests", key);
            c.invalid(
                field.clone(),
                codes::INVALID_VALUE,
                format!(
                    "'{request}' is greater than {} '{limit}'",
                    at("limits", key)
                ),
            );
        }
    }
    if let Some(request) = resource(s, "requests", "memory")
        && request.nanos() > 0
        && request.nanos() < 1_000_000 * 1_000_000_000
    {
        let field = at("requests", "memory");
        c.invalid(
            field.clone(),
            codes::INVALID_VALUE,
            format!("'{request}': must be greater than or equal to 1M."),
        );
    }
    if let Some(guest) = s.domain.memory.as_ref().and_then(|m| m.guest.as_ref())
        && let Some(limit) = resource(s, "limits", "memory")
        && limit.nanos() > 0
        && limit < *guest
    {
        let field = format!("{domain}.memory.guest");
        c.invalid(
            field.clone(),
            codes::INVALID_VALUE,
            format!(
                "'{guest}' must be equal to or less than the memory limit {} '{limit}'",
                at("limits", "memory")
            ),
        );
    }
}

/// KubeVirt's rule for a VMI (`ValidateVirtualMachineInstanceMandatoryFields`): some memory
/// must be asked for. KubeVirt checks it when the VMI is created; vmplane checks it when the
/// VM is applied, as a VM without memory could never start. A memory limit alone counts too:
/// the request defaults to it, and vmplane's domain takes it.
fn memory_requested(s: &VmiSpec, path: &str, c: &mut Causes) {
    let memory = s.domain.memory.as_ref();
    let asked = memory.is_some_and(|m| m.guest.is_some())
        || resource(s, "requests", "memory").is_some_and(|q| !q.is_zero())
        || resource(s, "limits", "memory").is_some_and(|q| !q.is_zero());
    if asked {
        return;
    }
    let hugepages = memory.is_some_and(|m| m.hugepages.as_ref().is_some_and(|h| !h.is_null()));
    let reason = if hugepages {
        // KubeVirt refuses this too, as a memory request below the page size.
        format!(
            "no memory requested: hugepages give the page size, not the amount; set \
             '{path}.domain.memory.guest' or '{path}.domain.resources.requests.memory'"
        )
    } else {
        format!(
            "no memory requested, at least one of '{path}.domain.memory.guest', \
             '{path}.domain.memory.hugepages.size' or '{path}.domain.resources.requests.memory' \
             must be set"
        )
    };
    c.invalid(
        format!("{path}.domain.memory.guest"),
        codes::REQUIRED,
        reason,
    );
}

/// The machine types vmplane runs, the rule its hypervisor applies when it builds the domain:
/// Q35 machines only, `q35` (KubeVirt's default on amd64) or `pc-q35-<version>` (KubeVirt's
/// default `emulatedMachines` on amd64 are `q35*` and `pc-q35*`). Why `machine` is not one, if
/// it is not.
#[must_use]
pub fn machine_type_problem(machine: &str) -> Option<String> {
    let versioned = machine.strip_prefix("pc-q35-").is_some_and(|version| {
        !version.is_empty()
            && version.len() <= 32
            && version
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    });
    if machine == crate::defaults::DEFAULT_MACHINE_TYPE_AMD64 || versioned {
        return None;
    }
    Some(format!(
        "machine type {} is not supported by vmplane: vmplane runs Q35 machines, \"q35\" or \
         \"pc-q35-<version>\"",
        shown(machine)
    ))
}

/// The NIC models KubeVirt accepts (its network admitter's `validInterfaceModels`).
pub const KUBEVIRT_INTERFACE_MODELS: [&str; 7] = [
    "e1000", "e1000e", "igb", "ne2k_pci", "pcnet", "rtl8139", "virtio",
];

/// Those of [`KUBEVIRT_INTERFACE_MODELS`] vmplane's hypervisor renders.
pub const INTERFACE_MODELS: [&str; 4] = ["virtio", "e1000", "e1000e", "rtl8139"];

/// Why interface `i`'s `model` cannot run, with its code: not a model KubeVirt knows
/// (KubeVirt's message), or one vmplane does not render. Empty is the default model.
fn interface_model_problem(model: &str, domain: &str, i: usize) -> Option<(&'static str, String)> {
    if model.is_empty() || INTERFACE_MODELS.contains(&model) {
        return None;
    }
    if KUBEVIRT_INTERFACE_MODELS.contains(&model) {
        return Some((
            codes::UNSUPPORTED,
            format!(
                "interface model {model} is not supported by vmplane: vmplane renders {}",
                INTERFACE_MODELS.join(", ")
            ),
        ));
    }
    Some((
        codes::INVALID_VALUE,
        format!(
            "interface {domain}.devices.interfaces[{i}].name uses model {} that is not supported.",
            shown(model)
        ),
    ))
}

/// `hostname` (a DNS-1123 label) and `subdomain` (a DNS-1123 subdomain), KubeVirt's words.
fn host_names(s: &VmiSpec, path: &str, c: &mut Causes) {
    match s.extra.get("hostname") {
        None | Some(Value::Null) => {}
        Some(Value::String(h)) if h.is_empty() => {}
        Some(Value::String(h)) => {
            if let Some(why) = dns_label(h) {
                let field = format!("{path}.hostname");
                c.invalid(
                    field.clone(),
                    codes::INVALID_VALUE,
                    format!("does not conform to the kubernetes DNS_LABEL rules : {why}"),
                );
            }
        }
        Some(_) => c.invalid(
            format!("{path}.hostname"),
            codes::INVALID_VALUE,
            "must be a string",
        ),
    }
    if let Some(sub) = s.subdomain.as_deref().filter(|d| !d.is_empty())
        && let Some(why) = dns_subdomain(sub, NAME_BYTES_MAX)
    {
        let field = format!("{path}.subdomain");
        c.invalid(
            field.clone(),
            codes::INVALID_VALUE,
            format!("does not conform to the kubernetes DNS_SUBDOMAIN rules : {why}"),
        );
    }
}

/// `startStrategy`: KubeVirt knows only `Paused`, which vmplane does not do (the VM would run
/// unpaused), so any value is refused.
fn start_strategy(s: &VmiSpec, path: &str, c: &mut Causes) {
    let field = format!("{path}.startStrategy");
    match s.extra.get("startStrategy") {
        None | Some(Value::Null) => {}
        Some(Value::String(v)) if v == "Paused" => c.push(
            Category::Invalid,
            Cause::new(
                field,
                codes::UNSUPPORTED,
                "startStrategy Paused is not supported by vmplane: the VM would start running, \
                 not paused; remove startStrategy",
            ),
        ),
        Some(Value::String(v)) => c.invalid(
            field.clone(),
            codes::INVALID_VALUE,
            format!("is set with an unrecognized option: {}", shown(v)),
        ),
        Some(_) => c.invalid(field, codes::INVALID_VALUE, "must be a string"),
    }
}

/// `affinity`: vmplane places a VM by `nodeSelector` only. A *required* term it cannot keep
/// is refused, so a VM that must not run elsewhere does not run elsewhere: required node
/// affinity (use `nodeSelector`), and required pod affinity and anti-affinity (vmplane does
/// not place VMs by what else runs on a node). *Preferred* terms are accepted: they are
/// hints a scheduler may leave unmet, and a VM placed without them is still placed as asked.
fn affinity(s: &VmiSpec, path: &str, c: &mut Causes) {
    let Some(affinity) = s.extra.get("affinity").filter(|a| !a.is_null()) else {
        return;
    };
    let required = "requiredDuringSchedulingIgnoredDuringExecution";
    let present = |kind: &str| {
        affinity
            .get(kind)
            .and_then(|k| k.get(required))
            .is_some_and(|r| match r {
                Value::Null => false,
                Value::Array(a) => !a.is_empty(),
                _ => true,
            })
    };
    if present("nodeAffinity") {
        c.push(
            Category::Invalid,
            Cause::new(
                format!("{path}.affinity.nodeAffinity.{required}"),
                codes::UNSUPPORTED,
                format!(
                    "required node affinity is not supported by vmplane: it would be ignored and \
                     the VM placed on any node; use {path}.nodeSelector, which vmplane honours"
                ),
            ),
        );
    }
    for (kind, what) in [
        ("podAffinity", "pod affinity"),
        ("podAntiAffinity", "pod anti-affinity"),
    ] {
        if present(kind) {
            c.push(
                Category::Invalid,
                Cause::new(
                    format!("{path}.affinity.{kind}.{required}"),
                    codes::UNSUPPORTED,
                    format!(
                        "required {what} is not supported by vmplane: vmplane does not place VMs \
                         by what else runs on a node, so the rule would be ignored; use \
                         {path}.nodeSelector, which vmplane honours"
                    ),
                ),
            );
        }
    }
}

/// Reports each name of the list at `base`.`field` that an earlier item has.
fn unique<'a>(names: impl Iterator<Item = &'a str>, base: &str, field: &str, c: &mut Causes) {
    let mut seen: Vec<(&str, usize)> = Vec::new();
    for (i, n) in names.enumerate() {
        if let Some((_, first)) = seen.iter().find(|(m, _)| *m == n) {
            let path = format!("{base}.{field}");
            c.invalid(
                format!("{path}[{i}].name"),
                codes::DUPLICATE,
                format!("{path}[{first}] and {path}[{i}] must not have the same Name."),
            );
        } else {
            seen.push((n, i));
        }
    }
}

fn is_mac(s: &str) -> bool {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Why `name` is not a valid object name (a lowercase RFC 1123 subdomain of at most
/// [`NAME_BYTES_MAX`] characters), if it is not: for requests that name an object.
#[must_use]
pub fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("is required".to_owned());
    }
    dns_subdomain(name, NAME_BYTES_MAX)
}

/// Why `namespace` is not a valid namespace (a lowercase RFC 1123 label of at most
/// [`NAMESPACE_BYTES_MAX`] characters), if it is not.
#[must_use]
pub fn namespace_problem(namespace: &str) -> Option<String> {
    dns_label(namespace)
}

/// Characters of a value a message quotes at most: a message that repeated the whole of a
/// long value would grow past what a gRPC client accepts in a status (some refuse one over
/// 8 or 16 KiB of metadata) and say no more.
pub const SHOWN_CHARS_MAX: usize = 64;

/// `value` quoted for a message: whole if short, else its first [`SHOWN_CHARS_MAX`]
/// characters and how long it is.
#[must_use]
pub fn shown(value: &str) -> String {
    match value.char_indices().nth(SHOWN_CHARS_MAX) {
        None => format!("{value:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes)", &value[..cut], value.len()),
    }
}

fn dns_label(s: &str) -> Option<String> {
    if s.is_empty() || s.len() > NAMESPACE_BYTES_MAX {
        return Some(format!(
            "must be no more than {NAMESPACE_BYTES_MAX} characters"
        ));
    }
    let ok = s
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    (!ok).then(|| "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character".to_owned())
}

/// Why `s` is not a lowercase RFC 1123 subdomain of at most `max` characters, if it is not.
pub(crate) fn dns_subdomain(s: &str, max: usize) -> Option<String> {
    if s.len() > max {
        return Some(format!("must be no more than {max} characters"));
    }
    let ok = s.split('.').all(|part| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !part.starts_with('-')
            && !part.ends_with('-')
    });
    (!ok).then(|| "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character".to_owned())
}

/// Turns a [`Rejection`] from several validators into one with all causes.
pub fn merge(results: impl IntoIterator<Item = Result<(), Rejection>>) -> Result<(), Rejection> {
    let mut c = Causes::new();
    for r in results {
        if let Err(e) = r {
            c.extend(e);
        }
    }
    c.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_value_is_quoted_whole_and_a_long_one_cut_with_its_length() {
        assert_eq!(shown("demo"), "\"demo\"");
        let long = "é".repeat(1000);
        let said = shown(&long);
        assert!(said.starts_with(&format!("\"{}\"…", "é".repeat(SHOWN_CHARS_MAX))));
        assert!(said.ends_with("(2000 bytes)"), "{said}");
    }

    #[test]
    fn a_name_or_namespace_that_cannot_be_one_says_why() {
        assert_eq!(name_problem("vm-1.a"), None);
        assert_eq!(name_problem("").as_deref(), Some("is required"));
        assert!(name_problem("BAD_NAME").is_some());
        assert!(name_problem(&"a".repeat(254)).is_some());
        assert_eq!(namespace_problem("team-a"), None);
        assert!(namespace_problem("a.b").is_some());
        assert!(namespace_problem("A B").is_some());
    }
}
