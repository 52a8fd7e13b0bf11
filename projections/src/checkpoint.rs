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
/// thrown away and the projection rebuilds. 4: the read model keeps the positions
/// point-in-time restores voided (a checkpoint of 3 lacks them, and would serve a restored log
/// as if nothing had been voided).
pub const CHECKPOINT_FORMAT_VERSION: u32 = 4;

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

/// How [`write`] spreads a checkpoint's writing out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacing {
    /// Bytes written back (to the disk, not through its cache) at a time.
    pub piece_bytes: usize,
    /// Pause after each piece.
    pub pause: std::time::Duration,
}

impl Pacing {
    /// What the periodic checkpoint uses: 256 KiB at a time, 1 ms apart. Written in one go,
    /// the ~30 MB of 100,000 streams queued at the disk for ~18 ms, and every log commit's
    /// `fdatasync` in that time waited behind them (up to 15 ms; a stall of every request
    /// in flight). In pieces, a commit waits for one piece at most (~0.2 ms here).
    pub const BACKGROUND: Pacing = Pacing {
        piece_bytes: 256 * 1024,
        pause: std::time::Duration::from_millis(1),
    };
}

/// Bytes serialized at a time between the serializer and the file when not paced.
const UNPACED_PIECE_BYTES: usize = 256 * 1024;

/// Writes `body` as the checkpoint at `path` for `position` (whose event has `event_hash`),
/// written back in pieces when `pacing` is given (Linux's `sync_file_range` after each piece,
/// then the usual sync), so that it never keeps the disk busy for long at a time.
///
/// The body is serialized straight into the file, a piece at a time, and hashed on the way:
/// no buffer of the whole body (~30 MB for 100,000 streams, faulted in and unmapped again at
/// every checkpoint while requests are answered). The header, whose length does not
/// depend on the hash, is written first with a placeholder hash and overwritten in place
/// once the body is written.
pub fn write<T: Serialize>(
    path: &Path,
    name: &str,
    position: u64,
    event_hash: &[u8; 32],
    body: &T,
    pacing: Option<Pacing>,
) -> Result<()> {
    let dir = path.parent().ok_or_else(|| Error::Invalid {
        reason: format!("checkpoint path {} has no directory", path.display()),
    })?;
    fs::create_dir_all(dir).map_err(io("creating the checkpoint directory"))?;
    let header = |body_sha256: [u8; 32]| -> Result<Vec<u8>> {
        let header = Header {
            format: format!("vmplane-projections/{name}"),
            version: CHECKPOINT_FORMAT_VERSION,
            code: env!("CARGO_PKG_VERSION").to_owned(),
            position,
            event_hash: hex::encode(event_hash),
            body_sha256: hex::encode(body_sha256),
        };
        let mut header = serde_json::to_vec(&header).map_err(|e| Error::Invalid {
            reason: format!("serializing checkpoint header: {e}"),
        })?;
        header.push(b'\n');
        Ok(header)
    };
    let placeholder = header([0; 32])?;
    let tmp = path.with_extension("ckpt.tmp");
    {
        let mut file = File::create(&tmp).map_err(io("creating the checkpoint file"))?;
        // A torn write: the header and half the body reach the temporary file, then it fails.
        fail::fail_point!("projections::checkpoint::torn_write", |_| {
            let body = serde_json::to_vec(body).unwrap_or_default();
            file.write_all(&placeholder)
                .and_then(|()| file.write_all(&body[..body.len() / 2]))
                .map_err(io("writing the checkpoint"))?;
            Err(injected("projections::checkpoint::torn_write"))
        });
        let written = write_temporary(&mut file, name, &placeholder, &header, body, pacing);
        if let Err(e) = written {
            // Nothing half-written left behind (the next checkpoint would replace it anyway).
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
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

/// Writes the checkpoint into its temporary `file`: `placeholder` (the header with a placeholder
/// hash), the body streamed after it, then the real header over the placeholder; then syncs.
fn write_temporary<T: Serialize>(
    file: &mut File,
    name: &str,
    placeholder: &[u8],
    header: &dyn Fn([u8; 32]) -> Result<Vec<u8>>,
    body: &T,
    pacing: Option<Pacing>,
) -> Result<()> {
    file.write_all(placeholder)
        .map_err(io("writing the checkpoint"))?;
    let piece_bytes = pacing.map_or(UNPACED_PIECE_BYTES, |p| p.piece_bytes.max(1));
    let mut sink = std::io::BufWriter::with_capacity(
        piece_bytes,
        BodySink {
            file,
            hasher: Sha256::new(),
            at: placeholder.len(),
            pacing,
        },
    );
    serde_json::to_writer(&mut sink, body).map_err(|e| match e.io_error_kind() {
        Some(_) => Error::CheckpointIo {
            context: "writing the checkpoint",
            source: e.into(),
        },
        None => Error::Invalid {
            reason: format!("serializing checkpoint {name}: {e}"),
        },
    })?;
    let sink = sink
        .into_inner()
        .map_err(|e| io("writing the checkpoint")(e.into_error()))?;
    let header = header(sink.hasher.finalize().into())?;
    if header.len() != placeholder.len() {
        return Err(Error::Invalid {
            reason: "the checkpoint header changed length once hashed".into(),
        });
    }
    std::os::unix::fs::FileExt::write_all_at(file, &header, 0)
        .map_err(io("writing the checkpoint header"))?;
    file.sync_all().map_err(io("syncing the checkpoint"))
}

/// Where the serialized body goes, a piece at a time (the `BufWriter` around it hands it
/// whole pieces): into the file at its end, into the hash, and, paced, written back to the
/// disk before the pause that follows each piece. Durability still comes from the caller's
/// sync.
struct BodySink<'a> {
    file: &'a mut File,
    hasher: Sha256,
    /// Where the file ends.
    at: usize,
    pacing: Option<Pacing>,
}

impl Write for BodySink<'_> {
    fn write(&mut self, piece: &[u8]) -> std::io::Result<usize> {
        self.file.write_all(piece)?;
        self.hasher.update(piece);
        if let Some(pacing) = self.pacing {
            write_back(self.file, self.at, piece.len())?;
            std::thread::sleep(pacing.pause);
        }
        self.at += piece.len();
        Ok(piece.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Starts writeback of `len` bytes at `offset` and waits for it (not a sync: the disk's cache
/// is not flushed, and file metadata is not written).
#[cfg(target_os = "linux")]
fn write_back(file: &File, offset: usize, len: usize) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (
        libc::off64_t::try_from(offset),
        libc::off64_t::try_from(len),
    ) else {
        return Ok(());
    };
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: the descriptor is `file`'s, open for the duration of the call; no memory of ours
    // is passed.
    if unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, flags) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn write_back(_file: &File, _offset: usize, _len: usize) -> std::io::Result<()> {
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

impl<T> Loaded<T> {
    /// Whether this checkpoint fits `log`: its body applied `applied` (what the header says,
    /// else the file is inconsistent) and the log holds, at its position, the event it applied
    /// (same hash). `Err(reason)`: why it is discarded (`serve` rebuilds, `verify` fails).
    pub fn check_against(
        &self,
        log: &dyn vmplane_store::EventLog,
        applied: u64,
    ) -> std::result::Result<(), String> {
        if self.position != applied {
            return Err("header and body disagree on the position".into());
        }
        if self.position > 0 {
            let event = log
                .read_event(vmplane_store::Position(self.position))
                .map_err(|e| format!("reading the log at {}: {e}", self.position))?
                .ok_or_else(|| {
                    format!(
                        "the log ends before the checkpoint's position {}",
                        self.position
                    )
                })?;
            if event.hash != self.event_hash {
                return Err(format!(
                    "the log's event at {} is not the one the checkpoint applied",
                    self.position
                ));
            }
        }
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paced_checkpoint_reads_back_as_one_written_at_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        // A body of many pieces and a partial last one.
        let body: Vec<u64> = (0..200_000).collect();
        let encoded_len = serde_json::to_vec(&body).expect("encode").len();
        let pacing = Pacing {
            piece_bytes: 64 * 1024,
            pause: std::time::Duration::ZERO,
        };
        assert!(
            encoded_len > 10 * pacing.piece_bytes
                && !encoded_len.is_multiple_of(pacing.piece_bytes)
        );
        let paced = path(dir.path(), "paced");
        let at_once = path(dir.path(), "at-once");
        let hash = [7u8; 32];
        write(&paced, "test", 42, &hash, &body, Some(pacing)).expect("paced");
        write(&at_once, "test", 42, &hash, &body, None).expect("at once");
        let written = fs::read(&paced).expect("paced file");
        assert_eq!(written, fs::read(&at_once).expect("file"));
        let loaded = read::<Vec<u64>>(&paced, "test")
            .expect("sound")
            .expect("present");
        assert_eq!((loaded.position, loaded.event_hash), (42, hash));
        assert_eq!(loaded.body, body);
        // The header written over the placeholder names the body's real hash.
        let split = written.iter().position(|b| *b == b'\n').expect("header");
        let header: Header = serde_json::from_slice(&written[..split]).expect("header");
        assert_eq!(
            header.body_sha256,
            hex::encode(Sha256::digest(&written[split + 1..]))
        );
        assert_ne!(header.body_sha256, hex::encode([0u8; 32]));
        assert_eq!(written.len() - split - 1, encoded_len);
    }

    #[test]
    fn a_body_that_cannot_be_serialized_is_an_error_and_leaves_no_checkpoint() {
        struct Unserializable;
        impl Serialize for Unserializable {
            fn serialize<S: serde::Serializer>(
                &self,
                _: S,
            ) -> std::result::Result<S::Ok, S::Error> {
                Err(serde::ser::Error::custom("refused"))
            }
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let at = path(dir.path(), "bad");
        let err = write(&at, "bad", 1, &[0; 32], &Unserializable, None).expect_err("refused");
        assert!(
            matches!(err, Error::Invalid { ref reason } if reason.contains("refused")),
            "{err:?}"
        );
        assert!(!at.exists());
        assert_eq!(
            fs::read_dir(dir.path().join(CHECKPOINT_DIR))
                .expect("dir")
                .count(),
            0
        );
    }
}
