//! # vmplane-gateway
//!
//! **Owns** the edge of vmplane: the protobuf API (`proto/vmplane/v1`), the tonic services, the
//! server wiring (`vmplane serve`), and the `vmplane` command-line client. It is the only crate
//! that knows the wire format: it converts between protobuf messages and `core`/`store` types in
//! one place, and maps domain rejections and store errors to gRPC status codes.
//!
//! Main pieces, in reading order:
//! - [`cli`]: the `vmplane` command line (clap), shared by the binary and tests;
//! - [`server`]: opens the log, builds the services, serves until SIGTERM/SIGINT;
//! - [`services`]: the gRPC service implementations;
//! - [`tls`]: the server's certificate and key, the client's CA, handshake failures in one line;
//! - [`pb`]: the generated protobuf types.
//!
//! **Must never** hold a domain rule (they live in `core`), or block a tokio worker on storage
//! or libvirt calls (they go through `spawn_blocking`, or [`loads`]' reader threads).

pub mod api;
pub mod auth;
pub mod cli;
pub mod client;
pub mod connections;
pub mod control;
pub mod dr;
pub mod input;
pub mod leader;
pub mod loads;
pub mod metrics;
pub mod print;
pub mod report;
pub mod sagas;
pub mod server;
pub mod services;
pub mod status;
pub mod tls;

/// Generated protobuf types and the encoded descriptor set (for server reflection).
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("vmplane.v1");

    /// Encoded `FileDescriptorSet` of vmplane's protos, served by reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("vmplane_descriptor");
}
