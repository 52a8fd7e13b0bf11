//! Watch: the changes to a kind (and namespace) from a position on, with no gap and no repeat
//! — the Kubernetes list-and-watch contract with the global position as resourceVersion.
//!
//! # Across a point-in-time restore's cut
//!
//! A point-in-time restore fills the positions it cut with `LogPositionVoided` events on a
//! system stream ([`crate::projections::VoidedRange`]). They belong to no object, so no watch
//! delivers them: a watch from before the cut delivers the events up to the cut, then the
//! restored server's own from the first position after the voided ones (position numbers jump;
//! no change of any object lies in between, since the restored history has none there). That
//! jump is no loss: the client never saw the voided events if it started before the cut, and
//! the restored history holds nothing there to see. It is not silent either: the gateway tells a
//! watch that will cross a cut so when it opens (its response's `vmplane-voided-positions`
//! metadata), and `audit` shows each cut as one entry. A watch *from* a voided position is
//! refused by the gateway (the client saw an event the restored history does not have: it must
//! re-list), and the positions the server hands out to continue from (a list's resourceVersion,
//! the place a watch reached) are never voided ones ([`crate::Projections::live_position`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use vmplane_core::types::Kind;
use vmplane_store::{EventLog, Position, Subscription};

use crate::history::event_kind;
use crate::model::{parse_stream, rfc3339_nanos};

/// What a watch delivers: `{position, time, actor, namespace, kind, name, event}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WatchEvent {
    /// The event's position.
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
}

/// Which changes a watch delivers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchFilter {
    /// Only this kind. VMI events in a VM's stream count for VirtualMachineInstance, and for
    /// VirtualMachine too since they change its status (and its resourceVersion): a watch of
    /// VMs delivers them as changes of the VM, kind VirtualMachine.
    pub kind: Option<Kind>,
    /// Only this namespace.
    pub namespace: Option<String>,
}

impl WatchFilter {
    /// The kind an admitted event is delivered as: what it is about, except that a watch of
    /// VMs sees the VMI events of a VM's stream as changes of the VM.
    fn reported_kind(&self, stream_kind: Kind, event_type: &str) -> Kind {
        match self.kind {
            Some(k) if k == stream_kind => k,
            _ => event_kind(stream_kind, event_type),
        }
    }

    fn admits(&self, stream_kind: Kind, event_type: &str, namespace: &str) -> bool {
        if self.namespace.as_deref().is_some_and(|n| n != namespace) {
            return false;
        }
        match self.kind {
            None => true,
            Some(k) => k == stream_kind || k == event_kind(stream_kind, event_type),
        }
    }
}

/// A subscription to changes, from a position.
pub struct Watch {
    subscription: Subscription,
    filter: WatchFilter,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("position", &self.subscription.position())
            .field("filter", &self.filter)
            .finish()
    }
}

/// Events read from the log per step.
const WATCH_READ_EVENTS_MAX: usize = 1_000;

impl Watch {
    /// Changes after `after` (a list's position, or 0 to replay everything).
    #[must_use]
    pub fn new(log: Arc<dyn EventLog>, after: Position, filter: WatchFilter) -> Watch {
        Watch {
            subscription: Subscription::new(log, after),
            filter,
        }
    }

    /// The last position looked at: resuming a new watch from it neither skips nor repeats.
    /// It may be a position a point-in-time restore voided (the watch read the void events
    /// there): told to a client, it goes through [`crate::Projections::live_position`] first,
    /// which reads the same and which a watch from accepts.
    #[must_use]
    pub fn position(&self) -> Position {
        self.subscription.position()
    }

    /// The next matching changes, at most `max_count` (some may be left for the next call);
    /// an empty list if none came within `timeout`.
    pub fn next_batch(
        &mut self,
        max_count: usize,
        timeout: Duration,
    ) -> vmplane_store::Result<Vec<WatchEvent>> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let want = max_count.clamp(1, WATCH_READ_EVENTS_MAX);
            let events = self.subscription.next_batch(want, left)?;
            if events.is_empty() {
                return Ok(Vec::new());
            }
            let out: Vec<WatchEvent> = events
                .iter()
                .filter_map(|e| {
                    let parsed = parse_stream(&e.stream)?;
                    let namespace = parsed.namespace.unwrap_or("");
                    if !self.filter.admits(parsed.kind, &e.event_type, namespace) {
                        return None;
                    }
                    Some(WatchEvent {
                        position: e.position.0,
                        time: rfc3339_nanos(e.recorded_at.0),
                        actor: e.actor.clone(),
                        namespace: namespace.to_owned(),
                        kind: self
                            .filter
                            .reported_kind(parsed.kind, &e.event_type)
                            .as_str()
                            .to_owned(),
                        name: parsed.name.to_owned(),
                        event: e.event_type.clone(),
                    })
                })
                .collect();
            if !out.is_empty() || Instant::now() >= deadline {
                return Ok(out);
            }
        }
    }
}

impl crate::Projections {
    /// A watch of changes after `after` matching `filter`.
    #[must_use]
    pub fn watch(&self, after: Position, filter: WatchFilter) -> Watch {
        Watch::new(Arc::clone(self.log()), after, filter)
    }
}
