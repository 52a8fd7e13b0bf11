//! History, diff and audit: reads of the log itself, shaped for people and scripts
//! (INTERFACE.md: `history -o json`, `diff`, `audit -o json`).

use std::ops::ControlFlow;

use serde::Serialize;
use similar::TextDiff;
use vmplane_core::event::Event;
use vmplane_core::lifecycle;
use vmplane_core::types::{Kind, VirtualMachine};
use vmplane_store::{Direction, Position, Timestamp};

use crate::error::{Error, Result};
use crate::model::{AggState, decode, parse_stream, rfc3339_nanos, stream_of};
use crate::projections::{At, Projections};

/// One revision of an object: the events one command appended (they share a correlation id
/// and follow each other), ending at stream revision `revision`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HistoryEntry {
    /// The stream revision after these events (what `get --revision` and `diff` take).
    pub revision: u64,
    /// The stream revision of the first of them: the row covers `first_revision..=revision`,
    /// each of which `get --revision` and `diff` take too.
    pub first_revision: u64,
    /// The position of the last of them.
    pub position: u64,
    /// The object's `metadata.generation` after them. It counts the object's own changes
    /// (creation, edits, run-strategy changes), as Kubernetes' does; the stream revision also
    /// counts every other event of the stream (start and stop requests, the VMI's lifecycle
    /// in a VM's stream), so the two part as soon as a VM is started.
    pub generation: u64,
    /// When they were recorded (RFC 3339, UTC).
    pub time: String,
    /// Who caused them.
    pub actor: String,
    /// Their event types, in order.
    pub events: Vec<String>,
    /// One line: the events' summaries joined by `; `.
    pub summary: String,
}

/// One audited event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditRecord {
    /// Its position.
    pub position: u64,
    /// When it was recorded (RFC 3339, UTC).
    pub time: String,
    /// Who caused it.
    pub actor: String,
    /// The object's namespace (empty for cluster-scoped objects).
    pub namespace: String,
    /// The object's kind.
    pub kind: String,
    /// The object's name.
    pub name: String,
    /// The event type.
    pub event: String,
    /// One line.
    pub summary: String,
}

/// What `audit` selects; every filter is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditQuery {
    /// Only events caused by this principal.
    pub actor: Option<String>,
    /// Only objects of this namespace.
    pub namespace: Option<String>,
    /// Only objects of these namespaces, and cluster-scoped ones (what a principal may read,
    /// for an audit of all namespaces); `None`: every namespace.
    pub readable: Option<Vec<String>>,
    /// Only objects of this kind (VMI events recorded in a VM's stream count as both).
    pub kind: Option<Kind>,
    /// Only events recorded at or after this instant.
    pub since: Option<Timestamp>,
    /// Only events recorded at or before this instant.
    pub until: Option<Timestamp>,
    /// At most this many records: the newest that match (0: all).
    pub records_max: usize,
}

/// What [`Projections::audit`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Audit {
    /// The newest matching events, at most the query's `records_max`, oldest first.
    pub records: Vec<AuditRecord>,
    /// How many older events matched too but were left out by `records_max`.
    pub older: u64,
}

/// A unified diff of an object's spec between two revisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecDiff {
    /// The older revision.
    pub from: u64,
    /// The newer revision.
    pub to: u64,
    /// The unified diff (empty when equal).
    pub diff: String,
}

impl SpecDiff {
    /// Whether the two specs are equal (`diff`'s exit status 0).
    #[must_use]
    pub fn is_equal(&self) -> bool {
        self.diff.is_empty()
    }
}

impl Projections {
    /// The revisions of `kind` `namespace/name`, oldest first.
    pub fn history(&self, kind: Kind, namespace: &str, name: &str) -> Result<Vec<HistoryEntry>> {
        self.check_cluster_config_name(kind, name)?;
        let stream = stream_of(kind, namespace, name);
        let log = self.log();
        let read_max = log.limits().read_events_max.max(1);
        let mut out: Vec<HistoryEntry> = Vec::new();
        let mut last_correlation = None;
        let mut from = 1;
        // The object folded along, for each row's generation.
        let mut state = AggState::empty(kind);
        loop {
            let events = log.read_stream(&stream, from, Direction::Forward, read_max)?;
            let Some(last) = events.last() else { break };
            from = last.revision + 1;
            for event in &events {
                let decoded = decode(&event.as_ref())?;
                let edited_from = match (&decoded, &state) {
                    (Event::VmSpecEdited(_), AggState::Vm(s)) => s.vm.clone(),
                    _ => None,
                };
                state.evolve(&decoded);
                let summary = match (edited_from, &state) {
                    (Some(before), AggState::Vm(s)) => s.vm.as_deref().map_or_else(
                        || decoded.summary(),
                        |after| lifecycle::edit_summary(&before, after),
                    ),
                    _ => decoded.summary(),
                };
                let same = last_correlation == Some(event.correlation_id)
                    && out.last().is_some_and(|h| h.actor == event.actor);
                if same && let Some(h) = out.last_mut() {
                    h.revision = event.revision;
                    h.position = event.position.0;
                    h.generation = state.generation();
                    h.events.push(event.event_type.clone());
                    h.summary.push_str("; ");
                    h.summary.push_str(&summary);
                } else {
                    out.push(HistoryEntry {
                        revision: event.revision,
                        first_revision: event.revision,
                        position: event.position.0,
                        generation: state.generation(),
                        time: rfc3339_nanos(event.recorded_at.0),
                        actor: event.actor.clone(),
                        events: vec![event.event_type.clone()],
                        summary,
                    });
                }
                last_correlation = Some(event.correlation_id);
            }
            if events.len() < read_max {
                break;
            }
        }
        if out.is_empty() {
            return Err(Error::NotFound {
                what: object_name(kind, namespace, name),
            });
        }
        Ok(out)
    }

    /// The revisions of the VMI the VM `namespace/name` runs now. A VM's VMI has no stream of
    /// its own: its events are in the VM's, so these are the VM's rows (its revision numbers)
    /// from the VMI's launch on that hold events about the VMI ([`event_kind`]). NotFound if
    /// the VM has no VMI now.
    pub fn vm_vmi_history(&self, namespace: &str, name: &str) -> Result<Vec<HistoryEntry>> {
        let not_found = || Error::NotFound {
            what: object_name(Kind::VirtualMachineInstance, namespace, name),
        };
        if self
            .get_at(Kind::VirtualMachineInstance, namespace, name, At::Current)?
            .is_none()
        {
            return Err(not_found());
        }
        let rows = match self.history(Kind::VirtualMachine, namespace, name) {
            Err(Error::NotFound { .. }) => return Err(not_found()),
            rows => rows?,
        };
        let about_vmi = |row: &HistoryEntry| {
            row.events.iter().any(|event| {
                event_kind(Kind::VirtualMachine, event) == Kind::VirtualMachineInstance
            })
        };
        let launched = rows
            .iter()
            .rposition(|row| row.events.iter().any(|e| e == "VmiLaunched"))
            .unwrap_or(0);
        Ok(rows.into_iter().skip(launched).filter(about_vmi).collect())
    }

    /// A unified diff of the spec (as YAML) of `kind` `namespace/name` between revisions
    /// `from` and `to` (`None`: the current revision). An object that did not live at a
    /// revision has an empty spec there.
    pub fn diff(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
        from: u64,
        to: Option<u64>,
    ) -> Result<SpecDiff> {
        self.check_cluster_config_name(kind, name)?;
        let stream = stream_of(kind, namespace, name);
        let current = self
            .log()
            .stream_revision(&stream)?
            .ok_or(Error::NotFound {
                what: object_name(kind, namespace, name),
            })?;
        let to = to.unwrap_or(current);
        let spec_yaml = |revision: u64| -> Result<String> {
            let view = self.get_at(kind, namespace, name, At::Revision(revision))?;
            Ok(match view {
                Some(v) => serde_yaml::to_string(v.spec()).map_err(|e| Error::Invalid {
                    reason: format!("rendering the spec as YAML: {e}"),
                })?,
                None => String::new(),
            })
        };
        let (a, b) = (spec_yaml(from)?, spec_yaml(to)?);
        let diff = if a == b {
            String::new()
        } else {
            TextDiff::from_lines(&a, &b)
                .unified_diff()
                .context_radius(3)
                .header(&format!("revision {from}"), &format!("revision {to}"))
                .to_string()
        };
        Ok(SpecDiff { from, to, diff })
    }

    /// Who did what, when: the newest events matching `query`, in log order. Two passes: the
    /// first keeps only the positions of the newest matches (at most `records_max` of them),
    /// the second decodes those alone, so an audit of a long log holds and decodes no more
    /// than it answers.
    pub fn audit(&self, query: &AuditQuery) -> Result<Audit> {
        let log = self.log();
        let start = match query.since {
            Some(t) => log.position_at(Timestamp(t.0.saturating_sub(1)))?,
            None => Position(0),
        };
        let records_max = if query.records_max == 0 {
            usize::MAX
        } else {
            query.records_max
        };
        let mut kept: std::collections::VecDeque<u64> = std::collections::VecDeque::new();
        let mut older = 0u64;
        let head = log.scan(start, &mut |event| {
            if query.until.is_some_and(|u| event.recorded_at > u) {
                return ControlFlow::Break(());
            }
            if audited(query, event).is_some() {
                if kept.len() == records_max {
                    kept.pop_front();
                    older += 1;
                }
                kept.push_back(event.position.0);
            }
            ControlFlow::Continue(())
        })?;
        let Some(&first) = kept.front() else {
            return Ok(Audit {
                records: Vec::new(),
                older,
            });
        };
        let mut out = Vec::with_capacity(kept.len());
        // The VM edits among them (record index, stream, revision, manifest), summarized
        // after the scan against the manifest before each.
        let mut edits: Vec<(usize, String, u64, String)> = Vec::new();
        let mut failure = None;
        log.scan(Position(first - 1), &mut |event| {
            if event.position > head || kept.front().is_none() {
                return ControlFlow::Break(());
            }
            if kept.front() != Some(&event.position.0) {
                return ControlFlow::Continue(());
            }
            kept.pop_front();
            let Some((namespace, kind, name)) = audited(query, event) else {
                return ControlFlow::Continue(());
            };
            match decode(event) {
                Ok(decoded) => {
                    if let Event::VmSpecEdited(e) = &decoded {
                        edits.push((
                            out.len(),
                            event.stream.to_owned(),
                            event.revision,
                            e.manifest_json.clone(),
                        ));
                    }
                    out.push(AuditRecord {
                        position: event.position.0,
                        time: rfc3339_nanos(event.recorded_at.0),
                        actor: event.actor.to_owned(),
                        namespace: namespace.to_owned(),
                        kind: kind.as_str().to_owned(),
                        name: name.to_owned(),
                        event: event.event_type.to_owned(),
                        summary: decoded.summary(),
                    });
                    ControlFlow::Continue(())
                }
                Err(e) => {
                    failure = Some(e);
                    ControlFlow::Break(())
                }
            }
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
        for (index, stream, revision, after) in edits {
            if let (Some(summary), Some(record)) = (
                self.edit_summary(&stream, revision, &after)?,
                out.get_mut(index),
            ) {
                record.summary = summary;
            }
        }
        Ok(Audit {
            records: out,
            older,
        })
    }

    /// What the VM edit at `revision` of `stream` (its new manifest `after`) changed, as
    /// history says it ([`lifecycle::edit_summary`]): compared with the manifest of the
    /// stream's last create or edit before it, looked for among at most
    /// [`EDIT_LOOKBACK_EVENTS`] earlier events. `None` if none is found there (the event's
    /// own summary stands).
    fn edit_summary(&self, stream: &str, revision: u64, after: &str) -> Result<Option<String>> {
        let Some(from) = revision.checked_sub(1).filter(|r| *r > 0) else {
            return Ok(None);
        };
        let earlier =
            self.log()
                .read_stream(stream, from, Direction::Backward, EDIT_LOOKBACK_EVENTS)?;
        for event in &earlier {
            let before = match decode(&event.as_ref())? {
                Event::VmCreated(e) => e.manifest_json,
                Event::VmSpecEdited(e) => e.manifest_json,
                _ => continue,
            };
            let parse = |json: &str| serde_json::from_str::<VirtualMachine>(json).ok();
            return Ok(parse(&before)
                .zip(parse(after))
                .map(|(b, a)| lifecycle::edit_summary(&b, &a)));
        }
        Ok(None)
    }
}

/// How far back [`Projections::audit`] looks in a VM's stream for the manifest an edit
/// changed (a running VM's stream holds its VMI's observations between edits).
const EDIT_LOOKBACK_EVENTS: usize = 1_000;

/// Whether `event` is one `query` selects (its time bounds aside for `until`, which ends the
/// scan): its namespace, kind and name if so.
fn audited<'e>(
    query: &AuditQuery,
    event: &'e vmplane_store::RecordedEventRef<'_>,
) -> Option<(&'e str, Kind, &'e str)> {
    if query.since.is_some_and(|s| event.recorded_at < s)
        || query.actor.as_deref().is_some_and(|a| a != event.actor)
    {
        return None;
    }
    let parsed = parse_stream(event.stream)?;
    let namespace = parsed.namespace.unwrap_or("");
    if query.namespace.as_deref().is_some_and(|n| n != namespace) {
        return None;
    }
    // Cluster-scoped objects (namespace "") are readable by every principal.
    if let Some(readable) = &query.readable
        && !namespace.is_empty()
        && !readable.iter().any(|n| n == namespace)
    {
        return None;
    }
    let kind = event_kind(parsed.kind, event.event_type);
    // The kind an entry is about, exactly: `--kind vm` leaves out the VMI lifecycle events of
    // the VM's stream (they are listed as VirtualMachineInstance).
    if query.kind.is_some_and(|k| k != kind) {
        return None;
    }
    Some((namespace, kind, parsed.name))
}

/// The kind an event is about: VMI lifecycle events in a VM's stream are about its VMI.
#[must_use]
pub fn event_kind(stream_kind: Kind, event_type: &str) -> Kind {
    if stream_kind == Kind::VirtualMachine && event_type.starts_with("Vmi") {
        Kind::VirtualMachineInstance
    } else {
        stream_kind
    }
}

/// `KIND namespace/name`, or `KIND name` for a kind decided for the whole cluster (whatever
/// namespace the request named).
fn object_name(kind: Kind, namespace: &str, name: &str) -> String {
    if kind.cluster_wide() {
        format!("{} {name}", kind.as_str())
    } else {
        format!("{} {namespace}/{name}", kind.as_str())
    }
}
