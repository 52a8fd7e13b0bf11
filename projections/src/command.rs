//! The command path — the only place in vmplane below the gateway that appends (the gateway and
//! the reconciler both call it): load the aggregate's `(state, revision)`, resolve what the
//! command references, `decide` with a fresh [`Ctx`], append with the revision the decision
//! was based on, and on a concurrent write reload and decide again (at most
//! [`CommandOptions::decide_retries_max`] times).

use std::collections::{HashMap, VecDeque};
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, PoisonError};

use rand::RngCore;
use uuid::Uuid;
use vmplane_core::types::{Kind, Manifest};
use vmplane_core::{
    Ctx, Decision, Event, ObjectCommand, Outcome, Rejection, VmCommand, VmiCommand, object, vm, vmi,
};
use vmplane_store::{
    AppendRequest, AppendResult, EventLog, ExpectedRevision, Position, ProposedEvent, Submitted,
    Timestamp,
};

use crate::cache::StateCache;
use crate::error::Error;
use crate::model::{AggState, Snapshot, stream_of};
use crate::projections::is_another_config;

/// Bounds of the command path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandOptions {
    /// Decisions retried after a concurrent write to the same stream, beyond the first.
    pub decide_retries_max: u32,
    /// Request ids remembered (with their results) for idempotent retries.
    pub recent_requests_max: usize,
}

impl Default for CommandOptions {
    fn default() -> CommandOptions {
        CommandOptions {
            decide_retries_max: 8,
            recent_requests_max: 10_000,
        }
    }
}

/// A command for one aggregate.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// On `vm/<namespace>/<name>`.
    Vm {
        /// The namespace.
        namespace: String,
        /// The name.
        name: String,
        /// What to do.
        command: VmCommand,
    },
    /// On a standalone VMI `vmi/<namespace>/<name>`.
    Vmi {
        /// The namespace.
        namespace: String,
        /// The name.
        name: String,
        /// What to do.
        command: VmiCommand,
    },
    /// On any other managed kind (instancetypes, preferences, snapshots, …, `cluster/config`).
    Object {
        /// The kind.
        kind: Kind,
        /// The namespace (ignored for cluster-scoped kinds).
        namespace: String,
        /// The name.
        name: String,
        /// What to do.
        command: ObjectCommand,
    },
}

impl Command {
    /// The command for a manifest applied with `kubectl apply`'s meaning (create or update).
    #[must_use]
    pub fn apply(manifest: Manifest) -> Command {
        let kind = manifest.kind();
        let namespace = manifest
            .metadata()
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".to_owned());
        let name = manifest.metadata().name_str().to_owned();
        match manifest {
            Manifest::VirtualMachine(vm) => Command::Vm {
                namespace,
                name,
                command: VmCommand::Apply(Box::new(vm::PutVm::new(*vm))),
            },
            Manifest::VirtualMachineInstance(v) => Command::Vmi {
                namespace,
                name,
                command: VmiCommand::Apply(v),
            },
            other => Command::Object {
                kind,
                namespace,
                name,
                command: ObjectCommand::Apply(Box::new(other), None),
            },
        }
    }

    /// The stream the command acts on.
    #[must_use]
    pub fn stream(&self) -> String {
        match self {
            Command::Vm {
                namespace, name, ..
            } => stream_of(Kind::VirtualMachine, namespace, name),
            Command::Vmi {
                namespace, name, ..
            } => stream_of(Kind::VirtualMachineInstance, namespace, name),
            Command::Object {
                kind,
                namespace,
                name,
                ..
            } => stream_of(*kind, namespace, name),
        }
    }

    /// The name of the object the command acts on.
    fn name(&self) -> &str {
        match self {
            Command::Vm { name, .. } | Command::Vmi { name, .. } | Command::Object { name, .. } => {
                name
            }
        }
    }

    /// The kind of the object the command acts on (the stream's, as [`CommandHandler::load`]
    /// takes it).
    #[must_use]
    pub fn kind(&self) -> Kind {
        match self {
            Command::Vm { .. } => Kind::VirtualMachine,
            Command::Vmi { .. } => Kind::VirtualMachineInstance,
            Command::Object { kind, .. } => *kind,
        }
    }
}

/// Who sends a command and how it relates to others.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandMeta {
    /// The principal (`alice`, `system:reconciler`): every event's actor.
    pub actor: String,
    /// Shared by the events of one request (a new one if `None`).
    pub correlation_id: Option<Uuid>,
    /// The event or command that caused this one.
    pub causation_id: Option<Uuid>,
    /// A client's request id: a retry with the same id does not apply the command twice.
    pub request_id: Option<Uuid>,
    /// Carry the command out only if the stream's last event is still at this position (the
    /// object's `metadata.resourceVersion` as the client read it; `Position(0)`: the object
    /// must not exist yet), else refuse it as a conflict. Checked on the state each decision
    /// is made on, and the append is conditional on that state: a read-modify-write (`patch`,
    /// `label`) never loses a change made since the read. Saga steps do not take it.
    pub expected_position: Option<Position>,
    /// What the manifest's own `metadata.uid` and `metadata.resourceVersion` ask
    /// ([`Preconditions`]): checked only when the object lives.
    pub if_live: Preconditions,
}

/// What a manifest's own `metadata.uid` and `metadata.resourceVersion` ask, taken as
/// Kubernetes takes them on an update: a manifest read with `get -o yaml`, edited and applied
/// again is refused as a conflict if the object it was read from is gone and another took its
/// name (`uid`), or if the object changed since (`resourceVersion`, the position of its last
/// event). A create ignores them, as it ignores every field the server sets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Preconditions {
    /// The uid the object must have.
    pub uid: Option<Uuid>,
    /// The position the object's stream must be at.
    pub position: Option<Position>,
}

/// Refuses a decision on `snapshot` when the stream is expected at another position
/// ([`CommandMeta::expected_position`]).
fn check_expected(
    expected: Option<Position>,
    if_live: Preconditions,
    snapshot: &Snapshot,
) -> Result<(), CommandError> {
    let live = snapshot.state.is_live();
    if let Some(uid) = if_live.uid.filter(|_| live)
        && snapshot.state.uid() != Some(uid)
    {
        return Err(CommandError::Rejected(Rejection::uid_precondition(
            uid,
            snapshot.state.uid(),
        )));
    }
    let positions = [expected, if_live.position.filter(|_| live)];
    match positions
        .into_iter()
        .flatten()
        .find(|p| *p != snapshot.position)
    {
        Some(expected) => Err(CommandError::Rejected(Rejection::stale(
            expected.0,
            snapshot.position.0,
        ))),
        None => Ok(()),
    }
}

/// A VM apply made on the object as it was read (conditional on the position of its last
/// event, which [`check_expected`] found unchanged: `patch`, `label`, `annotate`, a manifest
/// read with `get -o yaml` and edited) is an edit of that object, and is decided as core's
/// update: the same decision for a live VM, and for one being deleted the refusal of an edit
/// rather than of a create of its name. `None` for any other command (decided as it is).
fn edit_of_read(
    command: &Command,
    expected: Option<Position>,
    if_live: Preconditions,
    snapshot: &Snapshot,
) -> Option<Command> {
    let Command::Vm {
        namespace,
        name,
        command: VmCommand::Apply(put),
    } = command
    else {
        return None;
    };
    let read_at = expected.or(if_live.position)?;
    (read_at.0 > 0 && snapshot.state.is_live()).then(|| Command::Vm {
        namespace: namespace.clone(),
        name: name.clone(),
        command: VmCommand::Update(put.clone()),
    })
}

/// What an accepted command did.
#[derive(Debug, Clone, PartialEq)]
pub struct Executed {
    /// `created`, `configured`, `unchanged`, …
    pub outcome: Outcome,
    /// Where its events went (`None` when it appended nothing).
    pub append: Option<AppendResult>,
    /// The stream.
    pub stream: String,
    /// The stream's revision after the command.
    pub revision: u64,
    /// The object's generation after the command.
    pub generation: u64,
    /// The position a read must reach to see the command's effect (read-your-writes).
    pub position: Position,
    /// Decisions made (1 + retries after concurrent writes).
    pub attempts: u32,
}

/// Why a command was not carried out. Nothing was appended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// The domain refused it (including a taken firmware UUID and a generation conflict).
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// The log failed.
    #[error(transparent)]
    Store(#[from] vmplane_store::Error),
    /// Reading the aggregate failed (a damaged event names its position).
    #[error(transparent)]
    Read(#[from] Error),
    /// Every decision lost a race with another writer of the stream.
    #[error("stream {stream}: {attempts} decisions all lost to concurrent writes")]
    RetriesExhausted {
        /// The stream.
        stream: String,
        /// Decisions made.
        attempts: u32,
    },
}

/// What [`CommandHandler::execute_async`] did.
#[derive(Debug)]
pub enum AsyncExecuted {
    /// Carried out: as [`CommandHandler::execute_with_state`] returns it.
    Done(Executed, Option<Arc<Snapshot>>),
    /// Not carried out, nothing appended: the stream's current state is not in memory. The
    /// command back: load the state on a blocking thread ([`CommandHandler::load`] keeps it in
    /// the state cache) and call again, so that only the read takes a thread and not the wait
    /// for the append; or carry the command out there with
    /// [`CommandHandler::execute_with_state`].
    Uncached(Command),
    /// Not carried out, nothing appended: it needs what only a blocking thread may do (read
    /// the log, or append where the log cannot take a submitted append). The command back, for
    /// [`CommandHandler::execute_with_state`] on such a thread.
    Blocking(Command),
}

/// Loads, decides and appends.
pub struct CommandHandler {
    log: Arc<dyn EventLog>,
    cache: Arc<StateCache>,
    options: CommandOptions,
    recent: Mutex<Recent>,
}

#[derive(Default)]
struct Recent {
    results: HashMap<Uuid, Executed>,
    order: VecDeque<Uuid>,
}

impl std::fmt::Debug for CommandHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandHandler")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl CommandHandler {
    /// A handler appending to `log`, sharing `cache` with the read models.
    #[must_use]
    pub fn new(
        log: Arc<dyn EventLog>,
        cache: Arc<StateCache>,
        options: CommandOptions,
    ) -> CommandHandler {
        CommandHandler {
            log,
            cache,
            options,
            recent: Mutex::new(Recent::default()),
        }
    }

    /// The aggregate of `stream` (of `kind`) as the log has it now, with its revision
    /// (`None`: the stream has no events).
    pub fn load(&self, stream: &str, kind: Kind) -> Result<(Arc<Snapshot>, Option<u64>), Error> {
        match self.log.stream_revision(stream)? {
            None => Ok((Arc::new(Snapshot::empty(kind)), None)),
            Some(revision) => Ok((
                self.cache
                    .state_at(self.log.as_ref(), stream, kind, revision)?,
                Some(revision),
            )),
        }
    }

    /// Carries out `command` for `meta.actor`.
    pub fn execute(&self, meta: &CommandMeta, command: Command) -> Result<Executed, CommandError> {
        self.execute_with_state(meta, command).map(|(done, _)| done)
    }

    /// [`CommandHandler::execute`], also returning the stream's state as the command left it
    /// (the appended events folded into the state they were decided on, and kept in the state cache
    /// so the next command on the stream starts from it; for an unchanged object, the state it
    /// was decided on, at [`Executed::position`]). `None` for an idempotent retry, a stream
    /// with no events, or events that could not be read back: the caller then reads the object
    /// at [`Executed::position`] instead.
    pub fn execute_with_state(
        &self,
        meta: &CommandMeta,
        command: Command,
    ) -> Result<(Executed, Option<Arc<Snapshot>>), CommandError> {
        let stream = command.stream();
        if let Some(done) = self.remembered(meta, &stream) {
            return Ok((done, None));
        }
        let kind = command.kind();
        let correlation_id = correlation(meta);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let (snapshot, revision) = self.load(&stream, kind)?;
            check_expected(meta.expected_position, meta.if_live, &snapshot)?;
            let edit = edit_of_read(&command, meta.expected_position, meta.if_live, &snapshot);
            let command = self.resolve(&snapshot.state, edit.as_ref().unwrap_or(&command))?;
            let decision = decide(&snapshot.state, &command, &mut fresh_ctx())?;
            let (decision, after) = match attempt(&stream, &snapshot, revision, decision, attempts)
            {
                Attempt::Unchanged(done) => return Ok((done, decided_on(&snapshot, revision))),
                Attempt::Append(decision, after) => (decision, after),
            };
            let request = to_request(&stream, revision, &decision, meta, correlation_id);
            let appended = self.log.append(request);
            let append = match self.appended(appended, &stream, attempts, meta)? {
                AppendOutcome::Written(append) => append,
                AppendOutcome::Retry => continue,
                AppendOutcome::Replayed(position) => {
                    return self
                        .replayed(&stream, position, attempts)
                        .map(|d| (d, None));
                }
            };
            let done = self.written(meta, &decision, &after, stream, append, attempts);
            let after = self.state_after(
                &done.stream,
                kind,
                &snapshot,
                after,
                &decision.events,
                &append,
                None,
            );
            return Ok((done, after));
        }
    }

    /// [`CommandHandler::execute_with_state`] for an async caller, on its own thread: when the
    /// log takes submitted appends ([`EventLog::submits`]) and the command needs no read of
    /// the log (its stream is new or its state is in the state cache, and it references no
    /// instancetype or preference to resolve), it is decided here and its append submitted and
    /// awaited, with no thread parked for it. The same decisions, retries and rejections as
    /// `execute_with_state`. A stream whose state is not in memory comes back as
    /// [`AsyncExecuted::Uncached`], anything else as [`AsyncExecuted::Blocking`].
    pub async fn execute_async(
        &self,
        meta: &CommandMeta,
        command: Command,
    ) -> Result<AsyncExecuted, CommandError> {
        if !self.log.submits() {
            return Ok(AsyncExecuted::Blocking(command));
        }
        let stream = command.stream();
        if let Some(done) = self.remembered(meta, &stream) {
            return Ok(AsyncExecuted::Done(done, None));
        }
        let kind = command.kind();
        let correlation_id = correlation(meta);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let snapshot = match self.log.stream_revision(&stream)? {
                None => Some((Arc::new(Snapshot::empty(kind)), None)),
                Some(revision) => self
                    .cache
                    .cached(&stream, kind, revision)
                    .map(|s| (s, Some(revision))),
            };
            let Some((snapshot, revision)) = snapshot else {
                return Ok(AsyncExecuted::Uncached(command));
            };
            check_expected(meta.expected_position, meta.if_live, &snapshot)?;
            if needs_resolving(&snapshot.state, &command) {
                return Ok(AsyncExecuted::Blocking(command));
            }
            let edit = edit_of_read(&command, meta.expected_position, meta.if_live, &snapshot);
            let decision = decide(
                &snapshot.state,
                edit.as_ref().unwrap_or(&command),
                &mut fresh_ctx(),
            )?;
            let (decision, after) = match attempt(&stream, &snapshot, revision, decision, attempts)
            {
                Attempt::Unchanged(done) => {
                    return Ok(AsyncExecuted::Done(done, decided_on(&snapshot, revision)));
                }
                Attempt::Append(decision, after) => (decision, after),
            };
            let request = to_request(&stream, revision, &decision, meta, correlation_id);
            let pending = match self.log.submit(request) {
                Submitted::Pending(pending) => pending,
                Submitted::Unsupported(_) => return Ok(AsyncExecuted::Blocking(command)),
            };
            let report = pending.await;
            let recorded_at = report.as_ref().ok().and_then(|r| r.recorded_at);
            let append = match self.appended(report.map(|r| r.result), &stream, attempts, meta)? {
                AppendOutcome::Written(append) => append,
                AppendOutcome::Retry => continue,
                // A retried request already in the log: reporting it reads the log.
                AppendOutcome::Replayed(_) => return Ok(AsyncExecuted::Blocking(command)),
            };
            let done = self.written(meta, &decision, &after, stream, append, attempts);
            // Placed from the report alone: no read of the log on this thread.
            let after = recorded_at.and_then(|at| {
                self.state_after(
                    &done.stream,
                    kind,
                    &snapshot,
                    after,
                    &decision.events,
                    &append,
                    Some(at),
                )
            });
            return Ok(AsyncExecuted::Done(done, after));
        }
    }

    /// The answer already given to `meta`'s request id, if it was carried out lately.
    fn remembered(&self, meta: &CommandMeta, stream: &str) -> Option<Executed> {
        let id = request_key(meta, stream)?;
        self.recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .results
            .get(&id)
            .cloned()
    }

    /// What an append of a decision came to: written, to be decided again (a concurrent write
    /// moved the stream), already in the log (a retried request), or the rejection.
    fn appended(
        &self,
        result: vmplane_store::Result<AppendResult>,
        stream: &str,
        attempts: u32,
        meta: &CommandMeta,
    ) -> Result<AppendOutcome, CommandError> {
        match result {
            Ok(append) => Ok(AppendOutcome::Written(append)),
            Err(vmplane_store::Error::Conflict { .. })
                if attempts <= self.options.decide_retries_max =>
            {
                Ok(AppendOutcome::Retry)
            }
            Err(vmplane_store::Error::Conflict { .. }) => Err(CommandError::RetriesExhausted {
                stream: stream.to_owned(),
                attempts,
            }),
            Err(vmplane_store::Error::ClaimTaken { key, holder, .. }) => {
                Err(claim_taken(&key, &holder, stream))
            }
            Err(vmplane_store::Error::EventIdReused { position, .. })
                if meta.request_id.is_some() =>
            {
                Ok(AppendOutcome::Replayed(position))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The report of a written decision (remembered for its request id).
    fn written(
        &self,
        meta: &CommandMeta,
        decision: &Decision,
        after: &Snapshot,
        stream: String,
        append: AppendResult,
        attempts: u32,
    ) -> Executed {
        let done = Executed {
            outcome: decision.outcome,
            append: Some(append),
            stream,
            revision: append.last_revision,
            generation: after.state.generation(),
            position: append.last_position,
            attempts,
        };
        self.remember(request_key(meta, &done.stream), &done);
        done
    }

    /// Runs one step that the caller decides itself — a snapshot, restore or clone saga step
    /// (core's `snapshot::decide`, `restore::decide`, `clone::decide`) — on `stream`: loads
    /// its state, calls `step` with it and a fresh [`Ctx`] (the step reads whatever other
    /// streams it needs), appends the decision's events and claims at the revision the state
    /// was read at, and on a concurrent write reloads and calls `step` again. `step` returns
    /// the decision and whatever else the caller wants back (the saga's next step).
    /// `meta.request_id` only correlates here: a saga appends several times per request.
    pub fn execute_step<T>(
        &self,
        meta: &CommandMeta,
        stream: &str,
        kind: Kind,
        mut step: impl FnMut(&AggState, &mut Ctx) -> Result<(Decision, T), CommandError>,
    ) -> Result<(Executed, T), CommandError> {
        let correlation_id = correlation(meta);
        let meta = CommandMeta {
            request_id: None,
            expected_position: None,
            if_live: Preconditions::default(),
            ..meta.clone()
        };
        let mut attempts = 0;
        loop {
            attempts += 1;
            let (snapshot, revision) = self.load(stream, kind)?;
            let (decision, extra) = step(&snapshot.state, &mut fresh_ctx())?;
            let (decision, after) = match attempt(stream, &snapshot, revision, decision, attempts) {
                Attempt::Unchanged(done) => return Ok((done, extra)),
                Attempt::Append(decision, after) => (decision, after),
            };
            let request = to_request(stream, revision, &decision, &meta, correlation_id);
            let appended = self.log.append(request);
            match self.appended(appended, stream, attempts, &meta)? {
                AppendOutcome::Written(append) => {
                    let stream = stream.to_owned();
                    let done = self.written(&meta, &decision, &after, stream, append, attempts);
                    return Ok((done, extra));
                }
                AppendOutcome::Retry => {}
                // Not without a request id (see above); were it, the events are in the log.
                AppendOutcome::Replayed(position) => {
                    return self
                        .replayed(stream, position, attempts)
                        .map(|done| (done, extra));
                }
            }
        }
    }

    /// The holder of a store claim (`firmware-uuid/<uuid>` → the VM stream holding it).
    pub fn claim_holder(&self, key: &str) -> Result<Option<String>, CommandError> {
        Ok(self.log.claim_holder(key)?)
    }

    /// The log's head position.
    #[must_use]
    pub fn head(&self) -> Position {
        self.log.head()
    }

    /// Decides `command` against the current state without appending anything
    /// (`apply --dry-run`): the outcome it would have, or the rejection it gets.
    pub fn dry_run(&self, command: Command) -> Result<Outcome, CommandError> {
        self.dry_run_expecting(command, None, Preconditions::default())
    }

    /// [`CommandHandler::dry_run`], refused as a conflict, as the command would be, when the
    /// stream's last event is not at `expected` ([`CommandMeta::expected_position`]) or the
    /// live object is not what `if_live` asks ([`CommandMeta::if_live`]).
    pub fn dry_run_expecting(
        &self,
        command: Command,
        expected: Option<Position>,
        if_live: Preconditions,
    ) -> Result<Outcome, CommandError> {
        let (_, decision) = self.decided_and_claimable(&command, expected, if_live)?;
        Ok(decision.outcome)
    }

    /// [`CommandHandler::dry_run_expecting`], with the state the command would leave (for an
    /// answer that shows the object as it would be stored): folded, never appended or cached.
    /// Its events are taken as recorded now; its position is the stream's current one (`0`
    /// for an object not yet created), since nothing is written.
    pub fn dry_run_with_state(
        &self,
        command: Command,
        expected: Option<Position>,
        if_live: Preconditions,
    ) -> Result<(Outcome, Snapshot), CommandError> {
        let (snapshot, mut decision) = self.decided_and_claimable(&command, expected, if_live)?;
        let mut after = after_decision(&snapshot, &mut decision);
        let now_ns = chrono::Utc::now().timestamp_nanos_opt().unwrap_or(i64::MAX);
        for event in &decision.events {
            if matches!(
                event,
                Event::VmCreated(_) | Event::VmiCreated(_) | Event::ObjectCreated(_)
            ) {
                after.created_at_ns = Some(now_ns);
            }
            after.recorded_at_ns = now_ns;
        }
        Ok((decision.outcome, after))
    }

    /// [`CommandHandler::decided`], then what the append would check too: the uniqueness
    /// claims (a firmware UUID another VM holds), against the holders now.
    fn decided_and_claimable(
        &self,
        command: &Command,
        expected: Option<Position>,
        if_live: Preconditions,
    ) -> Result<(Arc<Snapshot>, Decision), CommandError> {
        let (snapshot, decision) = self.decided(command, expected, if_live)?;
        let claims = store_claims(&decision);
        let mut holders = std::collections::HashMap::new();
        for claim in &claims {
            holders.insert(claim.key(), self.log.claim_holder(claim.key())?);
        }
        let holder = |key: &str| holders.get(key).cloned().flatten();
        if let Err((key, holder)) = vmplane_store::log::decide_claims(&claims, &holder) {
            return Err(claim_taken(&key, &holder, &command.stream()));
        }
        Ok((snapshot, decision))
    }

    /// `command` decided on the current state (references resolved), nothing appended.
    /// Refused as a conflict first when the stream's last event is not at `expected`
    /// ([`CommandMeta::expected_position`]).
    fn decided(
        &self,
        command: &Command,
        expected: Option<Position>,
        if_live: Preconditions,
    ) -> Result<(Arc<Snapshot>, Decision), CommandError> {
        let (snapshot, _) = self.load(&command.stream(), command.kind())?;
        check_expected(expected, if_live, &snapshot)?;
        let edit = edit_of_read(command, expected, if_live, &snapshot);
        let command = self.resolve(&snapshot.state, edit.as_ref().unwrap_or(command))?;
        let decision = decide(&snapshot.state, &command, &mut fresh_ctx())?;
        Ok((snapshot, decision))
    }

    /// The outcome of `command` and the state it would leave: decided on the current state
    /// and folded, never appended.
    fn preview(&self, command: Command) -> Result<(Outcome, AggState), CommandError> {
        let (snapshot, mut decision) = self.decided(&command, None, Preconditions::default())?;
        let after = after_decision(&snapshot, &mut decision);
        Ok((decision.outcome, after.state))
    }

    /// The stored VM `namespace/name` fully rendered (instancetype, preference, defaults,
    /// firmware identity), or `None` if no VM exists under that name (a Terminating one does).
    pub fn expand_vm(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<vmplane_core::types::VirtualMachine>, CommandError> {
        let stream = stream_of(Kind::VirtualMachine, namespace, name);
        let (snapshot, _) = self.load(&stream, Kind::VirtualMachine)?;
        match &snapshot.state {
            AggState::Vm(s) if s.exists() => Ok(Some(s.expand()?)),
            _ => Ok(None),
        }
    }

    /// A VM manifest fully rendered as applying it would store it (nothing is appended):
    /// references resolved from the log, defaults, firmware identity.
    pub fn expand_manifest(
        &self,
        manifest: Manifest,
    ) -> Result<vmplane_core::types::VirtualMachine, CommandError> {
        match self.preview(Command::apply(manifest))?.1 {
            AggState::Vm(s) => Ok(s.expand()?),
            _ => Err(Rejection::invalid(
                "kind",
                vmplane_core::codes::UNSUPPORTED_KIND,
                "only a VirtualMachine expands",
            )
            .into()),
        }
    }

    /// `after` (`before` with the decided `events` folded in) placed where `append` wrote
    /// them, and cached for the next command on the stream. The time recorded with them is
    /// `recorded_at` when the log reported it (a submitted append: one commit, one time), else
    /// read back from the log (a zero-copy scan of the appended positions, which also checks
    /// they hold this stream's events; nothing is decoded or folded again). `None` if the
    /// append did not follow `before` directly, the log holds other events there or the read
    /// fails (the caller falls back to an ordinary read).
    #[allow(clippy::too_many_arguments)]
    fn state_after(
        &self,
        stream: &str,
        kind: Kind,
        before: &Snapshot,
        mut after: Snapshot,
        events: &[Event],
        append: &AppendResult,
        recorded_at: Option<Timestamp>,
    ) -> Option<Arc<Snapshot>> {
        if append.replayed || append.first_revision != before.state.revision() + 1 {
            return None;
        }
        let count = append
            .last_position
            .0
            .checked_sub(append.first_position.0)?
            + 1;
        if events.len() as u64 != count {
            return None;
        }
        let times = match recorded_at {
            Some(at) => vec![at.0; events.len()],
            None => self.recorded_times(stream, append)?,
        };
        if times.len() != events.len() {
            return None;
        }
        for ((event, recorded_at), position) in events
            .iter()
            .zip(times)
            .zip(append.first_position.0..=append.last_position.0)
        {
            if matches!(
                event,
                Event::VmCreated(_) | Event::VmiCreated(_) | Event::ObjectCreated(_)
            ) {
                after.created_at_ns = Some(recorded_at);
            }
            after.recorded_at_ns = recorded_at;
            after.note_vmi_event(event.type_name(), Position(position));
        }
        after.position = append.last_position;
        let after = Arc::new(after);
        self.cache.put(stream, kind, Arc::clone(&after));
        Some(after)
    }

    /// When the log recorded each event `append` wrote, read back; `None` if the positions do
    /// not hold `stream`'s revisions in order or the read fails.
    fn recorded_times(&self, stream: &str, append: &AppendResult) -> Option<Vec<i64>> {
        let mut placed: Vec<i64> = Vec::new();
        let mut expected = append.first_revision;
        let mut foreign = false;
        self.log
            .scan(Position(append.first_position.0 - 1), &mut |event| {
                if event.stream != stream || event.revision != expected {
                    foreign = true;
                    return ControlFlow::Break(());
                }
                expected += 1;
                placed.push(event.recorded_at.0);
                if event.position >= append.last_position {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .ok()?;
        (!foreign).then_some(placed)
    }

    /// A retried request whose events are already in the log (found through the store's
    /// idempotency by event id): report where they are.
    fn replayed(
        &self,
        stream: &str,
        position: Position,
        attempts: u32,
    ) -> Result<Executed, CommandError> {
        let event = self
            .log
            .read_event(position)?
            .ok_or(vmplane_store::Error::Corrupt {
                position,
                reason: "the store named an event it does not have".into(),
            })?;
        let outcome = match event.event_type.as_str() {
            "VmCreated" | "VmiCreated" | "ObjectCreated" => Outcome::Created,
            "VmSpecEdited" | "ObjectUpdated" => Outcome::Configured,
            "VmDeleted" | "VmDeletionRequested" | "VmiDeleted" | "ObjectDeleted" => {
                Outcome::Deleted
            }
            _ => Outcome::Recorded,
        };
        let kind = crate::model::parse_stream(&event.stream)
            .map(|s| s.kind)
            .unwrap_or(Kind::VirtualMachine);
        let snapshot =
            self.cache
                .state_at(self.log.as_ref(), &event.stream, kind, event.revision)?;
        Ok(Executed {
            outcome,
            append: Some(AppendResult {
                first_position: position,
                last_position: position,
                first_revision: event.revision,
                last_revision: event.revision,
                replayed: true,
            }),
            stream: stream.to_owned(),
            revision: event.revision,
            generation: snapshot.state.generation(),
            position,
            attempts,
        })
    }

    fn remember(&self, request_id: Option<Uuid>, done: &Executed) {
        let Some(id) = request_id else { return };
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        if recent.results.insert(id, done.clone()).is_none() {
            recent.order.push_back(id);
        }
        while recent.order.len() > self.options.recent_requests_max {
            if let Some(old) = recent.order.pop_front() {
                recent.results.remove(&old);
            }
        }
    }

    /// Fills in the instancetype and preference a VM command references (core's `vm::needs`),
    /// from their streams in the log.
    fn resolve(&self, state: &AggState, command: &Command) -> Result<Command, CommandError> {
        let (
            AggState::Vm(vm_state),
            Command::Vm {
                namespace,
                name,
                command: VmCommand::Create(put) | VmCommand::Update(put) | VmCommand::Apply(put),
            },
        ) = (state, command)
        else {
            return Ok(command.clone());
        };
        let needs = vm::needs(vm_state, &put.vm);
        let mut put = put.clone();
        if put.instancetype.is_none()
            && let Some((kind, ref_name)) = &needs.instancetype
            && let Some(Manifest::Instancetype(it)) =
                self.live_object(*kind, namespace, ref_name)?
        {
            put.instancetype = Some(*it);
        }
        if put.preference.is_none()
            && let Some((kind, ref_name)) = &needs.preference
            && let Some(Manifest::Preference(p)) = self.live_object(*kind, namespace, ref_name)?
        {
            put.preference = Some(*p);
        }
        if needs_cluster_features(vm_state, &put) {
            put.features = Some(self.cluster_features()?);
        }
        let vm_command = match command {
            Command::Vm {
                command: VmCommand::Create(_),
                ..
            } => VmCommand::Create(put),
            Command::Vm {
                command: VmCommand::Update(_),
                ..
            } => VmCommand::Update(put),
            _ => VmCommand::Apply(put),
        };
        Ok(Command::Vm {
            namespace: namespace.clone(),
            name: name.clone(),
            command: vm_command,
        })
    }

    /// The cluster's features as the log holds them now (its `cluster/config`).
    fn cluster_features(&self) -> Result<vmplane_core::features::Features, Error> {
        let (snapshot, _) = self.load(vmplane_core::streams::CLUSTER_CONFIG, Kind::KubeVirt)?;
        let config = match &snapshot.state {
            AggState::Object(s) if s.is_live() => match s.render() {
                Some(Manifest::Object(_, config)) => Some(config),
                _ => None,
            },
            _ => None,
        };
        Ok(vmplane_core::features::Features::from_config(
            config.as_deref(),
        ))
    }

    fn live_object(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Manifest>, Error> {
        let stream = stream_of(kind, namespace, name);
        let (snapshot, _) = self.load(&stream, kind)?;
        Ok(match &snapshot.state {
            // Rendered: uid and generation filled, so the VM captures the right revision.
            AggState::Object(s) if s.is_live() => s.render(),
            _ => None,
        })
    }
}

/// What one attempt's decision asks for.
enum Attempt {
    /// Nothing to append (an unchanged object): the report.
    Unchanged(Executed),
    /// The decision to append, and the state it leads to (`before` with its events folded in:
    /// the reply's generation, and the state cache's next entry once the log has placed it).
    Append(Decision, Snapshot),
}

/// The state an unchanged decision was made on, handed back as the state the command left:
/// nothing was appended, so it is the stream's state at the decision's [`Executed::position`].
/// `None` for a stream with no events (nothing to answer with).
fn decided_on(snapshot: &Arc<Snapshot>, revision: Option<u64>) -> Option<Arc<Snapshot>> {
    revision.map(|_| Arc::clone(snapshot))
}

/// What `decision`, made on `snapshot` (the stream at `revision`), asks for.
fn attempt(
    stream: &str,
    snapshot: &Snapshot,
    revision: Option<u64>,
    decision: Decision,
    attempts: u32,
) -> Attempt {
    if decision.events.is_empty() {
        return Attempt::Unchanged(Executed {
            outcome: decision.outcome,
            append: None,
            stream: stream.to_owned(),
            revision: revision.unwrap_or(0),
            generation: snapshot.state.generation(),
            position: snapshot.position,
            attempts,
        });
    }
    let mut decision = decision;
    let after = after_decision(snapshot, &mut decision);
    Attempt::Append(decision, after)
}

/// `snapshot` with `decision`'s events folded in. A VM decision carries that state already
/// (core's decider folded them as it decided): it is taken, not folded again.
fn after_decision(snapshot: &Snapshot, decision: &mut Decision) -> Snapshot {
    let decided = match (&snapshot.state, decision.vm_after.take()) {
        (AggState::Vm(_), Some(vm)) => Some(AggState::Vm(vm)),
        _ => None,
    };
    match decided {
        // Field by field: cloning the snapshot would clone its state only to drop it.
        Some(state) => Snapshot {
            state,
            position: snapshot.position,
            recorded_at_ns: snapshot.recorded_at_ns,
            created_at_ns: snapshot.created_at_ns,
            vm_json: snapshot.vm_json.clone(),
            vmi_position: snapshot.vmi_position,
        },
        None => {
            let mut after = Snapshot::clone(snapshot);
            for event in &decision.events {
                after.state.evolve(event);
            }
            after
        }
    }
}

/// What an append of a decision came to (see [`CommandHandler::appended`]).
enum AppendOutcome {
    Written(AppendResult),
    /// A concurrent write moved the stream: decide again.
    Retry,
    /// A retried request whose events are already in the log, at this position.
    Replayed(Position),
}

/// The correlation id of a command's events: the caller's, else its request id, else new.
fn correlation(meta: &CommandMeta) -> Uuid {
    meta.correlation_id
        .or(meta.request_id)
        .unwrap_or_else(Uuid::now_v7)
}

/// Whether [`CommandHandler::resolve`] would read the log for `command`: a VM put that
/// references an instancetype or preference it does not carry, or that creates a VM whose
/// template uses a Discontinued gate's API without the cluster's features
/// ([`needs_cluster_features`]).
fn needs_resolving(state: &AggState, command: &Command) -> bool {
    let (
        AggState::Vm(vm_state),
        Command::Vm {
            command: VmCommand::Create(put) | VmCommand::Update(put) | VmCommand::Apply(put),
            ..
        },
    ) = (state, command)
    else {
        return false;
    };
    let needs = vm::needs(vm_state, &put.vm);
    (put.instancetype.is_none() && needs.instancetype.is_some())
        || (put.preference.is_none() && needs.preference.is_some())
        || needs_cluster_features(vm_state, put)
}

/// What KubeVirt's VM admitter checks against the cluster's features on CREATE
/// ([`vmplane_core::features::check_vm_discontinued`]) needs them: a put that creates a VM whose
/// template uses a Discontinued gate's API (rare: an apply of any other VM reads nothing more).
fn needs_cluster_features(vm_state: &vmplane_core::VmState, put: &vm::PutVm) -> bool {
    put.features.is_none()
        && !vm_state.is_live()
        && put
            .vm
            .vmi_spec()
            .is_some_and(|spec| !vmplane_core::features::discontinued_api_uses(spec, "").is_empty())
}

fn decide(state: &AggState, command: &Command, ctx: &mut Ctx) -> Result<Decision, Rejection> {
    decide_on_kind(state, command, ctx).map_err(|r| name_the_missing(r, state, command))
}

/// A stream that never had an object knows no name: core's NotFound then reads
/// `virtualmachines.kubevirt.io "" not found`. The command knows the name it asked for.
fn name_the_missing(mut rejection: Rejection, state: &AggState, command: &Command) -> Rejection {
    if rejection.category != vmplane_core::Category::NotFound || state.revision() != 0 {
        return rejection;
    }
    let name = command.name();
    for cause in &mut rejection.causes {
        if cause.reason.contains("\"\" not found") {
            cause.reason =
                cause
                    .reason
                    .replacen("\"\" not found", &format!("\"{name}\" not found"), 1);
        }
    }
    rejection
}

fn decide_on_kind(
    state: &AggState,
    command: &Command,
    ctx: &mut Ctx,
) -> Result<Decision, Rejection> {
    match (state, command) {
        // The cluster config's stream (`cluster/config`) is named after no object: deleting
        // a KubeVirt object by another name must not delete the config.
        (
            AggState::Object(s),
            Command::Object {
                kind: Kind::KubeVirt,
                name,
                command: ObjectCommand::Delete(_),
                ..
            },
        ) if !s.name.is_empty() && is_another_config(Kind::KubeVirt, name, &s.name) => {
            Err(Rejection::not_found(
                "metadata.name",
                vmplane_core::codes::NOT_FOUND,
                format!(
                    "\"{name}\" not found: the cluster configuration is KubeVirt {}",
                    s.name
                ),
            ))
        }
        (AggState::Vm(s), Command::Vm { command, .. }) => vm::decide(s, command, ctx),
        (AggState::Vmi(s), Command::Vmi { command, .. }) => vmi::decide(s, command, ctx),
        (AggState::Object(s), Command::Object { command, .. }) => object::decide(s, command, ctx),
        // Snapshot, restore and clone streams through the generic object path (delete, dry
        // runs): their object fold decides; sagas go through `execute_step`.
        (
            AggState::Snapshot(_) | AggState::Restore(_) | AggState::Clone(_),
            Command::Object { command, .. },
        ) => match state.object() {
            Some(o) => object::decide(o, command, ctx),
            None => Err(Rejection::invalid(
                "kind",
                vmplane_core::codes::UNSUPPORTED_KIND,
                "the command does not fit the stream's kind",
            )),
        },
        _ => Err(Rejection::invalid(
            "kind",
            vmplane_core::codes::UNSUPPORTED_KIND,
            "the command does not fit the stream's kind",
        )),
    }
}

/// Now, and 32 random bytes: the only place they enter a decision. From the thread's
/// cryptographically secure generator (ChaCha, seeded and periodically reseeded from the
/// operating system), not a system call per command.
fn fresh_ctx() -> Ctx {
    let mut seed = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut seed);
    Ctx::new(chrono::Utc::now(), seed)
}

/// What a client's request id means here: that principal's request on that stream. A retry
/// (the same principal, object and id) finds its first answer and its events; the same id
/// from another principal or for another object is another request (it neither replays nor
/// blocks a stranger's write).
fn request_key(meta: &CommandMeta, stream: &str) -> Option<Uuid> {
    let id = meta.request_id?;
    let mut scope = Vec::with_capacity(meta.actor.len() + 1 + stream.len());
    scope.extend_from_slice(meta.actor.as_bytes());
    scope.push(0);
    scope.extend_from_slice(stream.as_bytes());
    Some(Uuid::new_v5(&id, &scope))
}

/// The event id of the `index`-th event of a request: derived from the client's request id so
/// a retry proposes the same ids (the store's idempotency), else a fresh UUID v7.
fn event_id(request_id: Option<Uuid>, index: usize) -> Uuid {
    match request_id {
        Some(r) => Uuid::new_v5(&r, &(index as u64).to_be_bytes()),
        None => Uuid::now_v7(),
    }
}

/// A decision's uniqueness claims as the store takes them.
fn store_claims(decision: &Decision) -> Vec<vmplane_store::Claim> {
    decision.claims.iter().cloned().map(store_claim).collect()
}

/// One of `core`'s claims as the store takes it.
pub fn store_claim(claim: vmplane_core::Claim) -> vmplane_store::Claim {
    match claim {
        vmplane_core::Claim::Acquire { key, owner } => vmplane_store::Claim::Acquire { key, owner },
        vmplane_core::Claim::Release { key, owner } => vmplane_store::Claim::Release { key, owner },
    }
}

/// The rejection of a decision of stream `claimant` whose claim `key` is held by stream
/// `holder`, naming the claimant's own field (a standalone VMI's UUID is at
/// `spec.domain.firmware.uuid`, a VM's under its template).
fn claim_taken(key: &str, holder: &str, claimant: &str) -> CommandError {
    let uuid = key.strip_prefix("firmware-uuid/").unwrap_or(key);
    let mut rejection = Rejection::firmware_uuid_taken(uuid, holder);
    if claimant.starts_with("vmi/") {
        for cause in &mut rejection.causes {
            cause.field = "spec.domain.firmware.uuid".to_owned();
        }
    }
    rejection.into()
}

fn to_request(
    stream: &str,
    revision: Option<u64>,
    decision: &Decision,
    meta: &CommandMeta,
    correlation_id: Uuid,
) -> AppendRequest {
    let events = decision
        .events
        .iter()
        .enumerate()
        .map(|(i, event)| {
            let encoded = vmplane_core::encode(event);
            ProposedEvent {
                id: event_id(request_key(meta, stream), i),
                event_type: encoded.type_name.to_owned(),
                schema_version: encoded.version,
                payload: encoded.bytes,
                actor: meta.actor.clone(),
                correlation_id,
                causation_id: meta.causation_id,
            }
        })
        .collect();
    let claims = store_claims(decision);
    AppendRequest {
        stream: stream.to_owned(),
        expected: match revision {
            None => ExpectedRevision::NoStream,
            Some(r) => ExpectedRevision::Exact(r),
        },
        events,
        claims,
    }
}
