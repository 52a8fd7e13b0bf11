//! Limits on input from outside, each with its unit in its name (TigerBeetle style).
//!
//! Every manifest goes through [`crate::types::parse_documents`], which checks the byte size before it parses,
//! and then the structural limits below; [`crate::validate`] checks the counts and lengths.
//! Nothing from outside can make core allocate more than a small multiple of
//! [`MANIFEST_BYTES_MAX`].

/// Largest manifest file (all documents together) accepted, in bytes. Checked before parsing.
pub const MANIFEST_BYTES_MAX: usize = 1024 * 1024;
/// Most documents in one multi-document file.
pub const MANIFEST_DOCUMENTS_MAX: usize = 1024;
/// Deepest nesting of maps and lists in one document (KubeVirt VMs need about 12).
pub const MANIFEST_DEPTH_MAX: usize = 64;
/// Most JSON nodes (maps, lists, scalars) in one document, after YAML aliases are expanded.
/// Together with serde_yaml's own alias-repetition limit this stops "billion laughs".
pub const MANIFEST_NODES_MAX: usize = 200_000;
/// Longest string value or key anywhere in a manifest, in bytes (cloud-init user data is the
/// longest legitimate one; Kubernetes caps a whole object near 1.5 MiB).
pub const MANIFEST_STRING_BYTES_MAX: usize = 512 * 1024;
/// Longest object name (Kubernetes DNS-1123 subdomain), in bytes.
pub const NAME_BYTES_MAX: usize = 253;
/// Longest namespace (DNS-1123 label), in bytes.
pub const NAMESPACE_BYTES_MAX: usize = 63;
/// Longest label or annotation key, in bytes (prefix 253 + '/' + name 63).
pub const LABEL_KEY_BYTES_MAX: usize = 317;
/// Longest label value, in bytes.
pub const LABEL_VALUE_BYTES_MAX: usize = 63;
/// Most labels plus annotations on one object.
pub const METADATA_ENTRIES_MAX: usize = 256;
/// Most disks in one VM template.
pub const DISKS_MAX: usize = 256;
/// Most volumes in one VM template.
pub const VOLUMES_MAX: usize = 256;
/// Most network interfaces in one VM template.
pub const INTERFACES_MAX: usize = 64;
/// Most networks in one VM template.
pub const NETWORKS_MAX: usize = 64;
/// Longest firmware serial, in bytes (SMBIOS strings are short in practice).
pub const FIRMWARE_SERIAL_BYTES_MAX: usize = 256;
/// Most entries in `featureGates`, and in `disabledFeatureGates`, of the cluster configuration
/// (KubeVirt registers under 100 gates).
pub const FEATURE_GATES_PER_LIST_MAX: usize = 256;
/// Most vCPUs one VM may ask for.
pub const VCPUS_MAX: u64 = 1024;
/// Longest quantity string (`"1.5Gi"`), in bytes.
pub const QUANTITY_BYTES_MAX: usize = 64;
/// Crash-loop backoff: the longest wait before a VMI is started again, in seconds
/// (KubeVirt's `defaultMaxCrashLoopBackoffDelaySeconds`).
pub const CRASH_LOOP_BACKOFF_SECONDS_MAX: i64 = 300;
/// Crash-loop backoff: the shortest wait after the first failure, in seconds.
pub const CRASH_LOOP_BACKOFF_SECONDS_MIN: i64 = 10;
/// How long a `WaitGracePeriod` restore waits for its running target to stop before it fails,
/// in seconds (KubeVirt's `DefaultGracePeriod`, 5 minutes).
pub const RESTORE_TARGET_GRACE_PERIOD_SECONDS: i64 = 300;
/// Most JSON patches in one restore's or clone's `spec.patches`.
pub const PATCHES_MAX: usize = 256;
/// Most entries in one label or annotation filter list of a clone.
pub const CLONE_FILTERS_MAX: usize = 256;
/// Length of the random suffix of a clone's generated target name (`<source>-clone-xxxxx`).
pub const CLONE_TARGET_SUFFIX_CHARS: usize = 5;
