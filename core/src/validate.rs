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
                Some(s) => vmi_spec(s, "spec.template.spec", &mut c),
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
        None | Some("") => c.invalid(
            "metadata.name",
            codes::REQUIRED,
            "Required value: name or generateName is required",
        ),
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
    for (what, map, value_max) in [
        ("labels", &m.labels, Some(LABEL_VALUE_BYTES_MAX)),
        ("annotations", &m.annotations, None),
    ] {
        for (k, v) in map.iter().flatten() {
            let field = format!("{path}.{what}.{k}");
            if k.is_empty() || k.len() > LABEL_KEY_BYTES_MAX {
                c.invalid(
                    field.clone(),
                    codes::INVALID_VALUE,
                    format!("key must be 1 to {LABEL_KEY_BYTES_MAX} characters"),
                );
            }
            match v {
                Value::String(s) => {
                    if let Some(max) = value_max
                        && s.len() > max
                    {
                        c.invalid(
                            field,
                            codes::TOO_MANY,
                            format!("must be no more than {max} characters"),
                        );
                    }
                }
                _ => c.invalid(field, codes::INVALID_VALUE, "must be a string"),
            }
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
                let parsed = match v {
                    Value::String(t) => Quantity::parse(t).map(|_| ()).map_err(|e| e.to_string()),
                    Value::Number(_) => Ok(()),
                    _ => Err("must be a quantity".to_owned()),
                };
                if let Err(why) = parsed {
                    c.invalid(
                        format!("{domain}.resources.{what}.{k}"),
                        codes::BAD_QUANTITY,
                        why,
                    );
                }
            }
        }
    }
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
        if let Some(serial) = fw.serial.as_deref()
            && serial.len() > FIRMWARE_SERIAL_BYTES_MAX
        {
            c.invalid(
                format!("{domain}.firmware.serial"),
                codes::TOO_MANY,
                format!("must be no more than {FIRMWARE_SERIAL_BYTES_MAX} characters"),
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
