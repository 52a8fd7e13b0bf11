//! The gRPC services. Each converts between protobuf and `core`/`store` types here, at the
//! edge, and runs storage calls on blocking threads.

use std::sync::Arc;

use tonic::{Request, Response, Status};
use vmplane_store::EventLog;

use crate::pb;

/// `vmplane.v1.Admin`: facts about the log itself.
pub struct AdminService {
    log: Arc<dyn EventLog>,
    backend: &'static str,
}

impl AdminService {
    /// `backend` names the storage backend serving `log` (`sled`).
    pub fn new(log: Arc<dyn EventLog>, backend: &'static str) -> Self {
        AdminService { log, backend }
    }
}

#[tonic::async_trait]
impl pb::admin_server::Admin for AdminService {
    async fn log_info(
        &self,
        _request: Request<pb::LogInfoRequest>,
    ) -> Result<Response<pb::LogInfoResponse>, Status> {
        // The head is kept in memory by every backend: no blocking call.
        let head = self.log.head();
        Ok(Response::new(pb::LogInfoResponse {
            head_position: head.0,
            backend: self.backend.into(),
            server_version: env!("CARGO_PKG_VERSION").into(),
        }))
    }
}
