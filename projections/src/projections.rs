//! [`Projections`]: the read models over one log — current state, indexes, time travel — with
//! checkpoints, catch-up, rebuild and digest.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;
use vmplane_core::features::Features;
use vmplane_core::types::Kind;
use vmplane_store::{EventLog, Position, Timestamp};

use crate::cache::{CacheOptions, StateCache};
use crate::checkpoint;
use crate::error::{Error, Result};
use crate::model::{AggState, Snapshot, stream_of};
use crate::readmodel::{ModelData, NameKey, ReadModel};
use crate::render::{ObjectView, render};

/// The checkpoint name of the current-state read model.
pub const READ_MODEL: &str = "readmodel";

/// Bounds and knobs of [`Projections`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProjectionOptions {
    /// The aggregate state cache (time-travel snapshots, current states).
    pub cache: CacheOptions,
    /// A checkpoint is written after catching up this many events past the last one
    /// (0: only when [`Projections::checkpoint`] is called).
    pub checkpoint_every_events: u64,
    /// How long a read waits for its `min_position` by default.
    pub read_wait_ms: u64,
}

impl Default for ProjectionOptions {
    fn default() -> ProjectionOptions {
        ProjectionOptions {
            cache: CacheOptions::default(),
            checkpoint_every_events: 100_000,
            read_wait_ms: 5_000,
        }
    }
}

/// Which state of an object to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// The current state (after catching up with the log).
    Current,
    /// After the stream's `n`-th event.
    Revision(u64),
    /// As a reader at this global position saw it: the last stream revision at or before it.
    Position(Position),
    /// As of this instant: the position the log had reached then ([`EventLog::position_at`]).
    Time(Timestamp),
}

/// A list and the position it was read at (`metadata.resourceVersion` of the List): a watch
/// from that position continues it without a gap or a repeat.
#[derive(Debug, Clone, PartialEq)]
pub struct ListResult {
    /// The objects, ordered by namespace and name.
    pub items: Vec<ObjectView>,
    /// The position the list reflects.
    pub position: Position,
}

impl ListResult {
    /// `{"apiVersion": "v1", "kind": "List", "items": [...], "metadata": {"resourceVersion": P}}`.
    #[must_use]
    pub fn to_json(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": self.items.iter().map(|i| i.object.clone()).collect::<Vec<_>>(),
            "metadata": {"resourceVersion": self.position.0.to_string()},
        })
    }
}

/// An object named by the read model: kind, namespace, name and its stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    /// Its kind.
    pub kind: Kind,
    /// Its namespace (None for cluster-scoped kinds).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// Its stream.
    pub stream: String,
}

/// The read models over one log.
pub struct Projections {
    log: Arc<dyn EventLog>,
    model: RwLock<ReadModel>,
    /// Serializes catch-up, rebuild and checkpoint writes.
    apply: Mutex<Applied>,
    cache: Arc<StateCache>,
    checkpoint_path: Option<PathBuf>,
    options: ProjectionOptions,
    /// Every feature at its default (no cluster config).
    default_features: Arc<Features>,
    /// The effective features at the last `cluster/config` revision asked for.
    features: Mutex<Option<(u64, Arc<Features>)>>,
}

struct Applied {
    last_checkpoint: u64,
}

impl std::fmt::Debug for Projections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Projections")
            .field("position", &self.position())
            .field("checkpoint_path", &self.checkpoint_path)
            .finish_non_exhaustive()
    }
}

impl Projections {
    /// Projections kept only in memory (built by replaying the log from position 0).
    pub fn in_memory(log: Arc<dyn EventLog>, options: ProjectionOptions) -> Result<Projections> {
        let projections = Projections::new(log, None, options, ReadModel::default());
        projections.catch_up()?;
        Ok(projections)
    }

    /// Opens the projections of the data directory `data_dir`: loads the checkpoint under
    /// `data_dir/projections/` if it is usable (else logs why and starts from 0), then replays
    /// the log's tail.
    pub fn open(
        log: Arc<dyn EventLog>,
        data_dir: &Path,
        options: ProjectionOptions,
    ) -> Result<Projections> {
        let path = checkpoint::path(data_dir, READ_MODEL);
        let model = match load_checkpoint(log.as_ref(), &path) {
            Ok(Some(model)) => model,
            Ok(None) => ReadModel::default(),
            Err(reason) => {
                tracing::warn!(
                    checkpoint = %path.display(),
                    %reason,
                    "projection checkpoint discarded; rebuilding from position 0"
                );
                ReadModel::default()
            }
        };
        let projections = Projections::new(log, Some(path), options, model);
        projections.catch_up()?;
        Ok(projections)
    }

    fn new(
        log: Arc<dyn EventLog>,
        checkpoint_path: Option<PathBuf>,
        options: ProjectionOptions,
        model: ReadModel,
    ) -> Projections {
        let applied = model.applied().0;
        Projections {
            log,
            model: RwLock::new(model),
            apply: Mutex::new(Applied {
                last_checkpoint: applied,
            }),
            cache: Arc::new(StateCache::new(options.cache)),
            checkpoint_path,
            options,
            default_features: Arc::new(Features::defaults()),
            features: Mutex::new(None),
        }
    }

    /// The cluster's effective features as of `position` (now for `None`): folded from
    /// `cluster/config` at its last revision at or before it.
    pub fn features_at(&self, position: Option<Position>) -> Result<Arc<Features>> {
        let stream = vmplane_core::streams::CLUSTER_CONFIG;
        let revision = {
            let model = self.model.read().unwrap_or_else(PoisonError::into_inner);
            match (model.entry(stream), position) {
                (None, _) => 0,
                (Some(e), None) => e.revision(),
                (Some(e), Some(p)) => e.revision_at(p),
            }
        };
        if revision == 0 {
            return Ok(Arc::clone(&self.default_features));
        }
        if let Some((r, f)) = &*self.features.lock().unwrap_or_else(PoisonError::into_inner)
            && *r == revision
        {
            return Ok(Arc::clone(f));
        }
        let snapshot = self.load(stream, Kind::KubeVirt, revision)?;
        let features = Arc::new(match &snapshot.state {
            AggState::Object(s) => Features::from_cluster(s),
            _ => Features::defaults(),
        });
        *self.features.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((revision, Arc::clone(&features)));
        Ok(features)
    }

    /// The log.
    #[must_use]
    pub fn log(&self) -> &Arc<dyn EventLog> {
        &self.log
    }

    /// The state cache (shared with [`crate::command::CommandHandler`]).
    #[must_use]
    pub fn cache(&self) -> &Arc<StateCache> {
        &self.cache
    }

    /// The last position the read model has applied.
    #[must_use]
    pub fn position(&self) -> Position {
        self.model
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .applied()
    }

    /// Applies every event up to the log's head; returns the position reached. Writes a
    /// checkpoint when [`ProjectionOptions::checkpoint_every_events`] have passed since the last.
    pub fn catch_up(&self) -> Result<Position> {
        let head = self.log.head();
        if self.position() >= head {
            return Ok(self.position());
        }
        let mut applied = self.apply.lock().unwrap_or_else(PoisonError::into_inner);
        let reached = {
            let mut model = self.model.write().unwrap_or_else(PoisonError::into_inner);
            let from = model.applied();
            scan_into(self.log.as_ref(), &mut model, from)?
        };
        let every = self.options.checkpoint_every_events;
        if every > 0 && reached.0.saturating_sub(applied.last_checkpoint) >= every {
            self.write_checkpoint(&mut applied)?;
        }
        Ok(reached)
    }

    /// Replays the whole log from position 0 into a fresh read model (the state cache is
    /// dropped too, so nothing cached is relied on) and replaces the current one.
    pub fn rebuild(&self) -> Result<Position> {
        let _applied = self.apply.lock().unwrap_or_else(PoisonError::into_inner);
        self.cache.clear();
        // Sized like the current model: the log holds at least the streams it has seen.
        let streams = self
            .model
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .streams();
        let mut fresh = ReadModel::with_capacity(streams);
        let reached = scan_into(self.log.as_ref(), &mut fresh, Position(0))?;
        let old = std::mem::replace(
            &mut *self.model.write().unwrap_or_else(PoisonError::into_inner),
            fresh,
        );
        // Freeing a large model takes a while: off the caller's path when a thread is to be had.
        if let Err(e) = std::thread::Builder::new()
            .name("projections-drop".into())
            .spawn(move || drop(old))
        {
            tracing::debug!(error = %e, "no thread to free the old read model; freeing it here");
        }
        Ok(reached)
    }

    /// Writes the checkpoint now (no-op for in-memory projections).
    pub fn checkpoint(&self) -> Result<()> {
        let mut applied = self.apply.lock().unwrap_or_else(PoisonError::into_inner);
        self.write_checkpoint(&mut applied)
    }

    fn write_checkpoint(&self, applied: &mut Applied) -> Result<()> {
        let Some(path) = &self.checkpoint_path else {
            return Ok(());
        };
        // Serialized in place under the read lock (no copy of the model), written and synced
        // after it is released (catch-up is not held up by the disk).
        let (position, hash, body) = {
            let model = self.model.read().unwrap_or_else(PoisonError::into_inner);
            let hash = model.applied_hash(self.log.as_ref())?;
            (
                model.applied().0,
                hash,
                checkpoint::encode(READ_MODEL, &model.persisted(&hash))?,
            )
        };
        checkpoint::write_encoded(path, READ_MODEL, position, &hash, &body)?;
        applied.last_checkpoint = position;
        Ok(())
    }

    /// A deterministic hash of the read model's canonical content at its current position:
    /// equal after a restart (checkpoint + tail) and after [`Projections::rebuild`].
    pub fn digest(&self) -> Result<String> {
        self.catch_up()?;
        self.settle()?;
        let model = self.model.read().unwrap_or_else(PoisonError::into_inner);
        Ok(model.digest())
    }

    /// The canonical content the digest hashes, as JSON lines (for `admin verify` to show what
    /// differs when two digests do not agree).
    pub fn canonical_content(&self) -> Result<Vec<String>> {
        self.catch_up()?;
        self.settle()?;
        let model = self.model.read().unwrap_or_else(PoisonError::into_inner);
        Ok(model.canonical_lines())
    }

    fn settle(&self) -> Result<()> {
        if !self
            .model
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .needs_settle()
        {
            return Ok(());
        }
        let mut model = self.model.write().unwrap_or_else(PoisonError::into_inner);
        model.settle(self.log.as_ref(), &self.cache)
    }

    /// Read-your-writes: returns once the read model has applied `position` (catching up with
    /// the log, and waiting for the log itself if it is behind), or [`Error::Timeout`].
    pub fn wait_for(&self, position: Position, timeout: Duration) -> Result<Position> {
        let deadline = Instant::now() + timeout;
        loop {
            let reached = self.catch_up()?;
            if reached >= position {
                return Ok(reached);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout {
                    wanted: position,
                    reached,
                });
            }
            self.log.wait_for(position, left)?;
        }
    }

    fn sync(&self, min_position: Option<Position>) -> Result<Position> {
        match min_position {
            Some(p) => self.wait_for(p, Duration::from_millis(self.options.read_wait_ms)),
            None => self.catch_up(),
        }
    }

    /// Follows the log on a thread of its own until `stop` is set: catches up as events arrive
    /// (checkpointing as configured), so reads rarely have a tail to apply.
    pub fn follow(self: &Arc<Self>, stop: Arc<AtomicBool>) -> JoinHandle<()> {
        let this = Arc::clone(self);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let next = this.position().next();
                if let Err(e) = this.log.wait_for(next, Duration::from_millis(200)) {
                    tracing::warn!(error = %e, "projection follower: waiting for the log failed");
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
                if let Err(e) = this.catch_up() {
                    tracing::error!(error = %e, "projection follower: catching up failed");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        })
    }

    /// The stream of `kind` `namespace/name` as the read model knows it. For
    /// VirtualMachineInstance, a standalone VMI's stream if one lives, else the VM's.
    fn stream_for(&self, model: &ReadModel, kind: Kind, namespace: &str, name: &str) -> String {
        if kind == Kind::VirtualMachineInstance {
            let vmi = stream_of(kind, namespace, name);
            if model.entry(&vmi).is_some_and(|e| e.live) {
                return vmi;
            }
            return stream_of(Kind::VirtualMachine, namespace, name);
        }
        stream_of(kind, namespace, name)
    }

    /// The object `kind` `namespace/name` now (after `min_position` if given), or `None`.
    pub fn get(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
        min_position: Option<Position>,
    ) -> Result<Option<ObjectView>> {
        self.sync(min_position)?;
        self.get_at(kind, namespace, name, At::Current)
    }

    /// Time travel: the object as it was at `at` (exactly what a reader saw then), or `None`
    /// if it did not exist then. Folds at most [`CacheOptions::snapshot_every_revisions`]
    /// events past a cached snapshot.
    pub fn get_at(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
        at: At,
    ) -> Result<Option<ObjectView>> {
        let (position, now_ns) = match at {
            At::Time(t) => (Some(self.log.position_at(t)?), Some(t.0)),
            At::Position(p) => {
                let head = self.log.head();
                if p > head {
                    return Err(Error::Invalid {
                        reason: format!("position {p} is past the log's head {head}"),
                    });
                }
                (Some(p), None)
            }
            At::Current | At::Revision(_) => (None, None),
        };
        self.catch_up()?;
        let (stream, revision) = {
            let model = self.model.read().unwrap_or_else(PoisonError::into_inner);
            let stream = self.stream_for(&model, kind, namespace, name);
            let Some(entry) = model.entry(&stream) else {
                return Ok(None);
            };
            if kind == Kind::KubeVirt && !name.is_empty() && entry.name() != name {
                return Ok(None);
            }
            let revision = match at {
                At::Current => entry.revision(),
                At::Revision(r) => {
                    if r == 0 || r > entry.revision() {
                        return Err(Error::NotFound {
                            what: format!("{stream} revision {r}"),
                        });
                    }
                    r
                }
                At::Position(_) | At::Time(_) => entry.revision_at(position.unwrap_or(Position(0))),
            };
            (stream, revision)
        };
        if revision == 0 {
            return Ok(None);
        }
        let stream_kind = if stream.starts_with("vm/") {
            Kind::VirtualMachine
        } else {
            kind
        };
        let snapshot = self.load(&stream, stream_kind, revision)?;
        let now_ms = match (at, now_ns) {
            (At::Current, _) => Timestamp::now().0 / 1_000_000,
            (_, Some(ns)) => ns / 1_000_000,
            _ => snapshot.recorded_at_ns / 1_000_000,
        };
        let features = self.features_at(match at {
            At::Current => None,
            At::Revision(_) => Some(snapshot.position),
            At::Position(_) | At::Time(_) => position,
        })?;
        Ok(render(&snapshot, kind, &features, now_ms))
    }

    /// `kind` `namespace/name` rendered from `snapshot`, the state a write just left it in
    /// (from [`crate::CommandHandler::execute_with_state`]): the same answer as
    /// `get_at(kind, namespace, name, At::Position(snapshot.position))`, without folding the
    /// stream again. Kinds whose stream is not simply theirs (a VMI may live in its VM's
    /// stream; the cluster config is one stream whatever its name) take the ordinary read.
    pub fn render_written(
        &self,
        snapshot: &Snapshot,
        kind: Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ObjectView>> {
        if matches!(kind, Kind::VirtualMachineInstance | Kind::KubeVirt) {
            return self.get_at(kind, namespace, name, At::Position(snapshot.position));
        }
        // The cluster config in force at the write's position must be folded in already.
        if self.position() < snapshot.position {
            self.catch_up()?;
        }
        let features = self.features_at(Some(snapshot.position))?;
        Ok(render(
            snapshot,
            kind,
            &features,
            snapshot.recorded_at_ns / 1_000_000,
        ))
    }

    /// The folded state of `stream` at `revision` (the aggregate, not rendered).
    pub fn state_at(&self, stream: &str, kind: Kind, revision: u64) -> Result<Arc<Snapshot>> {
        self.load(stream, kind, revision)
    }

    /// The state cache's fold, told where the stream's revisions are (the read model records
    /// their positions) so that it can scan a dense range of the log in place.
    fn load(&self, stream: &str, kind: Kind, revision: u64) -> Result<Arc<Snapshot>> {
        let locate = |r: u64| {
            let model = self.model.read().unwrap_or_else(PoisonError::into_inner);
            model.entry(stream).and_then(|e| e.position_of(r))
        };
        self.cache
            .state_at_located(self.log.as_ref(), stream, kind, revision, Some(&locate))
    }

    /// Every live object of `kind` (in `namespace`, or all namespaces for `None`), read at one
    /// position.
    pub fn list(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        min_position: Option<Position>,
    ) -> Result<ListResult> {
        let mut items = Vec::new();
        let position = self.visit(kind, namespace, min_position, |view| items.push(view))?;
        Ok(ListResult { items, position })
    }

    /// [`Projections::list`] one object at a time: `visit` sees each live object of `kind`
    /// (in `namespace`, or all), rendered at one position, which is returned. Nothing is
    /// collected, so a caller that only counts (the metrics) holds one object at a time
    /// however many there are.
    pub fn visit(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        min_position: Option<Position>,
        mut visit: impl FnMut(ObjectView),
    ) -> Result<Position> {
        self.sync(min_position)?;
        let (position, wanted) = {
            let model = self.model.read().unwrap_or_else(PoisonError::into_inner);
            let mut wanted = Vec::new();
            let kinds: &[Kind] = if kind == Kind::VirtualMachineInstance {
                &[Kind::VirtualMachineInstance, Kind::VirtualMachine]
            } else {
                std::slice::from_ref(&kind)
            };
            for k in kinds {
                let ki = Kind::ALL.iter().position(|x| x == k).unwrap_or(0) as u8;
                let lo = NameKey::new(ki, namespace.unwrap_or(""), "");
                for (key, idx) in model.by_name.range(lo..) {
                    let (ns, name) = (key.namespace(), key.name());
                    if key.kind != ki || namespace.is_some_and(|n| n != ns) {
                        break;
                    }
                    let Some(entry) = model.entry_at(*idx) else {
                        continue;
                    };
                    // A VM's VMI may outlive the VM (Terminating): keep dead VM streams for VMIs.
                    let keep = entry.live
                        || (kind == Kind::VirtualMachineInstance && *k == Kind::VirtualMachine);
                    if !keep {
                        continue;
                    }
                    wanted.push((
                        (ns.to_owned(), name.to_owned()),
                        entry.stream.to_string(),
                        *k,
                        entry.revision(),
                    ));
                }
            }
            wanted.sort();
            (model.applied(), wanted)
        };
        let now_ms = Timestamp::now().0 / 1_000_000;
        let features = self.features_at(Some(position))?;
        let mut seen_vmi = std::collections::HashSet::new();
        for ((ns, name), stream, stream_kind, revision) in wanted {
            if seen_vmi.contains(&(ns.clone(), name.clone())) {
                continue;
            }
            let snapshot = self.load(&stream, stream_kind, revision)?;
            if let Some(view) = render(&snapshot, kind, &features, now_ms) {
                if kind == Kind::VirtualMachineInstance {
                    seen_vmi.insert((ns, name));
                }
                visit(view);
            }
        }
        Ok(position)
    }

    /// The folded state of every stream of `kind` now, live or deleted (a deleted VM may still
    /// have a VMI to stop): what the reconciler compares with the hypervisor.
    pub fn states_of(&self, kind: Kind) -> Result<Vec<Arc<Snapshot>>> {
        self.catch_up()?;
        let wanted: Vec<(String, u64)> = {
            let model = self.model.read().unwrap_or_else(PoisonError::into_inner);
            let ki = Kind::ALL.iter().position(|x| *x == kind).unwrap_or(0) as u8;
            model
                .by_name
                .range(NameKey::new(ki, "", "")..)
                .take_while(|(key, _)| key.kind == ki)
                .filter_map(|(_, idx)| model.entry_at(*idx))
                .map(|e| (e.stream.to_string(), e.revision()))
                .collect()
        };
        wanted
            .into_iter()
            .filter(|(_, revision)| *revision > 0)
            .map(|(stream, revision)| self.load(&stream, kind, revision))
            .collect()
    }

    /// The live object holding firmware UUID `uuid`, if any.
    pub fn firmware_holder(&self, uuid: Uuid) -> Result<Option<ObjectRef>> {
        self.catch_up()?;
        let model = self.model.read().unwrap_or_else(PoisonError::into_inner);
        Ok(model
            .firmware
            .get(&uuid)
            .and_then(|idx| object_ref(&model, *idx)))
    }

    /// Live VMs whose spec requests `feature` (a KubeVirt feature-gate name), by namespace and
    /// name.
    pub fn vms_using_feature(&self, feature: &str) -> Result<Vec<ObjectRef>> {
        self.catch_up()?;
        self.settle()?;
        let model = self.model.read().unwrap_or_else(PoisonError::into_inner);
        Ok(sorted_refs(&model, model.feature_users(feature)))
    }

    /// Every feature some live VM requests, with how many VMs request it.
    pub fn feature_usage(&self) -> Result<Vec<(String, usize)>> {
        self.catch_up()?;
        self.settle()?;
        let model = self.model.read().unwrap_or_else(PoisonError::into_inner);
        Ok(model.feature_counts())
    }

    /// Live VMs that captured instancetype or preference `kind`/`name` at `revision` (any
    /// revision for `None`).
    pub fn vms_using_revision(
        &self,
        kind: Kind,
        name: &str,
        revision: Option<u64>,
    ) -> Result<Vec<ObjectRef>> {
        self.catch_up()?;
        self.settle()?;
        let model = self.model.read().unwrap_or_else(PoisonError::into_inner);
        Ok(sorted_refs(
            &model,
            model.revision_users(kind.as_str(), name, revision),
        ))
    }
}

fn object_ref(model: &ReadModel, idx: u32) -> Option<ObjectRef> {
    let entry = model.entry_at(idx)?;
    Some(ObjectRef {
        kind: entry.kind(),
        namespace: entry.namespace().map(str::to_owned),
        name: entry.name().to_owned(),
        stream: entry.stream.to_string(),
    })
}

fn sorted_refs(model: &ReadModel, idxs: Vec<u32>) -> Vec<ObjectRef> {
    let mut refs: Vec<ObjectRef> = idxs
        .into_iter()
        .filter_map(|i| object_ref(model, i))
        .collect();
    refs.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    refs
}

/// Applies every event after `from` to `model` with the log's zero-copy scan.
fn scan_into(log: &dyn EventLog, model: &mut ReadModel, from: Position) -> Result<Position> {
    let mut failure = None;
    let scanned = log.scan(from, &mut |event| {
        fail::fail_point!("projections::apply", |_| {
            failure = Some(Error::Invalid {
                reason: format!(
                    "projections::apply: injected by a fail point before position {}",
                    event.position.0
                ),
            });
            ControlFlow::Break(())
        });
        match model.apply(event) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                failure = Some(e);
                ControlFlow::Break(())
            }
        }
    });
    // Whatever stopped the fold, the entries it made are named before the model is read.
    model.flush_names();
    scanned?;
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(model.applied())
}

fn load_checkpoint(
    log: &dyn EventLog,
    path: &Path,
) -> std::result::Result<Option<ReadModel>, String> {
    let Some(loaded) = checkpoint::read::<ModelData>(path, READ_MODEL)? else {
        return Ok(None);
    };
    if loaded.position != loaded.body.applied {
        return Err("header and body disagree on the position".into());
    }
    if loaded.position > 0 {
        let event = log
            .read_event(Position(loaded.position))
            .map_err(|e| format!("reading the log at {}: {e}", loaded.position))?
            .ok_or_else(|| {
                format!(
                    "the log ends before the checkpoint's position {}",
                    loaded.position
                )
            })?;
        if event.hash != loaded.event_hash {
            return Err(format!(
                "the log's event at {} is not the one the checkpoint applied",
                loaded.position
            ));
        }
    }
    ReadModel::from_data(loaded.body)
        .map(Some)
        .map_err(|e| e.to_string())
}
