//! The gRPC services. Each converts between protobuf and `core`/`store` types here, at the
//! edge, and runs storage calls on blocking threads.

use std::ops::ControlFlow;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use prost::Message;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};
use vmplane_store::{EventLog, Position};

use crate::api::RESPONSE_BYTES_MAX;
use crate::auth::{Authenticator, Principal};
use crate::client::CLIENT_MESSAGE_BYTES_MAX;
use crate::dr::{self, RestoreMarker};
use crate::pb;

/// Events per `Backup` chunk at most.
const BACKUP_CHUNK_EVENTS: usize = 1_000;
/// The largest `Backup` message either end takes: what the server may send in one message
/// (`RESPONSE_BYTES_MAX`) and the CLI may receive (`CLIENT_MESSAGE_BYTES_MAX`).
const BACKUP_MESSAGE_BYTES_MAX: usize = if RESPONSE_BYTES_MAX < CLIENT_MESSAGE_BYTES_MAX {
    RESPONSE_BYTES_MAX
} else {
    CLIENT_MESSAGE_BYTES_MAX
};
/// Encoded bytes per `Backup` chunk at most, unless its one event alone is more (an event is
/// never split): well under `BACKUP_MESSAGE_BYTES_MAX`, so that a chunk stays far from it
/// however large its events are within the log's limits (a payload of 1 MiB at most; the
/// tests below hold a chunk of one largest event under it too).
const BACKUP_CHUNK_BYTES: usize = 8 << 20;
const _: () = assert!(BACKUP_CHUNK_BYTES <= BACKUP_MESSAGE_BYTES_MAX / 4);

/// How many events, and how many encoded bytes, a `Backup` chunk may hold.
#[derive(Clone, Copy, Debug)]
struct ChunkBudget {
    events: usize,
    bytes: usize,
}

impl ChunkBudget {
    const BACKUP: ChunkBudget = ChunkBudget {
        events: BACKUP_CHUNK_EVENTS,
        bytes: BACKUP_CHUNK_BYTES,
    };
}

/// What `event` adds to the encoded size of the `BackupChunk` holding it: the field's key
/// (`events` is field 2: one byte), the length prefix and the message.
fn chunk_entry_len(event: &pb::LogEvent) -> usize {
    let len = event.encoded_len();
    1 + prost::length_delimiter_len(len) + len
}

/// The events `1..=head` of `log` cut into `BackupChunk`s, each handed to `send` as soon as it
/// is complete, in position order. A chunk holds at most `budget.events` events and at most
/// `budget.bytes` encoded bytes, except that it always holds at least one event: the events
/// are read in place (`EventLog::scan`), one chunk's worth per scan, and an event that does not
/// fit starts the next chunk. Nothing is read from the log while `send` runs. An event too large
/// for a message even alone (`BACKUP_MESSAGE_BYTES_MAX`; no backend's limits allow one) is an
/// error naming its position, not a message the transport would refuse. `send` returns false
/// when no one takes chunks any more (the client went away): then this stops, with `Ok`. An
/// empty log is one chunk without events.
fn backup_chunks(
    log: &dyn EventLog,
    head: Position,
    budget: ChunkBudget,
    send: &mut dyn FnMut(pb::BackupChunk) -> bool,
) -> Result<(), Status> {
    let empty = pb::BackupChunk {
        head_position: head.0,
        events: Vec::new(),
    };
    if head == Position(0) {
        send(empty);
        return Ok(());
    }
    let base = empty.encoded_len();
    // The last position read, and the event read that the last chunk had no room for.
    let mut after = Position(0);
    let mut carried: Option<(pb::LogEvent, usize)> = None;
    loop {
        let mut events = Vec::new();
        let mut bytes = base;
        if let Some((event, len)) = carried.take() {
            events.push(event);
            bytes += len;
        }
        let mut too_large = None;
        if after < head && events.len() < budget.events {
            let scanned_from = after;
            log.scan(after, &mut |e| {
                after = e.position;
                let event = dr::ref_to_pb(e);
                let len = chunk_entry_len(&event);
                if base + len > BACKUP_MESSAGE_BYTES_MAX {
                    too_large = Some((e.position, base + len));
                    return ControlFlow::Break(());
                }
                if !events.is_empty() && bytes + len > budget.bytes {
                    carried = Some((event, len));
                    return ControlFlow::Break(());
                }
                events.push(event);
                bytes += len;
                if e.position >= head || events.len() >= budget.events {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .map_err(|err| {
                Status::internal(format!(
                    "reading the log after position {scanned_from}: {err}"
                ))
            })?;
            if let Some((position, len)) = too_large {
                return Err(Status::internal(format!(
                    "the event at position {position} is {len} bytes as a backup message, over \
                     the {BACKUP_MESSAGE_BYTES_MAX} a message may hold"
                )));
            }
            if after == scanned_from {
                return Err(Status::internal(format!(
                    "the log ends at position {after}, before its head {head}"
                )));
            }
        }
        let last = events.last().map(|e| e.position);
        let chunk = pb::BackupChunk {
            head_position: head.0,
            events,
        };
        debug_assert_eq!(chunk.encoded_len(), bytes);
        if !send(chunk) {
            return Ok(()); // the client went away
        }
        if last.is_some_and(|p| p >= head.0) {
            return Ok(());
        }
    }
}

/// `vmplane.v1.Admin`: facts about the log itself, and its export (`Backup`, admin only).
pub struct AdminService {
    log: Arc<dyn EventLog>,
    backend: &'static str,
    auth: Option<Arc<Authenticator>>,
    restore: Option<RestoreMarker>,
}

impl AdminService {
    /// `backend` names the storage backend serving `log` (`sled`).
    pub fn new(log: Arc<dyn EventLog>, backend: &'static str) -> Self {
        AdminService {
            log,
            backend,
            auth: None,
            restore: None,
        }
    }

    /// Checks callers against `auth` (`None`: everyone is the local admin) and reports the
    /// restore marker of `data` (see [`crate::dr`]) in `LogInfo`.
    #[must_use]
    pub fn with_auth_and_data(mut self, auth: Option<Arc<Authenticator>>, data: &Path) -> Self {
        self.auth = auth;
        self.restore = RestoreMarker::read(data).ok().flatten();
        self
    }

    fn principal(&self, metadata: &MetadataMap) -> Result<Principal, Status> {
        crate::auth::principal_of(self.auth.as_deref(), metadata)
    }
}

type BackupStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::BackupChunk, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl pb::admin_server::Admin for AdminService {
    async fn log_info(
        &self,
        request: Request<pb::LogInfoRequest>,
    ) -> Result<Response<pb::LogInfoResponse>, Status> {
        // Facts about the whole log are the admin's, like every admin command.
        let p = self.principal(request.metadata())?;
        if !p.is_admin() {
            return Err(Status::permission_denied(format!(
                "principal {} may not read the log's facts: the admin role is needed; use a \
                 token with the admin role",
                p.name
            )));
        }
        // The head is kept in memory by every backend: no blocking call.
        let head = self.log.head();
        let (restore_epoch, restore_cut_position) = match &self.restore {
            Some(m) => (m.epoch.clone(), m.cut_position.unwrap_or(0)),
            None => (String::new(), 0),
        };
        Ok(Response::new(pb::LogInfoResponse {
            head_position: head.0,
            backend: self.backend.into(),
            server_version: env!("CARGO_PKG_VERSION").into(),
            restore_epoch,
            restore_cut_position,
        }))
    }

    type BackupStream = BackupStream;

    async fn backup(
        &self,
        request: Request<pb::BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        let principal = self.principal(request.metadata())?;
        if !principal.is_admin() {
            return Err(Status::permission_denied(format!(
                "principal {} may not back up the log: admin backup needs the admin role; use \
                 a token with the admin role",
                principal.name
            )));
        }
        let log = Arc::clone(&self.log);
        let head = log.head();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        // A blocking thread for the whole backup, which waits in `blocking_send` while the
        // client is slower than the log (admin only: one such thread per backup running). At
        // most the 4 chunks in the channel and the one being sent are held, each bounded by
        // `BACKUP_CHUNK_BYTES` (see `backup_chunks`).
        tokio::task::spawn_blocking(move || {
            let sent = backup_chunks(log.as_ref(), head, ChunkBudget::BACKUP, &mut |chunk| {
                tx.blocking_send(Ok(chunk)).is_ok()
            });
            if let Err(status) = sent {
                let _ = tx.blocking_send(Err(status));
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmplane_store::{AppendRequest, ExpectedRevision, Limits, ProposedEvent, SledLog};

    /// The largest event `limits` let a log hold, as a backup sends it: every length at its
    /// limit and every number at its longest encoding.
    fn largest_event(limits: &Limits) -> pb::LogEvent {
        pb::LogEvent {
            position: u64::MAX,
            stream: "s".repeat(limits.stream_name_bytes_max),
            revision: u64::MAX,
            id: vec![0xff; 16],
            recorded_at_unix_nanos: i64::MIN,
            actor: "a".repeat(limits.actor_bytes_max),
            correlation_id: vec![0xff; 16],
            causation_id: vec![0xff; 16],
            event_type: "t".repeat(limits.event_type_bytes_max),
            schema_version: u32::from(u16::MAX),
            payload: vec![0xff; limits.event_payload_bytes_max],
            prev_hash: vec![0xff; 32],
            hash: vec![0xff; 32],
        }
    }

    #[test]
    fn a_chunk_never_passes_what_a_message_may_hold_whatever_the_backend() {
        for (backend, limits) in [
            ("sled and file", Limits::DEFAULT),
            ("etcd", vmplane_store_etcd::EtcdLog::LIMITS),
        ] {
            let event = largest_event(&limits);
            let alone = pb::BackupChunk {
                head_position: u64::MAX,
                events: vec![event.clone()],
            };
            assert_eq!(
                alone.encoded_len(),
                pb::BackupChunk {
                    head_position: u64::MAX,
                    events: Vec::new(),
                }
                .encoded_len()
                    + chunk_entry_len(&event),
                "chunk_entry_len measures what an event adds"
            );
            // The largest chunk: the budget, less a byte, then one largest event that no
            // longer fits — it starts the next chunk, but even if it were added, the chunk
            // would fit.
            let worst = BACKUP_CHUNK_BYTES - 1 + chunk_entry_len(&event);
            assert!(
                worst <= BACKUP_MESSAGE_BYTES_MAX / 2,
                "{backend}: {worst} bytes"
            );
            assert!(alone.encoded_len() <= BACKUP_CHUNK_BYTES / 4, "{backend}");
        }
    }

    /// A sled log in `dir` holding events with the payload sizes `sizes`, one per append.
    fn log_of(dir: &Path, sizes: &[usize]) -> SledLog {
        let log = SledLog::open(dir).expect("open");
        for (i, &size) in sizes.iter().enumerate() {
            let event = ProposedEvent {
                id: uuid::Uuid::now_v7(),
                event_type: "Test".into(),
                schema_version: 1,
                payload: vec![u8::try_from(i % 251).expect("small"); size],
                actor: "test".into(),
                correlation_id: uuid::Uuid::now_v7(),
                causation_id: None,
            };
            log.append(AppendRequest::new(
                format!("test/{}", i % 3),
                ExpectedRevision::Any,
                vec![event],
            ))
            .expect("append");
        }
        log
    }

    fn chunks_of(log: &dyn EventLog, head: Position, budget: ChunkBudget) -> Vec<pb::BackupChunk> {
        let mut chunks = Vec::new();
        backup_chunks(log, head, budget, &mut |chunk| {
            chunks.push(chunk);
            true
        })
        .expect("backup");
        chunks
    }

    #[test]
    fn backup_chunks_are_bounded_in_events_and_bytes_and_hold_the_log_up_to_the_head_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Small, middling and larger-than-a-chunk events, in runs and alone.
        let sizes: Vec<usize> = (0..60)
            .map(|i| match i % 7 {
                0 | 1 => 10,
                2 => 3_000,
                3 => 9_000,
                4 => 20_000,
                _ => 200,
            })
            .collect();
        let log = log_of(dir.path(), &sizes);
        let budget = ChunkBudget {
            events: 5,
            bytes: 16 * 1024,
        };
        // The whole log, and a head before its end (appends after the backup began).
        for head in [Position(60), Position(57), Position(1)] {
            let chunks = chunks_of(&log, head, budget);
            let mut positions = Vec::new();
            for (i, chunk) in chunks.iter().enumerate() {
                assert_eq!(chunk.head_position, head.0);
                assert!(!chunk.events.is_empty(), "chunk {i} is empty");
                assert!(chunk.events.len() <= budget.events, "chunk {i}");
                assert!(
                    chunk.encoded_len() <= budget.bytes || chunk.events.len() == 1,
                    "chunk {i}: {} bytes, {} events",
                    chunk.encoded_len(),
                    chunk.events.len()
                );
                // Full: only the last chunk has room for the event after it.
                if let Some(next) = chunks.get(i + 1) {
                    assert!(
                        chunk.events.len() == budget.events
                            || chunk.encoded_len() + chunk_entry_len(&next.events[0])
                                > budget.bytes,
                        "chunk {i} was cut early"
                    );
                }
                for event in &chunk.events {
                    let stored = log
                        .read_event(Position(event.position))
                        .expect("read")
                        .expect("an event");
                    assert_eq!(event, &dr::to_pb(&stored));
                    positions.push(event.position);
                }
            }
            assert_eq!(positions, (1..=head.0).collect::<Vec<_>>(), "head {head}");
            assert!(chunks.len() > 1 || head.0 == 1);
        }
        // The server's budget takes this whole log in one chunk.
        assert_eq!(chunks_of(&log, Position(60), ChunkBudget::BACKUP).len(), 1);
    }

    #[test]
    fn a_backup_stops_when_its_client_goes_away_and_an_empty_log_is_one_empty_chunk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = log_of(&dir.path().join("a"), &[100; 10]);
        let budget = ChunkBudget {
            events: 2,
            bytes: 1 << 20,
        };
        let mut sent = 0;
        backup_chunks(&log, Position(10), budget, &mut |_| {
            sent += 1;
            sent < 2
        })
        .expect("a client that leaves is no error");
        assert_eq!(sent, 2);

        let empty = log_of(&dir.path().join("b"), &[]);
        let chunks = chunks_of(&empty, Position(0), ChunkBudget::BACKUP);
        assert_eq!(
            chunks,
            vec![pb::BackupChunk {
                head_position: 0,
                events: Vec::new(),
            }]
        );
    }

    #[test]
    fn a_log_that_ends_before_the_head_is_an_error_naming_where() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = log_of(dir.path(), &[100; 3]);
        let err = backup_chunks(&log, Position(5), ChunkBudget::BACKUP, &mut |_| true)
            .expect_err("the log ends at 3");
        assert_eq!(err.code(), tonic::Code::Internal);
        assert!(err.message().contains("ends at position 3"), "{err:?}");
    }
}
