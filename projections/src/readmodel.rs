//! The current-state read model: one [`Entry`] per known stream (what the fold learns cheaply
//! from each event's envelope and, for the few identity events, its payload) and the indexes
//! over them. Specs are not copied here: they are folded on demand from the log through the
//! [`StateCache`], so a rebuild touches each event once, cheaply (DESIGN.md "Speed, by design").
//!
//! Facts that need a parsed spec (features requested, captured instancetype/preference
//! revisions) are *settled* lazily: an event that may change them marks the entry dirty, and
//! the queries over those indexes (and the digest) settle dirty entries first.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;
use vmplane_core::types::Kind;
use vmplane_core::{Event, VmState};
use vmplane_store::hash::event_hash;
use vmplane_store::{EventLog, Position, RecordedEvent, RecordedEventRef, ShardedMap, Timestamp};

use crate::cache::StateCache;
use crate::chunked::ChunkedVec;
use crate::error::{Error, Result};
use crate::features::state_features;
use crate::model::{AggState, decode, parse_stream, rfc3339_nanos};

/// A captured instancetype or preference revision: `(kind, name, generation)`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RevisionRef {
    /// `VirtualMachineInstancetype`, `VirtualMachineClusterPreference`, …
    pub kind: String,
    /// The referenced object's name.
    pub name: String,
    /// Its generation when the VM captured it.
    pub revision: u64,
}

/// Facts derived from a VM's parsed state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Derived {
    pub features: Vec<String>,
    pub instancetype: Option<RevisionRef>,
    pub preference: Option<RevisionRef>,
}

/// What the read model knows of one stream. Its namespace and name are those its stream's
/// name says (not kept twice), but for a cluster config named in its payload (`renamed`); the
/// stream's name is shared with the stream index. Serialized (checkpoint, digest) with every
/// field spelled out, as [`EntryData`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub stream: Arc<str>,
    /// Index into `Kind::ALL`.
    pub kind: u8,
    /// The name, when it is not the one the stream's name says.
    renamed: Option<String>,
    /// Events in the stream (its revision).
    pub revisions: u64,
    /// Where its revisions are in the log, as runs of consecutive positions: `(r, p)` says
    /// revision `r` is at position `p`, `r + 1` at `p + 1`, … up to the next run's first
    /// revision (or `revisions`). Events appended together form one run, so a stream's
    /// positions cost one pair per append, not one per event. The first run is kept inline.
    pub runs: Runs,
    pub live: bool,
    pub uid: Option<Uuid>,
    pub firmware: Option<Uuid>,
    pub derived: Derived,
    /// `derived` may be stale: settle before answering from it.
    pub dirty: bool,
}

/// A stream's runs of positions (see [`Entry::runs`]).
pub(crate) type Runs = smallvec::SmallVec<[(u64, u64); 1]>;

/// An [`Entry`] as checkpoints and the digest spell it (the read model's format: the same
/// fields in the same order as ever).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename = "Entry")]
struct EntryData<S, N, R, D> {
    stream: S,
    kind: u8,
    namespace: Option<N>,
    name: N,
    revisions: u64,
    runs: R,
    live: bool,
    uid: Option<Uuid>,
    firmware: Option<Uuid>,
    derived: D,
    dirty: bool,
}

impl Serialize for Entry {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        EntryData {
            stream: &*self.stream,
            kind: self.kind,
            namespace: self.namespace(),
            name: self.name(),
            revisions: self.revisions,
            runs: self.runs.as_slice(),
            live: self.live,
            uid: self.uid,
            firmware: self.firmware,
            derived: &self.derived,
            dirty: self.dirty,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Entry, D::Error> {
        let data =
            EntryData::<String, String, Vec<(u64, u64)>, Derived>::deserialize(deserializer)?;
        let Some(parsed) = parse_stream(&data.stream) else {
            return Err(serde::de::Error::custom(format!(
                "entry of an unknown stream {}",
                data.stream
            )));
        };
        if parsed.namespace != data.namespace.as_deref() {
            return Err(serde::de::Error::custom(format!(
                "entry of stream {} has namespace {:?}",
                data.stream, data.namespace
            )));
        }
        let renamed = (parsed.name != data.name).then_some(data.name);
        Ok(Entry {
            stream: Arc::from(data.stream),
            kind: data.kind,
            renamed,
            revisions: data.revisions,
            runs: Runs::from_vec(data.runs),
            live: data.live,
            uid: data.uid,
            firmware: data.firmware,
            derived: data.derived,
            dirty: data.dirty,
        })
    }
}

impl Entry {
    /// A stream's entry before its first event.
    fn new(stream: Arc<str>, kind: Kind) -> Entry {
        Entry {
            stream,
            kind: kind_index(kind),
            renamed: None,
            revisions: 0,
            runs: Runs::new(),
            live: false,
            uid: None,
            firmware: None,
            derived: Derived::default(),
            dirty: false,
        }
    }

    /// The namespace its stream's name says (None for cluster-scoped kinds).
    pub fn namespace(&self) -> Option<&str> {
        parse_stream(&self.stream).and_then(|p| p.namespace)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        match &self.renamed {
            Some(name) => name,
            None => parse_stream(&self.stream).map_or("", |p| p.name),
        }
    }

    /// Names it `name` (a cluster config's, from its payload).
    fn rename(&mut self, name: String) {
        let from_stream = parse_stream(&self.stream).map(|p| p.name);
        self.renamed = (from_stream != Some(name.as_str())).then_some(name);
    }

    pub fn kind(&self) -> Kind {
        Kind::ALL
            .get(usize::from(self.kind))
            .copied()
            .unwrap_or(Kind::VirtualMachine)
    }

    pub fn revision(&self) -> u64 {
        self.revisions
    }

    /// The last revision at or before `position` (0 if the stream had no event then).
    pub fn revision_at(&self, position: Position) -> u64 {
        let i = self.runs.partition_point(|(_, p)| *p <= position.0);
        if i == 0 {
            return 0;
        }
        let (r, p) = self.runs[i - 1];
        let run_last = self
            .runs
            .get(i)
            .map_or(self.revisions, |(next, _)| next - 1);
        (r + (position.0 - p)).min(run_last)
    }

    /// The position of revision `r` (`None` for 0 or past the stream's end).
    pub fn position_of(&self, r: u64) -> Option<Position> {
        if r == 0 || r > self.revisions {
            return None;
        }
        let i = self.runs.partition_point(|(first, _)| *first <= r);
        let (first, p) = *self.runs.get(i.checked_sub(1)?)?;
        Some(Position(p + (r - first)))
    }

    /// Records the next revision at `position`.
    fn push(&mut self, position: u64) {
        let next = self.revisions + 1;
        match self.runs.last() {
            Some((r, p)) if p + (next - r) == position => {}
            _ => self.runs.push((next, position)),
        }
        self.revisions = next;
    }
}

fn kind_index(kind: Kind) -> u8 {
    Kind::ALL
        .iter()
        .position(|k| *k == kind)
        .and_then(|i| u8::try_from(i).ok())
        .unwrap_or(0)
}

/// A key of the name index: `(kind index, namespace, name)`, ordered as that tuple, with the
/// namespace and the name borrowed from one shared string (an entry's stream name, so naming
/// a new stream allocates nothing more).
#[derive(Debug, Clone)]
pub(crate) struct NameKey {
    pub kind: u8,
    text: Arc<str>,
    namespace: std::ops::Range<usize>,
    name: std::ops::Range<usize>,
}

impl NameKey {
    /// `(kind, namespace, name)` (for lookups and range bounds).
    pub fn new(kind: u8, namespace: &str, name: &str) -> NameKey {
        NameKey {
            kind,
            text: Arc::from(format!("{namespace}{name}")),
            namespace: 0..namespace.len(),
            name: namespace.len()..namespace.len() + name.len(),
        }
    }

    /// The key of a stream, sharing its name; `None` if vmplane does not know the stream.
    fn of_stream(kind: u8, stream: &Arc<str>) -> Option<NameKey> {
        let parsed = parse_stream(stream)?;
        let range = |part: &str| {
            if part.is_empty() {
                return Some(0..0);
            }
            // `parse_stream` gives slices of `stream`: find where they start in it.
            let start = (part.as_ptr() as usize).checked_sub(stream.as_ptr() as usize)?;
            (stream.get(start..start + part.len()) == Some(part))
                .then_some(start..start + part.len())
        };
        Some(NameKey {
            kind,
            text: Arc::clone(stream),
            namespace: match parsed.namespace {
                Some(ns) => range(ns)?,
                None => 0..0,
            },
            name: range(parsed.name)?,
        })
    }

    pub fn namespace(&self) -> &str {
        self.text.get(self.namespace.clone()).unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.text.get(self.name.clone()).unwrap_or_default()
    }

    fn parts(&self) -> (u8, &str, &str) {
        (self.kind, self.namespace(), self.name())
    }
}

impl PartialEq for NameKey {
    fn eq(&self, other: &NameKey) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for NameKey {}

impl PartialOrd for NameKey {
    fn partial_cmp(&self, other: &NameKey) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for NameKey {
    fn cmp(&self, other: &NameKey) -> std::cmp::Ordering {
        self.parts().cmp(&other.parts())
    }
}

/// The system stream holding the `LogPositionVoided` events of restore `epoch`. Not an object's
/// stream: the read models skip it.
#[must_use]
pub fn void_stream(epoch: &Uuid) -> String {
    format!("system/restore/{epoch}")
}

/// The actor of the events a restore writes.
pub const RESTORE_ACTOR: &str = "system:restore";

/// The `LogPositionVoided` event standing at `original`'s position in a log cut at `cut`, the
/// `revision`-th of restore `epoch`'s stream, chained after `prev_hash`: what a point-in-time
/// restore writes in place of every position after its cut.
pub fn void_event(
    original: &RecordedEvent,
    epoch: Uuid,
    cut: u64,
    revision: u64,
    recorded_at: Timestamp,
    prev_hash: [u8; 32],
) -> RecordedEvent {
    let payload = vmplane_core::encode(&Event::LogPositionVoided(
        vmplane_core::event::LogPositionVoided {
            restore_epoch: epoch,
            cut_position: cut,
            voided_position: original.position.0,
            original_id: original.id,
            original_hash: original.hash,
            original_stream: original.stream.clone(),
            original_event_type: original.event_type.clone(),
            original_schema_version: original.schema_version,
            original_actor: original.actor.clone(),
            original_recorded_at_unix_nanos: original.recorded_at.0,
        },
    ));
    let mut event = RecordedEvent {
        position: original.position,
        stream: void_stream(&epoch),
        revision,
        id: Uuid::now_v7(),
        recorded_at,
        actor: RESTORE_ACTOR.into(),
        correlation_id: epoch,
        causation_id: None,
        event_type: payload.type_name.into(),
        schema_version: payload.version,
        payload: payload.bytes,
        prev_hash,
        hash: [0; 32],
    };
    event.hash = event_hash(&event.as_ref());
    event
}

/// Positions a point-in-time restore voided: a run of consecutive `LogPositionVoided` events
/// of one restore (`vmplane admin restore --to-position` / `--to-time`, see the gateway's
/// `dr` module), folded from the log like everything else the read model knows. Every position
/// in `first..=last` stood for an event of the backed-up log that the restored history does not
/// have: a position the original server handed out there names nothing the restored server can
/// continue from, so watches and time travel refuse it, and lists never read at one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VoidedRange {
    /// The first voided position (`cut + 1` for the range a restore made itself).
    pub first: u64,
    /// The last voided position (the backup's last one).
    pub last: u64,
    /// The restore that voided them (its epoch; the void events' stream is
    /// `system/restore/<epoch>`).
    pub epoch: Uuid,
    /// The last position that restore kept.
    pub cut: u64,
    /// When the void events were recorded (ns since the epoch): the restore, or the cut's own
    /// time when that was later.
    pub recorded_at_ns: i64,
    /// When the original server recorded the first voided event (ns since the epoch).
    pub original_from_ns: i64,
    /// When the original server recorded the last voided event (ns since the epoch).
    pub original_to_ns: i64,
    /// Who recorded the void events (`system:restore`).
    pub actor: String,
}

impl VoidedRange {
    /// Whether `position` is one of these.
    #[must_use]
    pub fn holds(&self, position: u64) -> bool {
        (self.first..=self.last).contains(&position)
    }

    /// How many positions were voided.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.last - self.first + 1
    }

    /// Never: a range holds at least one position (for clippy's `len_without_is_empty`).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether the restore rewrote what the log says of instant `ns`: from the time the
    /// original server recorded the first voided event to the time the restore recorded the
    /// void events. In between, the original server had served the voided events (and
    /// perhaps more after the backup), while the restored log says nothing happened after the
    /// cut: an answer "as of" such an instant from the restored log would contradict what was
    /// served then. Before it the two agree; from the restore on, the restored log is what was
    /// served.
    #[must_use]
    pub fn rewrote(&self, ns: i64) -> bool {
        self.original_from_ns <= ns && ns < self.recorded_at_ns
    }

    /// The stream of its void events.
    #[must_use]
    pub fn stream(&self) -> String {
        format!("system/restore/{}", self.epoch)
    }

    /// Why `field` `position`, one of these, is refused (by a watch from it, a read at it, a
    /// list page of a token carrying it): the same words everywhere, naming the restore, the
    /// cut and the range only, never what stood there (another namespace's, perhaps).
    #[must_use]
    pub fn position_gone(&self, field: &str, position: u64) -> String {
        format!(
            "{field} {position}: that position is gone: the point-in-time restore {} cut the \
             log at position {} and voided positions {}..={} (the events the original server \
             recorded there are not part of this history); re-list, then watch from the \
             list's resourceVersion",
            self.epoch, self.cut, self.first, self.last
        )
    }

    /// When the original server recorded the voided events: `at T`, or `from T1 to T2`.
    fn recorded_span(&self) -> String {
        let (from, to) = (
            rfc3339_nanos(self.original_from_ns),
            rfc3339_nanos(self.original_to_ns),
        );
        if from == to {
            format!("at {from}")
        } else {
            format!("from {from} to {to}")
        }
    }

    /// Why `field` `at` (the instant's RFC 3339 text), an instant these rewrote (see
    /// [`VoidedRange::rewrote`]), is refused by a read as of it.
    #[must_use]
    pub fn time_gone(&self, field: &str, at: &str) -> String {
        let (from, restored) = (
            rfc3339_nanos(self.original_from_ns),
            rfc3339_nanos(self.recorded_at_ns),
        );
        format!(
            "{field} {at}: that time is gone: the point-in-time restore {} cut the log at \
             position {} and voided positions {}..={}, which the original server recorded {}; \
             the restored history does not hold the state served from then to the restore at \
             {restored}: ask as of before {from} (the state at the cut) or from {restored} on",
            self.epoch,
            self.cut,
            self.first,
            self.last,
            self.recorded_span(),
        )
    }

    /// The one-line summary of its audit entry: what was voided, by which restore, why.
    #[must_use]
    pub fn summary(&self) -> String {
        let n = self.len();
        format!(
            "point-in-time restore {} cut the log at position {}: positions {}..={} voided \
             ({n} event{} the original server recorded {}, undone; the restored history goes on \
             after position {}); watches and reads at them are refused",
            self.epoch,
            self.cut,
            self.first,
            self.last,
            if n == 1 { "" } else { "s" },
            self.recorded_span(),
            self.last,
        )
    }
}

/// The persisted part of the read model (its checkpoint body).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ModelData {
    pub applied: u64,
    /// Hex of the hash of the event at `applied` (zeros for 0): a checkpoint matches a log only
    /// if the log has that very event there.
    pub applied_hash: String,
    pub entries: ChunkedVec<Entry>,
    /// The positions point-in-time restores voided, in log order (few: one per restore that
    /// cut a log, or two when a later cut falls inside an earlier one's range).
    pub voided: Vec<VoidedRange>,
}

/// [`ModelData`] borrowed from a live model, for writing a checkpoint without copying it
/// (same fields, same order, same JSON).
#[derive(Debug, Serialize)]
pub(crate) struct PersistedRef<'a> {
    pub applied: u64,
    pub applied_hash: String,
    pub entries: &'a ChunkedVec<Entry>,
    pub voided: &'a [VoidedRange],
}

/// A checkpoint's content taken from the model (see [`ReadModel::persisted_snapshot`]).
pub(crate) struct PersistedSnapshot {
    applied: u64,
    applied_hash: [u8; 32],
    entries: ChunkedVec<Entry>,
    voided: Vec<VoidedRange>,
}

impl PersistedSnapshot {
    /// The position applied.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The streams it holds.
    pub fn streams(&self) -> u64 {
        self.entries.len() as u64
    }

    /// The hash of the event at that position.
    pub fn hash(&self) -> &[u8; 32] {
        &self.applied_hash
    }

    /// As checkpoints spell it.
    pub fn persisted(&self) -> PersistedRef<'_> {
        PersistedRef {
            applied: self.applied,
            applied_hash: hex::encode(self.applied_hash),
            entries: &self.entries,
            voided: &self.voided,
        }
    }
}

/// Entries plus indexes. The follower grows them under the read model's write lock, so none
/// moves everything it holds at once as it grows (a stall of every read): the entries are a
/// [`ChunkedVec`] and the hash indexes [`ShardedMap`]s.
#[derive(Debug, Default)]
pub(crate) struct ReadModel {
    pub data: ModelData,
    by_stream: ShardedMap<Arc<str>, u32>,
    /// `(kind index, namespace, name)` → entry.
    pub by_name: BTreeMap<NameKey, u32>,
    /// Names of entries made by the fold and not in `by_name` yet: they are added together
    /// by [`ReadModel::flush_names`] when the fold stops (a fresh model's index is then built
    /// in one go from sorted keys instead of one insertion per stream).
    pending_names: Vec<(NameKey, u32)>,
    /// Live firmware UUID → entry.
    pub firmware: ShardedMap<Uuid, u32>,
    features: BTreeMap<String, BTreeSet<u32>>,
    revisions: BTreeMap<RevisionRef, BTreeSet<u32>>,
    dirty: BTreeSet<u32>,
    /// The hash of the last applied event (kept raw; hexed only when checkpointing), if
    /// known: the fold does not copy each event's hash (it is only needed for a checkpoint,
    /// and reading it costs the fold a cache miss per event); `None` says it is the hash of
    /// the log's event at `applied`, read from the log when a checkpoint needs it.
    applied_hash: Option<[u8; 32]>,
    /// The entry of the last applied event: the log holds runs of one stream's events (one
    /// append), and comparing a name is cheaper than hashing it.
    last: Option<u32>,
}

impl ReadModel {
    /// Rebuilds every index from persisted entries.
    pub fn from_data(data: ModelData) -> Result<ReadModel> {
        let mut applied_hash = [0u8; 32];
        if !data.applied_hash.is_empty() {
            hex::decode_to_slice(&data.applied_hash, &mut applied_hash).map_err(|e| {
                Error::Invalid {
                    reason: format!("checkpoint hash: {e}"),
                }
            })?;
        }
        let mut model = ReadModel {
            applied_hash: Some(applied_hash),
            ..ReadModel::default()
        };
        for (i, entry) in data.entries.iter().enumerate() {
            let idx = u32::try_from(i).map_err(|_| Error::Invalid {
                reason: "too many entries".into(),
            })?;
            model.by_stream.insert(Arc::clone(&entry.stream), idx);
            let key = match &entry.renamed {
                Some(name) => NameKey::new(entry.kind, "", name),
                None => {
                    NameKey::of_stream(entry.kind, &entry.stream).ok_or_else(|| Error::Invalid {
                        reason: format!("checkpoint entry of an unknown stream {}", entry.stream),
                    })?
                }
            };
            model.by_name.insert(key, idx);
            if entry.live
                && let Some(fw) = entry.firmware
            {
                model.firmware.insert(fw, idx);
            }
            if entry.dirty {
                model.dirty.insert(idx);
            }
        }
        model.data = data;
        for idx in 0..model.data.entries.len() {
            let idx = idx as u32;
            let derived = model.data.entries[idx as usize].derived.clone();
            model.index_derived(idx, &derived, true);
        }
        Ok(model)
    }

    pub fn applied(&self) -> Position {
        Position(self.data.applied)
    }

    pub fn entry(&self, stream: &str) -> Option<&Entry> {
        let idx = *self.by_stream.get(stream)?;
        self.data.entries.get(idx as usize)
    }

    pub fn entry_at(&self, idx: u32) -> Option<&Entry> {
        self.data.entries.get(idx as usize)
    }

    /// Folds one event of the log: the next position, always (streams vmplane does not know
    /// are counted and otherwise skipped).
    pub fn apply(&mut self, event: &RecordedEventRef<'_>) -> Result<()> {
        if event.position.0 != self.data.applied + 1 {
            return Err(Error::Corrupt {
                position: event.position,
                reason: format!(
                    "the projection is at position {}, the log gave {}",
                    self.data.applied, event.position
                ),
            });
        }
        self.data.applied = event.position.0;
        self.applied_hash = None;
        let last = self.last.filter(|i| {
            self.data.entries.get(*i as usize).map(|e| &*e.stream) == Some(event.stream)
        });
        let idx = match last.or_else(|| self.by_stream.get(event.stream).copied()) {
            Some(idx) => idx,
            None => {
                let Some(parsed) = parse_stream(event.stream) else {
                    // Streams of no object: a point-in-time restore's void events are kept as
                    // ranges; any other is counted and skipped.
                    if event.event_type == "LogPositionVoided" {
                        self.void(event)?;
                    }
                    return Ok(());
                };
                let idx = u32::try_from(self.data.entries.len()).map_err(|_| Error::Invalid {
                    reason: "too many streams".into(),
                })?;
                let stream: Arc<str> = Arc::from(event.stream);
                let key =
                    NameKey::of_stream(kind_index(parsed.kind), &stream).ok_or_else(|| {
                        Error::Corrupt {
                            position: event.position,
                            reason: format!("stream name {} cannot be indexed", event.stream),
                        }
                    })?;
                self.pending_names.push((key, idx));
                self.by_stream.insert(Arc::clone(&stream), idx);
                let entry = Entry::new(stream, parsed.kind);
                self.data.entries.push(entry);
                idx
            }
        };
        self.last = Some(idx);
        let entry = &mut self.data.entries[idx as usize];
        if event.revision != entry.revision() + 1 {
            return Err(Error::Corrupt {
                position: event.position,
                reason: format!(
                    "stream {} revision {} where {} was expected",
                    event.stream,
                    event.revision,
                    entry.revision() + 1
                ),
            });
        }
        entry.push(event.position.0);
        match event.event_type {
            "VmCreated" | "VmiCreated" | "ObjectCreated" => {
                // Read in place: the fold needs the identity, not the manifest.
                let created = vmplane_core::event::decode_created(
                    event.event_type,
                    event.schema_version,
                    event.payload,
                )
                .map_err(|e| Error::Corrupt {
                    position: event.position,
                    reason: e.to_string(),
                })?;
                let Some(created) = created else {
                    // An unknown version: decoded as every event is, to say why it is refused.
                    decode(event)?;
                    return Ok(());
                };
                let (uid, firmware, name) = (created.uid, created.firmware_uuid, created.name);
                entry.live = true;
                entry.uid = Some(uid);
                let old_firmware = std::mem::replace(&mut entry.firmware, firmware);
                let kind = entry.kind;
                if kind_index(Kind::KubeVirt) == kind
                    && let Some(name) = name
                    && name != entry.name()
                {
                    let old = entry.name().to_owned();
                    entry.rename(name.clone());
                    self.flush_names();
                    self.by_name.remove(&NameKey::new(kind, "", &old));
                    self.by_name.insert(NameKey::new(kind, "", &name), idx);
                }
                self.replace_firmware(idx, old_firmware, firmware);
                self.mark_dirty(idx);
            }
            "VmDeleted" | "VmiDeleted" | "ObjectDeleted" => {
                entry.live = false;
                let old_firmware = entry.firmware;
                self.replace_firmware(idx, old_firmware, old_firmware);
                let derived = std::mem::take(&mut self.data.entries[idx as usize].derived);
                self.index_derived(idx, &derived, false);
                self.data.entries[idx as usize].dirty = false;
                self.dirty.remove(&idx);
            }
            "FirmwareUuidAssigned" => {
                if let Event::FirmwareUuidAssigned(e) = decode(event)? {
                    let old = entry.firmware.replace(e.uuid);
                    self.replace_firmware(idx, old, Some(e.uuid));
                }
            }
            "VmSpecEdited" | "InstancetypeRevisionCaptured" | "PreferenceRevisionCaptured" => {
                self.mark_dirty(idx);
            }
            _ => {}
        }
        Ok(())
    }

    /// Folds a `LogPositionVoided` event into [`ModelData::voided`]: it extends the last range
    /// when it follows it and comes from the same restore, else it starts a range.
    fn void(&mut self, event: &RecordedEventRef<'_>) -> Result<()> {
        let Event::LogPositionVoided(void) = decode(event)? else {
            return Err(Error::Corrupt {
                position: event.position,
                reason: "a LogPositionVoided envelope holds another event".into(),
            });
        };
        let position = event.position.0;
        let original_ns = void.original_recorded_at_unix_nanos;
        if let Some(last) = self.data.voided.last_mut()
            && last.epoch == void.restore_epoch
            && last.last + 1 == position
        {
            last.last = position;
            last.original_to_ns = last.original_to_ns.max(original_ns);
            last.recorded_at_ns = last.recorded_at_ns.max(event.recorded_at.0);
            return Ok(());
        }
        self.data.voided.push(VoidedRange {
            first: position,
            last: position,
            epoch: void.restore_epoch,
            cut: void.cut_position,
            recorded_at_ns: event.recorded_at.0,
            original_from_ns: original_ns,
            original_to_ns: original_ns,
            actor: event.actor.to_owned(),
        });
        Ok(())
    }

    /// The positions point-in-time restores voided, in log order.
    pub fn voided(&self) -> &[VoidedRange] {
        &self.data.voided
    }

    /// The voided range holding `position`, if one does.
    pub fn voided_at(&self, position: u64) -> Option<&VoidedRange> {
        let i = self.data.voided.partition_point(|r| r.last < position);
        self.data.voided.get(i).filter(|r| r.holds(position))
    }

    /// The last position at or before `position` that no restore voided (0 if none): what the
    /// log reads the same at, and what a reader at `position` is told it read at.
    pub fn live_at(&self, position: u64) -> u64 {
        let mut p = position;
        // Ranges may touch (a later cut inside an earlier range): step back over each.
        while let Some(range) = self.voided_at(p) {
            p = range.first - 1;
        }
        p
    }

    /// Adds the names of the entries the fold made to `by_name`. The fold's caller calls it
    /// when it stops (whether or not it failed), before the model is read again.
    pub fn flush_names(&mut self) {
        if self.pending_names.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending_names);
        if self.by_name.is_empty() {
            // Sorted, then built in one pass.
            self.by_name = pending.into_iter().collect();
        } else {
            self.by_name.extend(pending);
        }
    }

    fn mark_dirty(&mut self, idx: u32) {
        let entry = &mut self.data.entries[idx as usize];
        let indexed = entry.kind == kind_index(Kind::VirtualMachine)
            || entry.kind == kind_index(Kind::VirtualMachineInstance);
        if indexed && entry.live {
            entry.dirty = true;
            self.dirty.insert(idx);
        }
    }

    /// Moves the firmware index of entry `idx` from `old` to `new` (only while it is live).
    fn replace_firmware(&mut self, idx: u32, old: Option<Uuid>, new: Option<Uuid>) {
        if let Some(old) = old
            && self.firmware.get(&old) == Some(&idx)
        {
            self.firmware.remove(&old);
        }
        if self.data.entries[idx as usize].live
            && let Some(new) = new
        {
            self.firmware.insert(new, idx);
        }
    }

    fn index_derived(&mut self, idx: u32, derived: &Derived, add: bool) {
        let features = derived.features.iter().cloned();
        for feature in features {
            let set = self.features.entry(feature.clone()).or_default();
            if add {
                set.insert(idx);
            } else {
                set.remove(&idx);
                if set.is_empty() {
                    self.features.remove(&feature);
                }
            }
        }
        for r in [&derived.instancetype, &derived.preference]
            .into_iter()
            .flatten()
        {
            let set = self.revisions.entry(r.clone()).or_default();
            if add {
                set.insert(idx);
            } else {
                set.remove(&idx);
                if set.is_empty() {
                    self.revisions.remove(r);
                }
            }
        }
    }

    /// Whether derived facts must be settled before they are read.
    pub fn needs_settle(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Settles every dirty entry: folds its state at its current revision and recomputes the
    /// derived facts.
    pub fn settle(&mut self, log: &dyn EventLog, cache: &StateCache) -> Result<()> {
        let dirty = std::mem::take(&mut self.dirty);
        for idx in dirty {
            let entry = &self.data.entries[idx as usize];
            let snapshot = cache.state_at(log, &entry.stream, entry.kind(), entry.revision())?;
            let derived = match &snapshot.state {
                // A Terminating VM still requests what its spec does.
                AggState::Vm(state) if state.exists() => derived_of(state),
                // Standalone VMIs request features too (`features usage` lists them).
                AggState::Vmi(state) if state.is_live() => Derived {
                    features: crate::features::vmi_state_features(state),
                    ..Derived::default()
                },
                _ => Derived::default(),
            };
            let old = std::mem::replace(&mut self.data.entries[idx as usize].derived, derived);
            self.index_derived(idx, &old, false);
            let new = self.data.entries[idx as usize].derived.clone();
            self.index_derived(idx, &new, true);
            self.data.entries[idx as usize].dirty = false;
        }
        Ok(())
    }

    /// Live VMs requesting `feature` (settled entries only: call [`ReadModel::settle`] first).
    pub fn feature_users(&self, feature: &str) -> Vec<u32> {
        self.features
            .get(feature)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Every feature requested by some live VM, with how many.
    pub fn feature_counts(&self) -> Vec<(String, usize)> {
        self.features
            .iter()
            .map(|(k, v)| (k.clone(), v.len()))
            .collect()
    }

    /// Live VMs that captured `revision` (all revisions of the name if `revision.revision` is 0).
    pub fn revision_users(&self, kind: &str, name: &str, revision: Option<u64>) -> Vec<u32> {
        let lo = RevisionRef {
            kind: kind.to_owned(),
            name: name.to_owned(),
            revision: revision.unwrap_or(0),
        };
        let hi = RevisionRef {
            revision: revision.unwrap_or(u64::MAX),
            ..lo.clone()
        };
        let mut out: BTreeSet<u32> = BTreeSet::new();
        for (_, set) in self.revisions.range(lo..=hi) {
            out.extend(set.iter().copied());
        }
        out.into_iter().collect()
    }

    /// What a checkpoint holds, owned, to serialize without the model: the entries are a clone
    /// that shares their chunks (copied only as the model changes them).
    pub fn persisted_snapshot(&self, applied_hash: [u8; 32]) -> PersistedSnapshot {
        PersistedSnapshot {
            applied: self.data.applied,
            applied_hash,
            entries: self.data.entries.clone(),
            voided: self.data.voided.clone(),
        }
    }

    /// An empty model with room for `streams` streams.
    pub fn with_capacity(streams: usize) -> ReadModel {
        let mut model = ReadModel::default();
        model.data.entries.reserve(streams);
        model.by_stream.reserve(streams);
        model.pending_names.reserve(streams);
        model.firmware.reserve(streams);
        model
    }

    /// Streams known.
    pub fn streams(&self) -> usize {
        self.data.entries.len()
    }

    /// The hash of the event at [`ReadModel::applied`] (zeros for none), read from `log` if
    /// the fold did not keep it.
    pub fn applied_hash(&self, log: &dyn EventLog) -> Result<[u8; 32]> {
        if let Some(hash) = self.applied_hash {
            return Ok(hash);
        }
        let position = self.applied();
        if position.0 == 0 {
            return Ok([0u8; 32]);
        }
        match log.read_event(position)? {
            Some(event) => Ok(event.hash),
            None => Err(Error::Corrupt {
                position,
                reason: "the log no longer has the event the read model applied".into(),
            }),
        }
    }

    /// The canonical content: the position, then each entry as JSON, by stream name.
    pub fn canonical_lines(&self) -> Vec<String> {
        let mut order: Vec<&Entry> = self.data.entries.iter().collect();
        order.sort_by(|a, b| a.stream.cmp(&b.stream));
        let mut out = vec![format!("position {}", self.data.applied)];
        out.extend(
            order
                .into_iter()
                .filter_map(|e| serde_json::to_string(e).ok()),
        );
        out.extend(
            self.data
                .voided
                .iter()
                .filter_map(|r| serde_json::to_string(r).ok())
                .map(|r| format!("voided {r}")),
        );
        out
    }

    /// SHA-256 over the canonical content (entries by stream name, then the position). Call
    /// [`ReadModel::settle`] first so derived facts are current.
    pub fn digest(&self) -> String {
        let mut order: Vec<&Entry> = self.data.entries.iter().collect();
        order.sort_by(|a, b| a.stream.cmp(&b.stream));
        let mut hasher = Sha256::new();
        hasher.update(b"vmplane-projections/readmodel\n");
        hasher.update(self.data.applied.to_be_bytes());
        for entry in order {
            // Entries serialize deterministically (plain structs, sorted lists).
            if let Ok(bytes) = serde_json::to_vec(entry) {
                hasher.update((bytes.len() as u64).to_be_bytes());
                hasher.update(&bytes);
            }
        }
        // A log without voided positions keeps the digest it always had.
        for range in &self.data.voided {
            if let Ok(bytes) = serde_json::to_vec(range) {
                hasher.update(b"voided");
                hasher.update((bytes.len() as u64).to_be_bytes());
                hasher.update(&bytes);
            }
        }
        hex::encode(hasher.finalize())
    }
}

fn derived_of(state: &VmState) -> Derived {
    let rev = |c: (Kind, String, u64)| RevisionRef {
        kind: c.0.as_str().to_owned(),
        name: c.1,
        revision: c.2,
    };
    Derived {
        features: state_features(state),
        instancetype: state.instancetype.as_ref().map(|c| rev(c.revision())),
        preference: state.preference.as_ref().map(|c| rev(c.revision())),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn entry() -> Entry {
        let mut e = Entry::new(Arc::from("vm/ns/a"), Kind::VirtualMachine);
        e.live = true;
        e
    }

    #[test]
    fn name_keys_of_streams_order_and_compare_as_their_tuples() {
        let streams = [
            "vm/a/x",
            "vm/a-b/y",
            "vm/a/x-1",
            "vm/b/a",
            "vmi/a/x",
            "clusterinstancetype/u1.small",
            "instancetype/ns/u1",
            "cluster/config",
            "vm/ns/with/slash",
        ];
        let mut keys = Vec::new();
        for stream in streams {
            let parsed = parse_stream(stream).expect("known stream");
            let kind = kind_index(parsed.kind);
            let key = NameKey::of_stream(kind, &Arc::from(stream)).expect("key");
            let tuple = (kind, parsed.namespace.unwrap_or(""), parsed.name);
            assert_eq!(key.parts(), tuple, "{stream}");
            assert_eq!(key, NameKey::new(tuple.0, tuple.1, tuple.2));
            keys.push((key, tuple));
        }
        for (a, ta) in &keys {
            for (b, tb) in &keys {
                assert_eq!(a.cmp(b), ta.cmp(tb), "{ta:?} vs {tb:?}");
            }
        }
    }

    #[test]
    fn events_appended_together_take_one_run() {
        let mut e = entry();
        for p in 10..110 {
            e.push(p);
        }
        e.push(500);
        assert_eq!(e.runs.as_slice(), [(1, 10), (101, 500)]);
        assert_eq!(e.revision(), 101);
        assert_eq!(e.position_of(100), Some(Position(109)));
        assert_eq!(e.position_of(101), Some(Position(500)));
        assert_eq!(e.position_of(0), None);
        assert_eq!(e.position_of(102), None);
        assert_eq!(e.revision_at(Position(9)), 0);
        assert_eq!(e.revision_at(Position(300)), 100);
        assert_eq!(e.revision_at(Position(10_000)), 101);
    }

    proptest! {
        /// Runs answer exactly as the list of every revision's position would.
        #[test]
        fn runs_answer_like_a_position_per_revision(
            gaps in proptest::collection::vec(prop_oneof![3 => Just(1u64), 1 => 1u64..20], 0..200),
            probes in proptest::collection::vec(0u64..4_000, 1..50),
        ) {
            let mut e = entry();
            let mut positions = Vec::new();
            let mut p = 0;
            for gap in gaps {
                p += gap;
                positions.push(p);
                e.push(p);
            }
            prop_assert_eq!(e.revision(), positions.len() as u64);
            for (i, p) in positions.iter().enumerate() {
                prop_assert_eq!(e.position_of(i as u64 + 1), Some(Position(*p)));
            }
            prop_assert_eq!(e.position_of(positions.len() as u64 + 1), None);
            for probe in probes {
                let expected = positions.partition_point(|p| *p <= probe) as u64;
                prop_assert_eq!(e.revision_at(Position(probe)), expected);
            }
        }
    }
}
