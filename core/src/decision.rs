//! What `decide` returns: events to append, uniqueness claims the store enforces atomically
//! with the append, and what the command did (for `apply`'s `created|configured|unchanged`).

use crate::event::Event;

/// A cross-stream uniqueness claim. The store applies every claim of a decision atomically
/// with its events: an `Acquire` of a key held by another owner fails the whole append (the
/// gateway reports it as [`crate::Rejection::firmware_uuid_taken`]). Never checked by reading
/// a projection.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Claim {
    /// Take `key` for `owner` (a stream name). Idempotent for the same owner.
    Acquire {
        /// e.g. `firmware-uuid/5a9fc181-957e-5c32-9e5a-2de5e9673531`.
        key: String,
        /// The stream that holds it, e.g. `vm/default/testvm`.
        owner: String,
    },
    /// Give `key` up (only if `owner` holds it).
    Release {
        /// The key.
        key: String,
        /// The stream that held it.
        owner: String,
    },
}

impl Claim {
    /// The claimed key.
    pub fn key(&self) -> &str {
        match self {
            Claim::Acquire { key, .. } | Claim::Release { key, .. } => key,
        }
    }
}

/// What an accepted command did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A new object (or a new life of a deleted name).
    Created,
    /// An existing object changed.
    Configured,
    /// Nothing to do: no events (re-applying an identical manifest).
    Unchanged,
    /// The object was deleted.
    Deleted,
    /// A lifecycle request or observation was recorded.
    Recorded,
}

impl Outcome {
    /// kubectl's word: `created`, `configured`, `unchanged`, `deleted`, `recorded`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Configured => "configured",
            Outcome::Unchanged => "unchanged",
            Outcome::Deleted => "deleted",
            Outcome::Recorded => "recorded",
        }
    }
}

/// The result of an accepted command.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Events to append, in order (empty when [`Outcome::Unchanged`]).
    pub events: Vec<Event>,
    /// Claims to apply atomically with the append.
    pub claims: Vec<Claim>,
    /// What happened.
    pub outcome: Outcome,
    /// A VM decision's state after its events: what folding `events` onto the state it was
    /// decided on gives (`None` for other aggregates, and when there are no events). The
    /// caller may take it instead of folding them again.
    pub vm_after: Option<Box<crate::aggregate::vm::VmState>>,
}

impl Decision {
    /// No events, no claims.
    pub fn unchanged() -> Self {
        Decision {
            events: Vec::new(),
            claims: Vec::new(),
            outcome: Outcome::Unchanged,
            vm_after: None,
        }
    }
}

/// Stream names: one stream per aggregate, named by kind and key.
pub mod streams {
    /// `vm/<namespace>/<name>`: a VM's whole life, including its VMI runs.
    pub fn vm(namespace: &str, name: &str) -> String {
        format!("vm/{namespace}/{name}")
    }
    /// `vmi/<namespace>/<name>`: a standalone VMI (one not owned by a VM).
    pub fn vmi(namespace: &str, name: &str) -> String {
        format!("vmi/{namespace}/{name}")
    }
    /// `cluster/config`: the KubeVirt configuration object.
    pub const CLUSTER_CONFIG: &str = "cluster/config";

    /// The stream a manifest belongs to (its namespace, or `default` when it names none).
    pub fn for_manifest(m: &crate::types::Manifest) -> String {
        let meta = m.metadata();
        let ns = meta
            .namespace
            .as_deref()
            .unwrap_or(crate::defaults::DEFAULT_NAMESPACE);
        for_object(m.kind(), ns, meta.name_str())
    }

    /// The stream of any object of `kind` (namespace ignored for cluster-scoped kinds).
    pub fn for_object(kind: crate::types::Kind, namespace: &str, name: &str) -> String {
        use crate::types::Kind::*;
        let prefix = match kind {
            VirtualMachine => return vm(namespace, name),
            VirtualMachineInstance => return vmi(namespace, name),
            KubeVirt => return CLUSTER_CONFIG.to_owned(),
            VirtualMachineClusterInstancetype => return format!("clusterinstancetype/{name}"),
            VirtualMachineClusterPreference => return format!("clusterpreference/{name}"),
            VirtualMachineInstancetype => "instancetype",
            VirtualMachinePreference => "preference",
            VirtualMachineSnapshot => "snapshot",
            VirtualMachineRestore => "restore",
            VirtualMachineClone => "clone",
            VirtualMachinePool => "pool",
            VirtualMachineInstanceReplicaSet => "replicaset",
            VirtualMachineInstanceMigration => "migration",
        };
        format!("{prefix}/{namespace}/{name}")
    }
}
