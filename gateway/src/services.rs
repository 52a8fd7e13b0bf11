//! The gRPC services. Each converts between protobuf and `core`/`store` types here, at the
//! edge, and runs storage calls on blocking threads.

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};
use vmplane_store::{EventLog, Position};

use crate::auth::{Authenticator, Principal};
use crate::dr::{self, RestoreMarker};
use crate::pb;

/// Events per `Backup` chunk.
const BACKUP_CHUNK_EVENTS: usize = 1_000;

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
        tokio::task::spawn_blocking(move || {
            let mut after = Position(0);
            while after < head {
                let want = usize::try_from(head.0 - after.0)
                    .unwrap_or(usize::MAX)
                    .min(BACKUP_CHUNK_EVENTS);
                let chunk = match log.read_all(after, want) {
                    Ok(events) => events,
                    Err(err) => {
                        let _ = tx.blocking_send(Err(Status::internal(format!(
                            "reading the log after position {after}: {err}"
                        ))));
                        return;
                    }
                };
                let Some(last) = chunk.last() else {
                    let _ = tx.blocking_send(Err(Status::internal(format!(
                        "the log ends at position {after}, before its head {head}"
                    ))));
                    return;
                };
                after = last.position;
                let events = chunk
                    .iter()
                    .filter(|e| e.position <= head)
                    .map(dr::to_pb)
                    .collect();
                let message = pb::BackupChunk {
                    head_position: head.0,
                    events,
                };
                if tx.blocking_send(Ok(message)).is_err() {
                    return; // the client went away
                }
            }
            if head == Position(0) {
                let _ = tx.blocking_send(Ok(pb::BackupChunk {
                    head_position: 0,
                    events: Vec::new(),
                }));
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}
