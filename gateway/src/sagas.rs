//! The snapshot, restore and clone sagas (semantics.md §5, core's `dataprotection`): the
//! gateway side of core's pure `SagaDecision`s.
//!
//! One step: load the inputs (the saga's own stream; the snapshot/source stream and the target
//! VM stream from `restore::input_streams`/`clone::input_streams`; for a restore the holder of
//! the claim `firmware-uuid/<restore::uuid_to_check>`; the cluster's effective features; for a
//! snapshot the source VM folded at one log position), decide `Progress`, and append to the
//! saga stream at the revision it was read at ([`CommandHandler::execute_step`]). Then follow
//! `Next`:
//!
//! * `ApplyToTarget { stream, command }`: the VM command goes through the ordinary command path
//!   (instancetype resolution, claims). Refused (or its append failed) → `TargetRejected` on
//!   the saga stream (a refused `Stop` under `StopTarget` records nothing there: core says so).
//!   Either way `Progress` runs again with the target reloaded.
//! * `RetryAt { at_ms }`, `WaitForChange`: the saga is parked in the driver's pending set.
//! * `Done`: finished.
//!
//! The driver ([`SagaDriver`]) is a thread: it re-drives every parked saga whose deadline
//! passed, and the ones waiting for a change after every accepted write ([`Sagas::poke`]) and
//! at least every [`RESYNC`] (the reconciler writes too). At start it finds every unfinished
//! snapshot, restore and clone in the log and drives it, so a saga survives a restart: every
//! step is recorded, and core rebuilds the same target command from the recorded plan.
//!
//! A saga acts for whoever asked for it, the driver's steps included: they carry as actor the
//! principal who created the saga object (the actor of its latest `ObjectCreated`), and as
//! causation id that creation event's id, which tells them from the steps a request made (those
//! have none). Each drive has a correlation id of its own ([`Sagas::requester`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use vmplane_core::types::{GenericObject, Kind, Manifest};
use vmplane_core::{
    CloneCommand, CloneInput, CloneSource, Decision, Event, Next, RestoreCommand, RestoreInput,
    SagaDecision, SnapshotCommand, SnapshotState, TakeSnapshot, VmState, clone, restore, snapshot,
};
use vmplane_projections::Projections;
use vmplane_projections::command::{Command, CommandError, CommandHandler, CommandMeta, Executed};
use vmplane_projections::model::{AggState, decode, parse_stream, stream_of};
use vmplane_store::Direction;

/// How often parked sagas waiting for a change are re-driven without a poke.
pub const RESYNC: Duration = Duration::from_secs(1);
/// Steps one drive makes at most before it parks the saga (a guard against a livelock).
pub const STEPS_MAX: usize = 16;
/// The actor of the driver's steps on a saga whose creation it cannot find (its stream holds
/// no `ObjectCreated`); otherwise the driver acts for the saga's requester
/// ([`Sagas::requester`]).
pub const DRIVER_ACTOR: &str = "system:saga-driver";

/// One saga: kind (snapshot, restore, clone), namespace, name.
pub type SagaKey = (Kind, String, String);

/// Whether `kind` is run as a saga by `apply`.
#[must_use]
pub fn is_saga_kind(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::VirtualMachineSnapshot | Kind::VirtualMachineRestore | Kind::VirtualMachineClone
    )
}

#[derive(Default)]
struct Pending {
    /// Parked sagas: `Some(at_ms)` for `RetryAt`, `None` for `WaitForChange` (or a failed
    /// drive, retried at the next resync).
    parked: BTreeMap<SagaKey, Option<i64>>,
    /// A write since the driver last re-drove the parked sagas.
    poked: bool,
    /// Writes so far (pokes): a saga that parks after a write it may not have seen is
    /// re-driven at once, not at the next resync.
    pokes: u64,
}

/// The saga runner shared by the API and the driver thread.
pub struct Sagas {
    commands: Arc<CommandHandler>,
    projections: Arc<Projections>,
    pending: Mutex<Pending>,
    wake: Condvar,
    stop: AtomicBool,
}

impl std::fmt::Debug for Sagas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sagas").finish_non_exhaustive()
    }
}

/// The result of driving a saga as far as it goes now.
#[derive(Debug, Clone)]
pub struct Driven {
    /// The first step on the saga stream (its outcome is the request's: `created`, …).
    pub first: Executed,
    /// The position a read must reach to see every step.
    pub position: vmplane_store::Position,
    /// Where the saga stopped.
    pub next: Next,
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn vm_state(state: &AggState) -> VmState {
    match state {
        AggState::Vm(s) => (**s).clone(),
        _ => VmState::default(),
    }
}

fn snapshot_state(state: &AggState) -> SnapshotState {
    match state {
        AggState::Snapshot(s) => (**s).clone(),
        _ => SnapshotState::default(),
    }
}

fn unfit() -> CommandError {
    vmplane_core::Rejection::invalid(
        "kind",
        vmplane_core::codes::UNSUPPORTED_KIND,
        "the saga step does not fit the stream's kind",
    )
    .into()
}

impl Sagas {
    /// A runner over the command path and the projections (for the effective features).
    #[must_use]
    pub fn new(commands: Arc<CommandHandler>, projections: Arc<Projections>) -> Arc<Sagas> {
        Arc::new(Sagas {
            commands,
            projections,
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        })
    }

    /// Something was written: sagas waiting for a change are re-driven. With none parked there
    /// is nothing to re-drive (a poke only re-drives parked sagas; a new saga is driven by its
    /// `start` and parks itself if it must wait), so the driver is not woken: every write of a
    /// busy server pokes.
    pub fn poke(&self) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.pokes = pending.pokes.wrapping_add(1);
        if pending.parked.is_empty() {
            return;
        }
        pending.poked = true;
        drop(pending);
        self.wake.notify_all();
    }

    /// Sagas parked now (kind, namespace, name → `RetryAt` deadline).
    #[must_use]
    pub fn parked(&self) -> Vec<(SagaKey, Option<i64>)> {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .parked
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    fn features(&self) -> Result<vmplane_core::features::Features, CommandError> {
        Ok((*self.projections.features_at(None)?).clone())
    }

    /// Starts (or continues) the saga `manifest` describes and drives it as far as it goes.
    pub fn start(
        &self,
        meta: &CommandMeta,
        kind: Kind,
        namespace: &str,
        manifest: GenericObject,
    ) -> Result<Driven, CommandError> {
        let name = manifest.metadata.name_str().to_owned();
        self.drive(meta, &(kind, namespace.to_owned(), name), Some(manifest))
    }

    /// Drives one saga until it is done or has to wait; parks or unparks it accordingly.
    pub fn drive(
        &self,
        meta: &CommandMeta,
        key: &SagaKey,
        manifest: Option<GenericObject>,
    ) -> Result<Driven, CommandError> {
        let meta = CommandMeta {
            correlation_id: Some(
                meta.correlation_id
                    .or(meta.request_id)
                    .unwrap_or_else(uuid::Uuid::now_v7),
            ),
            request_id: None,
            ..meta.clone()
        };
        let pokes_before = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pokes;
        let result = self.run(&meta, key, manifest);
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        match &result {
            Ok(d) => match d.next {
                Next::Done => {
                    pending.parked.remove(key);
                }
                Next::RetryAt { at_ms } => {
                    pending.parked.insert(key.clone(), Some(at_ms));
                }
                Next::WaitForChange | Next::ApplyToTarget { .. } => {
                    pending.parked.insert(key.clone(), None);
                }
            },
            // Nothing recorded the saga's creation: nothing to resume.
            Err(_) if !self.exists(key) => {
                pending.parked.remove(key);
            }
            Err(_) => {
                pending.parked.insert(key.clone(), None);
            }
        }
        if pending.parked.contains_key(key) && pending.pokes != pokes_before {
            // Something was written while this step ran: what it waits for may have happened.
            pending.poked = true;
        }
        drop(pending);
        self.wake.notify_all();
        result
    }

    /// Who the driver acts for on `key`: the principal who created the saga object (the
    /// actor of the latest `ObjectCreated` on its stream: a deleted and re-created saga is its
    /// new requester's), with that event's id as causation id (the driver's steps follow from
    /// the creation, not from a request of their own). [`DRIVER_ACTOR`], without a causation
    /// id, when the stream holds no creation. A log that cannot be read is an error: the drive
    /// is retried rather than recorded under another actor.
    pub fn requester(&self, key: &SagaKey) -> Result<CommandMeta, CommandError> {
        let stream = stream_of(key.0, &key.1, &key.2);
        let log = self.projections.log();
        let read_max = log.limits().read_events_max.max(1);
        let mut from = u64::MAX;
        loop {
            let events = log.read_stream(&stream, from, Direction::Backward, read_max)?;
            for event in &events {
                if let Event::ObjectCreated(_) = decode(&event.as_ref())? {
                    return Ok(CommandMeta {
                        actor: event.actor.clone(),
                        causation_id: Some(event.id),
                        ..CommandMeta::default()
                    });
                }
            }
            match events.last() {
                Some(last) if events.len() >= read_max && last.revision > 1 => {
                    from = last.revision - 1;
                }
                _ => break,
            }
        }
        Ok(CommandMeta {
            actor: DRIVER_ACTOR.to_owned(),
            ..CommandMeta::default()
        })
    }

    /// One drive by the driver thread, for the saga's requester ([`Sagas::requester`]).
    fn drive_for_requester(&self, key: &SagaKey) -> Result<Driven, CommandError> {
        // Unreadable: the saga stays parked and is retried at the next wake.
        let meta = self.requester(key)?;
        self.drive(&meta, key, None)
    }

    fn exists(&self, key: &SagaKey) -> bool {
        let stream = stream_of(key.0, &key.1, &key.2);
        matches!(self.commands.load(&stream, key.0), Ok((s, _)) if s.state.is_live())
    }

    fn run(
        &self,
        meta: &CommandMeta,
        key: &SagaKey,
        mut manifest: Option<GenericObject>,
    ) -> Result<Driven, CommandError> {
        let (kind, namespace, name) = key;
        let stream = stream_of(*kind, namespace, name);
        let mut first: Option<Executed> = None;
        let mut position = vmplane_store::Position(0);
        let note = |done: &Executed,
                    first: &mut Option<Executed>,
                    position: &mut vmplane_store::Position| {
            *position = (*position).max(done.position);
            if first.is_none() {
                *first = Some(done.clone());
            }
        };
        for _ in 0..STEPS_MAX {
            let (done, next) = self
                .commands
                .execute_step(meta, &stream, *kind, |state, ctx| {
                    let d = self.progress(state, manifest.as_ref(), ctx)?;
                    Ok((d.decision, d.next))
                })?;
            note(&done, &mut first, &mut position);
            manifest = None;
            match next {
                Next::ApplyToTarget {
                    stream: target,
                    command,
                } => {
                    let Some(parsed) = parse_stream(&target) else {
                        return Err(unfit());
                    };
                    let command = Command::Vm {
                        namespace: parsed.namespace.unwrap_or("default").to_owned(),
                        name: parsed.name.to_owned(),
                        command,
                    };
                    match self.commands.execute(meta, command) {
                        Ok(applied) => position = position.max(applied.position),
                        Err(CommandError::Rejected(rejection)) => {
                            let (done, after) = self.commands.execute_step(
                                meta,
                                &stream,
                                *kind,
                                |state, ctx| {
                                    let d = rejected(state, &rejection, ctx)?;
                                    Ok((d.decision, d.next))
                                },
                            )?;
                            note(&done, &mut first, &mut position);
                            // A refused `Stop` (StopTarget) records nothing: wait for the
                            // target to change rather than asking again at once.
                            if after == Next::WaitForChange {
                                return Ok(Driven {
                                    first: first.unwrap_or(done),
                                    position,
                                    next: after,
                                });
                            }
                        }
                        Err(other) => return Err(other),
                    }
                }
                next => {
                    let first = first.unwrap_or(done);
                    return Ok(Driven {
                        first,
                        position,
                        next,
                    });
                }
            }
        }
        let first = first.ok_or_else(unfit)?;
        Ok(Driven {
            first,
            position,
            next: Next::WaitForChange,
        })
    }

    /// One `Progress` (or `Take`) decision on the saga stream's `state`, with its inputs read
    /// now.
    fn progress(
        &self,
        state: &AggState,
        manifest: Option<&GenericObject>,
        ctx: &mut vmplane_core::Ctx,
    ) -> Result<SagaDecision, CommandError> {
        match state {
            AggState::Snapshot(s) => {
                let spec_source = match manifest {
                    Some(m) => source_name(m),
                    None => s.source().map(|r| r.name),
                };
                let ns = match manifest {
                    Some(m) => m.metadata.namespace.clone(),
                    None => s.object.namespace.clone(),
                }
                .unwrap_or_else(|| "default".to_owned());
                let (source, source_position) = match spec_source {
                    Some(src) => {
                        let head = self.commands.head();
                        let (snap, revision) = self.commands.load(
                            &stream_of(Kind::VirtualMachine, &ns, &src),
                            Kind::VirtualMachine,
                        )?;
                        let position = if revision.is_some() {
                            snap.position
                        } else {
                            head
                        };
                        (vm_state(&snap.state), position.0)
                    }
                    None => (VmState::default(), self.commands.head().0),
                };
                let command = SnapshotCommand::Take(Box::new(TakeSnapshot {
                    manifest: manifest.cloned(),
                    source,
                    source_position,
                    features: self.features()?,
                }));
                let decision = snapshot::decide(s, &command, ctx)?;
                Ok(SagaDecision {
                    decision,
                    next: Next::Done,
                })
            }
            AggState::Restore(s) => {
                let Some((snap_stream, target_stream)) = restore::input_streams(s, manifest) else {
                    // An unreadable spec: let core say why.
                    return Ok(restore::decide(
                        s,
                        &RestoreCommand::Progress(Box::new(RestoreInput {
                            manifest: manifest.cloned(),
                            snapshot: SnapshotState::default(),
                            target: VmState::default(),
                            uuid_holder: None,
                            features: self.features()?,
                        })),
                        ctx,
                    )?);
                };
                let snapshot = snapshot_state(
                    &self
                        .commands
                        .load(&snap_stream, Kind::VirtualMachineSnapshot)?
                        .0
                        .state,
                );
                let target = vm_state(
                    &self
                        .commands
                        .load(&target_stream, Kind::VirtualMachine)?
                        .0
                        .state,
                );
                let uuid_holder = match restore::uuid_to_check(&snapshot) {
                    Some(uuid) => self
                        .commands
                        .claim_holder(&format!("firmware-uuid/{uuid}"))?,
                    None => None,
                };
                let input = RestoreInput {
                    manifest: manifest.cloned(),
                    snapshot,
                    target,
                    uuid_holder,
                    features: self.features()?,
                };
                Ok(restore::decide(
                    s,
                    &RestoreCommand::Progress(Box::new(input)),
                    ctx,
                )?)
            }
            AggState::Clone(s) => {
                let features = self.features()?;
                let (source, target) = match clone::input_streams(s, manifest) {
                    None => (
                        CloneSource::VirtualMachine {
                            vm: Box::default(),
                            position: self.commands.head().0,
                        },
                        VmState::default(),
                    ),
                    Some((source_stream, target_name)) => {
                        let head = self.commands.head();
                        let source = if source_stream.starts_with("snapshot/") {
                            let (snap, _) = self
                                .commands
                                .load(&source_stream, Kind::VirtualMachineSnapshot)?;
                            CloneSource::Snapshot(Box::new(snapshot_state(&snap.state)))
                        } else {
                            let (snap, revision) =
                                self.commands.load(&source_stream, Kind::VirtualMachine)?;
                            CloneSource::VirtualMachine {
                                vm: Box::new(vm_state(&snap.state)),
                                position: if revision.is_some() {
                                    snap.position.0
                                } else {
                                    head.0
                                },
                            }
                        };
                        let ns = match manifest {
                            Some(m) => m.metadata.namespace.clone(),
                            None => s.object.namespace.clone(),
                        }
                        .unwrap_or_else(|| "default".to_owned());
                        let target = match target_name {
                            Some(t) => vm_state(
                                &self
                                    .commands
                                    .load(
                                        &stream_of(Kind::VirtualMachine, &ns, &t),
                                        Kind::VirtualMachine,
                                    )?
                                    .0
                                    .state,
                            ),
                            None => VmState::default(),
                        };
                        (source, target)
                    }
                };
                let input = CloneInput {
                    manifest: manifest.cloned(),
                    source,
                    target,
                    features,
                };
                Ok(clone::decide(
                    s,
                    &CloneCommand::Progress(Box::new(input)),
                    ctx,
                )?)
            }
            _ => Err(unfit()),
        }
    }

    /// Every unfinished snapshot, restore and clone in the log, parked for the driver.
    pub fn resume_all(&self) -> Result<usize, CommandError> {
        let mut found = Vec::new();
        for kind in [
            Kind::VirtualMachineSnapshot,
            Kind::VirtualMachineRestore,
            Kind::VirtualMachineClone,
        ] {
            let list = self.projections.list(kind, None, None)?;
            for item in list.items {
                let namespace = item.namespace.clone().unwrap_or_else(|| "default".into());
                let stream = stream_of(kind, &namespace, &item.name);
                let (snap, _) = self.commands.load(&stream, kind)?;
                let unfinished = match &snap.state {
                    AggState::Snapshot(s) => s.is_live() && s.taken.is_none() && s.failed.is_none(),
                    AggState::Restore(s) => s.is_live() && !s.is_finished(),
                    AggState::Clone(s) => s.is_live() && !s.is_finished(),
                    _ => false,
                };
                if unfinished {
                    found.push((kind, namespace, item.name.clone()));
                }
            }
        }
        let n = found.len();
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        for key in found {
            pending.parked.insert(key, None);
        }
        pending.poked = true;
        drop(pending);
        self.wake.notify_all();
        Ok(n)
    }

    /// Starts the driver thread: it resumes unfinished sagas, then re-drives parked ones.
    pub fn spawn(self: &Arc<Self>) -> std::io::Result<SagaDriver> {
        let sagas = self.clone();
        let thread = std::thread::Builder::new()
            .name("saga-driver".into())
            .spawn(move || sagas.driver_loop())?;
        Ok(SagaDriver {
            sagas: self.clone(),
            thread: Some(thread),
        })
    }

    fn driver_loop(&self) {
        match self.resume_all() {
            Ok(0) => {}
            Ok(n) => tracing::info!(sagas = n, "resuming unfinished sagas"),
            Err(err) => tracing::warn!(%err, "could not list unfinished sagas"),
        }
        while !self.stop.load(Ordering::Acquire) {
            let due = {
                let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
                if !pending.poked {
                    let now = now_ms();
                    let next_deadline = pending.parked.values().flatten().min().copied();
                    let wait = match next_deadline {
                        Some(at) if at <= now => Duration::ZERO,
                        Some(at) => RESYNC.min(Duration::from_millis((at - now) as u64)),
                        None => RESYNC,
                    };
                    if !wait.is_zero() {
                        pending = self
                            .wake
                            .wait_timeout(pending, wait)
                            .unwrap_or_else(PoisonError::into_inner)
                            .0;
                    }
                }
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
                pending.poked = false;
                // Every parked saga, on every wake (a poke, a deadline, or the resync: the
                // reconciler's writes are not poked): `RetryAt` means "at that time, or sooner
                // when the target changes", and a step that changes nothing appends nothing.
                pending.parked.keys().cloned().collect::<Vec<_>>()
            };
            for key in due {
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
                if let Err(err) = self.drive_for_requester(&key) {
                    tracing::debug!(kind = key.0.as_str(), namespace = %key.1, name = %key.2, %err, "saga step failed; retrying later");
                }
            }
        }
    }
}

/// The driver thread; dropping it stops and joins it.
pub struct SagaDriver {
    sagas: Arc<Sagas>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for SagaDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SagaDriver").finish_non_exhaustive()
    }
}

impl Drop for SagaDriver {
    fn drop(&mut self) {
        self.sagas.stop.store(true, Ordering::Release);
        self.sagas.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `TargetRejected` on a restore or clone stream.
fn rejected(
    state: &AggState,
    rejection: &vmplane_core::Rejection,
    ctx: &mut vmplane_core::Ctx,
) -> Result<SagaDecision, CommandError> {
    Ok(match state {
        AggState::Restore(s) => restore::decide(
            s,
            &RestoreCommand::TargetRejected {
                rejection: rejection.clone(),
            },
            ctx,
        )?,
        AggState::Clone(s) => clone::decide(
            s,
            &CloneCommand::TargetRejected {
                rejection: rejection.clone(),
            },
            ctx,
        )?,
        _ => SagaDecision {
            decision: Decision::unchanged(),
            next: Next::Done,
        },
    })
}

/// `spec.source.name` of a VirtualMachineSnapshot manifest.
fn source_name(m: &GenericObject) -> Option<String> {
    m.spec
        .as_ref()?
        .pointer("/source/name")?
        .as_str()
        .map(str::to_owned)
}

/// The generic object of a snapshot, restore or clone manifest.
#[must_use]
pub fn generic(manifest: Manifest) -> Option<GenericObject> {
    match manifest {
        Manifest::Object(_, g) => Some(*g),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use vmplane_projections::CommandOptions;
    use vmplane_store::{EventLog, SledLog};

    use super::*;

    fn sagas(dir: &std::path::Path) -> Arc<Sagas> {
        let log: Arc<dyn EventLog> = Arc::new(SledLog::open(dir.join("log")).expect("open log"));
        let projections =
            Projections::open(log.clone(), dir, Default::default()).expect("open projections");
        let commands = Arc::new(CommandHandler::new(
            log,
            projections.cache().clone(),
            CommandOptions::default(),
        ));
        Sagas::new(commands, Arc::new(projections))
    }

    fn restore_manifest(name: &str) -> Manifest {
        vmplane_core::types::parse_manifest(
            format!(
                "apiVersion: snapshot.kubevirt.io/v1beta1\nkind: VirtualMachineRestore\nmetadata: {{name: {name}, namespace: team-a}}\nspec:\n  target: {{apiGroup: kubevirt.io, kind: VirtualMachine, name: larry}}\n  virtualMachineSnapshotName: s1\n"
            )
            .as_bytes(),
        )
        .expect("a restore manifest")
    }

    fn as_actor(actor: &str) -> CommandMeta {
        CommandMeta {
            actor: actor.to_owned(),
            ..CommandMeta::default()
        }
    }

    #[test]
    fn the_driver_acts_for_whoever_created_the_saga_last() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sagas = sagas(dir.path());
        let key: SagaKey = (Kind::VirtualMachineRestore, "team-a".into(), "r1".into());
        // Nothing recorded: nobody to act for.
        let meta = sagas.requester(&key).expect("requester");
        assert_eq!(
            (meta.actor.as_str(), meta.causation_id),
            (DRIVER_ACTOR, None)
        );
        // Created by alice (through the object path: no saga step).
        let created = sagas
            .commands
            .execute(&as_actor("alice"), Command::apply(restore_manifest("r1")))
            .expect("create");
        let alice_created = sagas
            .projections
            .log()
            .read_event(created.position)
            .expect("read")
            .expect("the creation");
        let meta = sagas.requester(&key).expect("requester");
        assert_eq!(meta.actor, "alice");
        assert_eq!(meta.causation_id, Some(alice_created.id));
        assert_eq!(meta.correlation_id, None, "each drive has its own");
        // Deleted by ops, created again by bob: bob's now.
        let delete = Command::Object {
            kind: Kind::VirtualMachineRestore,
            namespace: "team-a".into(),
            name: "r1".into(),
            command: vmplane_core::ObjectCommand::Delete(None),
        };
        sagas
            .commands
            .execute(&as_actor("ops"), delete)
            .expect("delete");
        sagas
            .commands
            .execute(&as_actor("bob"), Command::apply(restore_manifest("r1")))
            .expect("create again");
        assert_eq!(sagas.requester(&key).expect("requester").actor, "bob");
    }

    #[test]
    fn a_write_with_no_saga_parked_wakes_nothing_and_one_with_a_parked_saga_does() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sagas = sagas(dir.path());
        sagas.poke();
        {
            let pending = sagas.pending.lock().expect("lock");
            assert!(!pending.poked, "nothing parked: nothing to re-drive");
            assert_eq!(pending.pokes, 1, "the write is still counted");
        }
        let key: SagaKey = (Kind::VirtualMachineSnapshot, "ns".into(), "s".into());
        sagas.pending.lock().expect("lock").parked.insert(key, None);
        sagas.poke();
        let pending = sagas.pending.lock().expect("lock");
        assert!(pending.poked, "a parked saga is re-driven after a write");
        assert_eq!(pending.pokes, 2);
    }
}
