//! End-to-end tests of the real `vmplane` binary. One module per area.

mod apply_order;
mod cli_audit;
mod cold_updates;
mod connections;
mod crash_restart;
mod deletion;
mod dr;
mod dr_offline;
mod errors;
mod etcd;
mod failure_reasons;
mod features;
mod files;
mod fixtures;
mod hypervisor_faults;
mod kubevirt_admission;
mod linearizability;
mod manifests;
mod metrics;
mod output;
mod patch;
mod permissions;
mod qemu;
mod serve;
mod snapshots;
mod tls;
mod unknown_fields;
mod views;
mod voided;
mod wait;
mod walkthrough;
mod watch;

use std::sync::OnceLock;

use vmplane_tests::Server;

/// A server without `--auth` shared by the tests of several modules, each in its own
/// namespaces (prefixed with its module's name).
pub fn shared_server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| Server::start_shared(&[]))
}

/// A current-thread runtime for a test's gRPC calls.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A connected channel to `server`.
pub async fn channel(server: &Server) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(server.url.clone())
        .expect("url")
        .connect()
        .await
        .expect("connect to vmplane")
}

/// A watch of every namespace after `from` (`None`: from the head), as `token`'s principal when
/// given, with its response's metadata.
pub async fn watch_all(
    server: &Server,
    token: Option<&str>,
    from: Option<u64>,
) -> Result<tonic::Response<tonic::Streaming<vmplane_gateway::pb::WatchEvent>>, tonic::Status> {
    let mut request = tonic::Request::new(vmplane_gateway::pb::WatchRequest {
        kind: String::new(),
        namespace: String::new(),
        all_namespaces: true,
        from_position: from,
    });
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("header"),
        );
    }
    vmplane_gateway::pb::watch_client::WatchClient::new(channel(server).await)
        .watch(request)
        .await
}

/// The next event of `stream`, within 30 s.
pub async fn next_event(
    stream: &mut tonic::Streaming<vmplane_gateway::pb::WatchEvent>,
) -> vmplane_gateway::pb::WatchEvent {
    tokio::time::timeout(std::time::Duration::from_secs(30), stream.message())
        .await
        .expect("the watch delivered nothing within 30 s")
        .expect("watch stream")
        .expect("the watch ended")
}
