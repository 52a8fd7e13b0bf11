//! Checkpoints: a projection's state with the last position it applied, in one file written
//! atomically (write to a temporary file, fsync, rename, fsync the directory).
//!
//! A checkpoint is a cache. Its first line is a header naming the format, its version, the
//! code version that wrote it, the position, the hash of the event at that position and a
//! SHA-256 of the body; a checkpoint whose header does not match this code, whose body does
//! not hash to it, or whose position/hash the log does not have, is logged and ignored.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Bumped whenever the persisted form of any projection changes: older checkpoints are then
/// thrown away and the projection rebuilds.
pub const CHECKPOINT_FORMAT_VERSION: u32 = 3;

/// The directory under the data dir where projections keep their checkpoints.
pub const CHECKPOINT_DIR: &str = "projections";

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
struct Header {
    format: String,
    version: u32,
    code: String,
    position: u64,
    event_hash: String,
    body_sha256: String,
}

/// Where the checkpoint of projection `name` lives under `data_dir`.
#[must_use]
pub fn path(data_dir: &Path, name: &str) -> PathBuf {
    data_dir.join(CHECKPOINT_DIR).join(format!("{name}.ckpt"))
}

fn io(context: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::CheckpointIo { context, source }
}

/// Writes `body` as the checkpoint at `path` for `position` (whose event has `event_hash`).
pub fn write<T: Serialize>(
    path: &Path,
    name: &str,
    position: u64,
    event_hash: &[u8; 32],
    body: &T,
) -> Result<()> {
    let body = encode(name, body)?;
    write_encoded(path, name, position, event_hash, &body)
}

/// The body of a checkpoint of projection `name`, as [`write_encoded`] takes it (so a caller
/// can serialize under its lock and write after releasing it).
pub fn encode<T: Serialize>(name: &str, body: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(body).map_err(|e| Error::Invalid {
        reason: format!("serializing checkpoint {name}: {e}"),
    })
}

/// [`write`] of a body already [`encode`]d.
pub fn write_encoded(
    path: &Path,
    name: &str,
    position: u64,
    event_hash: &[u8; 32],
    body: &[u8],
) -> Result<()> {
    let dir = path.parent().ok_or_else(|| Error::Invalid {
        reason: format!("checkpoint path {} has no directory", path.display()),
    })?;
    fs::create_dir_all(dir).map_err(io("creating the checkpoint directory"))?;
    let header = Header {
        format: format!("vmplane-projections/{name}"),
        version: CHECKPOINT_FORMAT_VERSION,
        code: env!("CARGO_PKG_VERSION").to_owned(),
        position,
        event_hash: hex::encode(event_hash),
        body_sha256: hex::encode(Sha256::digest(body)),
    };
    let mut header = serde_json::to_vec(&header).map_err(|e| Error::Invalid {
        reason: format!("serializing checkpoint header: {e}"),
    })?;
    header.push(b'\n');
    let tmp = path.with_extension("ckpt.tmp");
    {
        let mut file = File::create(&tmp).map_err(io("creating the checkpoint file"))?;
        // A torn write: the header and half the body reach the temporary file, then it fails.
        fail::fail_point!("projections::checkpoint::torn_write", |_| {
            file.write_all(&header)
                .and_then(|()| file.write_all(&body[..body.len() / 2]))
                .map_err(io("writing the checkpoint"))?;
            Err(injected("projections::checkpoint::torn_write"))
        });
        file.write_all(&header)
            .and_then(|()| file.write_all(body))
            .map_err(io("writing the checkpoint"))?;
        file.sync_all().map_err(io("syncing the checkpoint"))?;
    }
    fail::fail_point!("projections::checkpoint::before_rename", |_| Err(injected(
        "projections::checkpoint::before_rename"
    )));
    fs::rename(&tmp, path).map_err(io("renaming the checkpoint into place"))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("syncing the checkpoint directory"))?;
    Ok(())
}

/// The error a `return` fail point injects (see `projections/tests/failpoints.rs`).
// Used only where `fail/failpoints` is on (this crate's `failpoints`, or another crate's, since
// cargo unifies `fail`'s features).
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
fn injected(point: &'static str) -> Error {
    Error::CheckpointIo {
        context: point,
        source: std::io::Error::other("injected by a fail point"),
    }
}

/// A checkpoint as read back: its position, event hash and body.
#[derive(Debug)]
pub struct Loaded<T> {
    /// The last position the projection had applied.
    pub position: u64,
    /// The hash of the event at that position.
    pub event_hash: [u8; 32],
    /// The projection's state.
    pub body: T,
}

/// Reads the checkpoint at `path`. `Ok(None)` when there is none; `Err(reason)` when there is
/// one that this code cannot use (the caller logs it and rebuilds).
pub fn read<T: for<'de> Deserialize<'de>>(
    path: &Path,
    name: &str,
) -> std::result::Result<Option<Loaded<T>>, String> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let split = bytes
        .iter()
        .position(|b| *b == b'\n')
        .ok_or("no header line")?;
    let header: Header =
        serde_json::from_slice(&bytes[..split]).map_err(|e| format!("header: {e}"))?;
    let body = &bytes[split + 1..];
    if header.format != format!("vmplane-projections/{name}") {
        return Err(format!("format {:?} is not {name}", header.format));
    }
    if header.version != CHECKPOINT_FORMAT_VERSION || header.code != env!("CARGO_PKG_VERSION") {
        return Err(format!(
            "written by format {} / code {}, this is format {} / code {}",
            header.version,
            header.code,
            CHECKPOINT_FORMAT_VERSION,
            env!("CARGO_PKG_VERSION")
        ));
    }
    if hex::encode(Sha256::digest(body)) != header.body_sha256 {
        return Err("body does not match its checksum".into());
    }
    let mut event_hash = [0u8; 32];
    hex::decode_to_slice(&header.event_hash, &mut event_hash)
        .map_err(|e| format!("event hash: {e}"))?;
    let body = serde_json::from_slice(body).map_err(|e| format!("body: {e}"))?;
    Ok(Some(Loaded {
        position: header.position,
        event_hash,
        body,
    }))
}
