//! A [`ControlPlane`] for tests over the real log and the real domain: a
//! `vmplane_store::SledLog` in a directory, `core`'s `decide` for every command and `fold` /
//! `evolve` for every state — the tests' stand-in for the gateway's command path. States are
//! kept folded in memory behind one lock (appends run outside it, so concurrent commands on
//! different streams commit as a group) and rebuilt from the log when the control plane is
//! opened again (a vmplane restart).
//!
//! Also used by `examples/reconcile_1000.rs` (through `#[path]`).

#![allow(dead_code)]

use std::collections::{BTreeMap, HashSet};
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use uuid::Uuid;
use vmplane_core::aggregate::object::{self, ObjectState};
use vmplane_core::{
    Ctx, Decision, Features, PutVm, VmCommand, VmState, VmiCommand, VmiState, streams, types, vm,
    vmi,
};
use vmplane_hypervisor::{ControlPlane, ControlPlaneError, Executed, RECONCILER_ACTOR};
use vmplane_store::{AppendRequest, EventLog, ExpectedRevision, Position, ProposedEvent, SledLog};

/// The states folded from the log so far.
#[derive(Default)]
struct Folded {
    vms: BTreeMap<String, VmState>,
    vmis: BTreeMap<String, VmiState>,
    cluster: ObjectState,
    /// Every VMI uid the log recorded (`VmiLaunched`, `VmiCreated`).
    vmi_uids: HashSet<Uuid>,
}

impl Folded {
    fn note(&mut self, event: &vmplane_core::Event) {
        match event {
            vmplane_core::Event::VmiLaunched(e) => {
                self.vmi_uids.insert(e.vmi_uid);
            }
            vmplane_core::Event::VmiCreated(e) => {
                self.vmi_uids.insert(e.uid);
            }
            _ => {}
        }
    }
}

/// The control plane of the tests.
pub struct LogControlPlane {
    log: Arc<dyn EventLog>,
    folded: Mutex<Folded>,
    /// Added to the system clock: tests move time forward (crash-loop backoff, grace periods).
    clock_offset_ms: AtomicI64,
    seed: AtomicU64,
}

impl LogControlPlane {
    /// Opens (or reopens) the log in `dir` and folds every stream in it.
    pub fn open(dir: &Path) -> Arc<LogControlPlane> {
        let log: Arc<dyn EventLog> = Arc::new(SledLog::open(dir).expect("open the log"));
        let mut folded = Folded::default();
        log.scan(Position(0), &mut |e| {
            let event = vmplane_core::decode(e.event_type, e.schema_version, e.payload)
                .expect("events in the log decode");
            folded.note(&event);
            if e.stream.starts_with("vm/") {
                let s = folded.vms.remove(e.stream).unwrap_or_default();
                folded
                    .vms
                    .insert(e.stream.to_owned(), vm::evolve(s, &event));
            } else if e.stream.starts_with("vmi/") {
                let s = folded.vmis.remove(e.stream).unwrap_or_default();
                folded
                    .vmis
                    .insert(e.stream.to_owned(), vmi::evolve(s, &event));
            } else if e.stream == "cluster/config" {
                folded.cluster = object::evolve(std::mem::take(&mut folded.cluster), &event);
            }
            ControlFlow::Continue(())
        })
        .expect("scan the log");
        Arc::new(LogControlPlane {
            log,
            folded: Mutex::new(folded),
            clock_offset_ms: AtomicI64::new(0),
            seed: AtomicU64::new(1),
        })
    }

    /// Moves this control plane's clock forward.
    pub fn advance_secs(&self, secs: i64) {
        self.clock_offset_ms
            .fetch_add(secs * 1000, Ordering::SeqCst);
    }

    /// The log's last position (how many events it holds).
    pub fn head(&self) -> u64 {
        self.log.head().0
    }

    /// Every envelope's actor after `after`, with the event type.
    pub fn actors_after(&self, after: u64) -> Vec<(String, String)> {
        let mut out = Vec::new();
        self.log
            .scan(Position(after), &mut |e| {
                out.push((e.actor.to_owned(), e.event_type.to_owned()));
                ControlFlow::Continue(())
            })
            .expect("scan");
        out
    }

    /// The event types of `stream`, in order.
    pub fn event_types(&self, stream: &str) -> Vec<String> {
        let mut out = Vec::new();
        self.log
            .scan(Position(0), &mut |e| {
                if e.stream == stream {
                    out.push(e.event_type.to_owned());
                }
                ControlFlow::Continue(())
            })
            .expect("scan");
        out
    }

    /// The folded state of VM `namespace/name`.
    pub fn vm(&self, namespace: &str, name: &str) -> VmState {
        self.lock()
            .vms
            .get(&streams::vm(namespace, name))
            .cloned()
            .unwrap_or_default()
    }

    /// The folded state of standalone VMI `namespace/name`.
    pub fn vmi(&self, namespace: &str, name: &str) -> VmiState {
        self.lock()
            .vmis
            .get(&streams::vmi(namespace, name))
            .cloned()
            .unwrap_or_default()
    }

    /// Applies a VM manifest as user `alice`.
    pub fn apply_vm(&self, yaml: &str) -> VmState {
        let types::Manifest::VirtualMachine(manifest) =
            types::parse_manifest(yaml.as_bytes()).expect("a manifest")
        else {
            panic!("not a VirtualMachine: {yaml}");
        };
        let namespace = manifest
            .metadata
            .namespace
            .clone()
            .unwrap_or("default".into());
        let name = manifest.metadata.name.clone().unwrap_or_default();
        let command = VmCommand::Apply(Box::new(PutVm::new(*manifest)));
        self.user_vm(&namespace, &name, command)
    }

    /// Creates a standalone VMI as user `alice`.
    pub fn create_vmi(&self, yaml: &str) -> VmiState {
        let types::Manifest::VirtualMachineInstance(manifest) =
            types::parse_manifest(yaml.as_bytes()).expect("a manifest")
        else {
            panic!("not a VirtualMachineInstance: {yaml}");
        };
        let namespace = manifest
            .metadata
            .namespace
            .clone()
            .unwrap_or("default".into());
        let name = manifest.metadata.name.clone().unwrap_or_default();
        self.run_vmi(&namespace, &name, &VmiCommand::Create(manifest), "alice")
            .expect("create the VMI")
            .state
    }

    /// Runs a user's command (start, stop, restart, delete, …) on a VM, as `alice`.
    pub fn user_vm(&self, namespace: &str, name: &str, command: VmCommand) -> VmState {
        self.run_vm(namespace, name, &command, "alice")
            .unwrap_or_else(|e| panic!("{command:?} on {namespace}/{name}: {e}"))
            .state
    }

    /// Deletes a standalone VMI, as `alice`.
    pub fn delete_vmi(&self, namespace: &str, name: &str) -> VmiState {
        self.run_vmi(namespace, name, &VmiCommand::Delete, "alice")
            .expect("delete the VMI")
            .state
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Folded> {
        self.folded.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ctx(&self) -> Ctx {
        let now_ms = self.now_ms();
        let now = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(now_ms)
            .expect("a representable time");
        Ctx::seeded(now, self.seed.fetch_add(1, Ordering::SeqCst))
    }

    fn run_vm(
        &self,
        namespace: &str,
        name: &str,
        command: &VmCommand,
        actor: &str,
    ) -> Result<Executed<VmState>, ControlPlaneError> {
        let stream = streams::vm(namespace, name);
        let state = self.lock().vms.get(&stream).cloned().unwrap_or_default();
        let decision = vm::decide(&state, command, &mut self.ctx())?;
        // Appended outside the lock, so commands on different streams commit as a group;
        // the expected revision catches a concurrent command on the same stream.
        let events_appended = self.append(&stream, state.revision, &decision, actor)?;
        let state = decision.events.iter().fold(state, vm::evolve);
        let mut folded = self.lock();
        decision.events.iter().for_each(|e| folded.note(e));
        let newer = folded
            .vms
            .get(&stream)
            .is_none_or(|s| s.revision < state.revision);
        if newer {
            folded.vms.insert(stream, state.clone());
        }
        Ok(Executed {
            state,
            events_appended,
        })
    }

    fn run_vmi(
        &self,
        namespace: &str,
        name: &str,
        command: &VmiCommand,
        actor: &str,
    ) -> Result<Executed<VmiState>, ControlPlaneError> {
        let stream = streams::vmi(namespace, name);
        let state = self.lock().vmis.get(&stream).cloned().unwrap_or_default();
        let decision = vmi::decide(&state, command, &mut self.ctx())?;
        // Appended outside the lock, so commands on different streams commit as a group;
        // the expected revision catches a concurrent command on the same stream.
        let events_appended = self.append(&stream, state.revision, &decision, actor)?;
        let state = decision.events.iter().fold(state, vmi::evolve);
        let mut folded = self.lock();
        decision.events.iter().for_each(|e| folded.note(e));
        let newer = folded
            .vmis
            .get(&stream)
            .is_none_or(|s| s.revision < state.revision);
        if newer {
            folded.vmis.insert(stream, state.clone());
        }
        Ok(Executed {
            state,
            events_appended,
        })
    }

    /// Appends a decision's events (and claims) at the revision it was based on.
    fn append(
        &self,
        stream: &str,
        revision: u64,
        decision: &Decision,
        actor: &str,
    ) -> Result<usize, ControlPlaneError> {
        if decision.events.is_empty() {
            return Ok(0);
        }
        let correlation_id = Uuid::now_v7();
        let events = decision
            .events
            .iter()
            .map(|event| {
                let encoded = vmplane_core::encode(event);
                ProposedEvent {
                    id: Uuid::now_v7(),
                    event_type: encoded.type_name.to_owned(),
                    schema_version: encoded.version,
                    payload: encoded.bytes,
                    actor: actor.to_owned(),
                    correlation_id,
                    causation_id: None,
                }
            })
            .collect();
        let mut request = AppendRequest::new(stream, ExpectedRevision::Exact(revision), events);
        for claim in &decision.claims {
            request = request.with_claim(match claim {
                vmplane_core::Claim::Acquire { key, owner } => vmplane_store::Claim::Acquire {
                    key: key.clone(),
                    owner: owner.clone(),
                },
                vmplane_core::Claim::Release { key, owner } => vmplane_store::Claim::Release {
                    key: key.clone(),
                    owner: owner.clone(),
                },
            });
        }
        self.log
            .append(request)
            .map_err(|e| ControlPlaneError::Unavailable(e.to_string()))?;
        Ok(decision.events.len())
    }
}

impl ControlPlane for LogControlPlane {
    fn vms(&self) -> Result<Vec<VmState>, ControlPlaneError> {
        Ok(self
            .lock()
            .vms
            .values()
            .filter(|s| s.is_live() || s.run.vmi.is_some())
            .cloned()
            .collect())
    }

    fn standalone_vmis(&self) -> Result<Vec<VmiState>, ControlPlaneError> {
        Ok(self.lock().vmis.values().cloned().collect())
    }

    fn features(&self) -> Result<Features, ControlPlaneError> {
        Ok(Features::from_cluster(&self.lock().cluster))
    }

    fn recorded_vmis(&self, uids: &[Uuid]) -> Result<HashSet<Uuid>, ControlPlaneError> {
        let folded = self.lock();
        Ok(uids
            .iter()
            .filter(|u| folded.vmi_uids.contains(u))
            .copied()
            .collect())
    }

    fn execute(
        &self,
        namespace: &str,
        name: &str,
        command: VmCommand,
    ) -> Result<Executed<VmState>, ControlPlaneError> {
        self.run_vm(namespace, name, &command, RECONCILER_ACTOR)
    }

    fn execute_vmi(
        &self,
        namespace: &str,
        name: &str,
        command: VmiCommand,
    ) -> Result<Executed<VmiState>, ControlPlaneError> {
        self.run_vmi(namespace, name, &command, RECONCILER_ACTOR)
    }

    fn now_ms(&self) -> i64 {
        let system = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        system + self.clock_offset_ms.load(Ordering::SeqCst)
    }
}
