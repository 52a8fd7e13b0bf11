//! The file's bytes: a header, then records.
//!
//! ```text
//! header   32 bytes: "vmplane-file-log v1 rkyv-0.8 le\n" (format, encoding, byte order)
//! record   0..4    body length b, u32 LE (b ≥ 1)
//!          4..8    CRC-32 (IEEE) of the body, u32 LE
//!          8..8+b  body:
//!                  0..4   claim bytes c, u32 LE
//!                  4..4+c claim changes: count u32 LE, then per change: key length u32 LE,
//!                         key, 1 (taken) or 0 (freed), and when taken owner length u32 LE, owner
//!                  …      zero padding to a multiple of 16
//!                  …      the commit's events: one batch value (`crate::batch`)
//! ```
//!
//! All integers are little-endian. The batch starts 16-aligned within the body, and a body is
//! read into a 16-aligned buffer, so events are read in place.
//!
//! Zeros may follow the last record up to the end of the file: room the committer wrote ahead
//! of the records (see `ROOM_BYTES` in the committer), or a file extended and never written
//! before a crash. Records end at the first frame that is all zeros with only zeros after it.

use std::fs::File;
use std::os::unix::fs::FileExt;

use rkyv::util::AlignedVec;

use super::{Index, OpenReport, RecordAt};
use crate::batch::BatchView;
use crate::error::{Error, Result};
use crate::types::Position;

/// The file's first bytes.
pub const HEADER: &[u8; 32] = b"vmplane-file-log v1 rkyv-0.8 le\n";

/// Bytes of a record's frame (length and CRC) before its body.
pub const FRAME_BYTES: usize = 8;

/// A record body larger than this is damage, not a commit: a commit holds at most one request
/// of a few MiB (the log's limits) or a group of smaller ones.
const BODY_BYTES_MAX: u32 = 256 << 20;

/// A claim taken (`owner: Some`) or freed (`None`) by a commit, in the order decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimChange {
    /// The claim's key.
    pub key: String,
    /// Who holds it now, if anyone.
    pub owner: Option<String>,
}

/// One record's bytes, frame included, for claim changes and a finished batch value.
pub(super) fn encode(claims: &[ClaimChange], batch: &[u8]) -> Vec<u8> {
    let mut claim_bytes = Vec::new();
    put_u32(&mut claim_bytes, claims.len());
    for change in claims {
        put_u32(&mut claim_bytes, change.key.len());
        claim_bytes.extend_from_slice(change.key.as_bytes());
        match &change.owner {
            Some(owner) => {
                claim_bytes.push(1);
                put_u32(&mut claim_bytes, owner.len());
                claim_bytes.extend_from_slice(owner.as_bytes());
            }
            None => claim_bytes.push(0),
        }
    }
    let batch_start = batch_start(claim_bytes.len());
    let body_len = batch_start + batch.len();
    let mut out = Vec::with_capacity(FRAME_BYTES + body_len);
    out.extend_from_slice(&[0; FRAME_BYTES]);
    put_u32(&mut out, claim_bytes.len());
    out.extend_from_slice(&claim_bytes);
    out.resize(FRAME_BYTES + batch_start, 0);
    out.extend_from_slice(batch);
    let crc = crc32fast::hash(&out[FRAME_BYTES..]);
    out[0..4].copy_from_slice(&(body_len as u32).to_le_bytes());
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Where the batch starts within a body whose claims take `claim_bytes`.
fn batch_start(claim_bytes: usize) -> usize {
    (4 + claim_bytes).div_ceil(16) * 16
}

fn put_u32(out: &mut Vec<u8>, value: usize) {
    out.extend_from_slice(&u32::try_from(value).unwrap_or(u32::MAX).to_le_bytes());
}

/// The batch of `body` (a record's body, CRC already checked), validated as `record`'s.
pub(super) fn view<'a>(body: &'a [u8], record: &RecordAt) -> Result<BatchView<'a>> {
    let corrupt = |reason: String| Error::Corrupt {
        position: Position(record.first_position),
        reason,
    };
    let claim_bytes = read_u32(body, 0).ok_or_else(|| corrupt("record body is empty".into()))?;
    let start = batch_start(claim_bytes as usize);
    let batch = body
        .get(start..)
        .ok_or_else(|| corrupt(format!("record's claims ({claim_bytes} bytes) overrun it")))?;
    let view = BatchView::new(batch, record.first_position)?;
    if view.last_position() != record.last_position {
        return Err(corrupt(format!(
            "record ends at {}, its index says {}",
            view.last_position(),
            record.last_position
        )));
    }
    Ok(view)
}

/// The claim changes of `body`.
fn claims(body: &[u8], first_position: u64) -> Result<Vec<ClaimChange>> {
    let corrupt = || Error::Corrupt {
        position: Position(first_position),
        reason: "the record's claim changes are malformed".into(),
    };
    let len = read_u32(body, 0).ok_or_else(corrupt)? as usize;
    let bytes = body.get(4..4 + len).ok_or_else(corrupt)?;
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8]> {
        let slice = bytes.get(at..at + n).ok_or_else(corrupt)?;
        at += n;
        Ok(slice)
    };
    let count = read_u32(take(4)?, 0).ok_or_else(corrupt)?;
    let mut changes = Vec::new();
    for _ in 0..count {
        let key_len = read_u32(take(4)?, 0).ok_or_else(corrupt)? as usize;
        let key = std::str::from_utf8(take(key_len)?).map_err(|_| corrupt())?;
        let owner = match take(1)?[0] {
            0 => None,
            1 => {
                let owner_len = read_u32(take(4)?, 0).ok_or_else(corrupt)? as usize;
                Some(
                    std::str::from_utf8(take(owner_len)?)
                        .map_err(|_| corrupt())?
                        .to_owned(),
                )
            }
            _ => return Err(corrupt()),
        };
        changes.push(ClaimChange {
            key: key.to_owned(),
            owner,
        });
    }
    Ok(changes)
}

/// Reads `record`'s body from `file` into an aligned buffer and checks its CRC.
pub(super) fn read_body(file: &File, record: &RecordAt) -> Result<AlignedVec<16>> {
    let mut body = AlignedVec::<16>::with_capacity(record.body_len as usize);
    body.resize(record.body_len as usize, 0);
    file.read_exact_at(&mut body, record.offset + FRAME_BYTES as u64)
        .map_err(|source| Error::Io {
            context: "reading a record of the log file",
            source,
        })?;
    let mut frame = [0u8; FRAME_BYTES];
    file.read_exact_at(&mut frame, record.offset)
        .map_err(|source| Error::Io {
            context: "reading a record of the log file",
            source,
        })?;
    if read_u32(&frame, 4) != Some(crc32fast::hash(&body)) {
        return Err(Error::Corrupt {
            position: Position(record.first_position),
            reason: "the record's checksum does not match its bytes".into(),
        });
    }
    Ok(body)
}

/// A torn last record found at open: where it starts, why it is one, and the positions its
/// unverified bytes say it holds (when they can tell).
pub(super) struct Torn {
    pub offset: u64,
    pub reason: &'static str,
    pub positions: Option<(u64, u64)>,
}

/// Reads the whole file into `index`: checks the header, every record's frame and CRC, every
/// event (position, chain, stream revisions). A torn last record is reported, not yet cut: the
/// caller checks the head record first ([`cut_tail`]).
pub(super) fn load(file: &File, index: &mut Index) -> Result<(OpenReport, Option<Torn>)> {
    let io = |context: &'static str| move |source| Error::Io { context, source };
    let file_len = file
        .metadata()
        .map_err(io("reading the log file's size"))?
        .len();
    let mut header = [0u8; 32];
    if file_len < HEADER.len() as u64 {
        return Err(Error::Damaged {
            reason: format!("the log file is {file_len} bytes, shorter than its header"),
        });
    }
    file.read_exact_at(&mut header, 0)
        .map_err(io("reading the log file's header"))?;
    if &header != HEADER {
        return Err(Error::Damaged {
            reason: format!(
                "the log file's header is {:?}, expected {:?}: not a vmplane file log of this \
                 format",
                String::from_utf8_lossy(&header),
                String::from_utf8_lossy(HEADER)
            ),
        });
    }
    let mut offset = HEADER.len() as u64;
    let mut records = 0u64;
    let report = |index: &Index, records, torn_tail_bytes| OpenReport {
        events: index.last_position,
        records,
        torn_tail_bytes,
        torn_tail: None,
    };
    while offset < file_len {
        let next = index.last_position + 1;
        let left = file_len - offset;
        let torn = |reason: &'static str,
                    positions: Option<(u64, u64)>|
         -> Result<(OpenReport, Option<Torn>)> {
            Ok((
                report(index, records, left),
                Some(Torn {
                    offset,
                    reason,
                    positions,
                }),
            ))
        };
        if left < FRAME_BYTES as u64 {
            if zeros_to_end(file, offset, file_len)? {
                break;
            }
            return torn("a short frame", None);
        }
        let mut frame = [0u8; FRAME_BYTES];
        file.read_exact_at(&mut frame, offset)
            .map_err(io("reading the log file"))?;
        let body_len = read_u32(&frame, 0).unwrap_or(0);
        let crc = read_u32(&frame, 4).unwrap_or(0);
        let body_end = offset + FRAME_BYTES as u64 + u64::from(body_len);
        // Whether this is the last record: at the end of the file, or followed by zeros only
        // (asked only of a record that fails its checks).
        let last = || -> Result<bool> {
            Ok(body_end >= file_len || zeros_to_end(file, body_end, file_len)?)
        };
        if body_len == 0 || body_len > BODY_BYTES_MAX {
            // Nothing but zeros from here on: the records end here.
            if body_len == 0 && zeros_to_end(file, offset, file_len)? {
                break;
            }
            if last()? {
                return torn("a frame with no valid length", None);
            }
            return Err(Error::Corrupt {
                position: Position(next),
                reason: format!(
                    "the record at byte {offset} has length {body_len}, and records follow it"
                ),
            });
        }
        if offset + FRAME_BYTES as u64 + u64::from(body_len) > file_len {
            return torn("a body shorter than its frame says", None);
        }
        let mut body = AlignedVec::<16>::with_capacity(body_len as usize);
        body.resize(body_len as usize, 0);
        file.read_exact_at(&mut body, offset + FRAME_BYTES as u64)
            .map_err(io("reading the log file"))?;
        if crc32fast::hash(&body) != crc {
            if last()? {
                return torn(
                    "a checksum that does not match",
                    unverified_positions(&body, next),
                );
            }
            return Err(Error::Corrupt {
                position: Position(next),
                reason: format!(
                    "the record at byte {offset} does not match its checksum, and records \
                     follow it"
                ),
            });
        }
        let mut record = RecordAt {
            first_position: next,
            last_position: next,
            offset,
            body_len,
            recorded_at: 0,
        };
        let claim_bytes = read_u32(&body, 0).unwrap_or(u32::MAX) as usize;
        let batch = body.get(batch_start(claim_bytes)..).ok_or(Error::Corrupt {
            position: Position(next),
            reason: "the record's claims overrun it".into(),
        })?;
        let batch_view = BatchView::new(batch, next)?;
        record.last_position = batch_view.last_position();
        record.recorded_at = batch_view.event(0)?.recorded_at.0;
        let changes = claims(&body, next)?;
        index.add_record(record, &batch_view, &changes)?;
        offset = index.end_offset;
        records += 1;
    }
    Ok((report(index, records, 0), None))
}

/// The positions a record body that failed its checksum says it holds, if its batch still
/// reads as one starting at `first_position` (a hint for a report, never trusted).
fn unverified_positions(body: &[u8], first_position: u64) -> Option<(u64, u64)> {
    let claim_bytes = read_u32(body, 0)? as usize;
    let batch = body.get(batch_start(claim_bytes)..)?;
    let view = BatchView::new(batch, first_position).ok()?;
    Some((first_position, view.last_position()))
}

/// Whether every byte from `offset` to `end` is zero: the committer's room ahead of the
/// records, or what a file extended but never written holds after a crash.
fn zeros_to_end(file: &File, offset: u64, end: u64) -> Result<bool> {
    let mut buf = vec![0u8; 64 << 10];
    let mut at = offset;
    while at < end {
        let n = ((end - at) as usize).min(buf.len());
        file.read_exact_at(&mut buf[..n], at)
            .map_err(|source| Error::Io {
                context: "reading the log file's tail",
                source,
            })?;
        if buf[..n].iter().any(|b| *b != 0) {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
}

/// Cuts the file at the torn record, durably.
pub(super) fn cut_tail(file: &File, torn: &Torn, bytes: u64) -> Result<()> {
    let (offset, reason) = (torn.offset, torn.reason);
    tracing::warn!(offset, bytes, reason, "the log file ends in a torn record");
    file.set_len(offset)
        .and_then(|()| file.sync_all())
        .map_err(|source| Error::Io {
            context: "cutting a torn record off the log file",
            source,
        })
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let word: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
    Some(u32::from_le_bytes(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_changes_round_trip_through_a_body() {
        let changes = vec![
            ClaimChange {
                key: "name/default/a".into(),
                owner: Some("vm/default/a".into()),
            },
            ClaimChange {
                key: "fw/1".into(),
                owner: None,
            },
        ];
        let bytes = encode(&changes, b"batch");
        let body = &bytes[FRAME_BYTES..];
        assert_eq!(read_u32(&bytes, 0), Some(body.len() as u32));
        assert_eq!(read_u32(&bytes, 4), Some(crc32fast::hash(body)));
        assert_eq!(claims(body, 1).expect("claims"), changes);
        let start = batch_start(read_u32(body, 0).expect("len") as usize);
        assert_eq!(start % 16, 0);
        assert_eq!(&body[start..], b"batch");
    }

    #[test]
    fn malformed_claim_bytes_are_corrupt_not_a_panic() {
        let bytes = encode(
            &[ClaimChange {
                key: "k".into(),
                owner: Some("o".into()),
            }],
            b"",
        );
        let mut body = bytes[FRAME_BYTES..].to_vec();
        // The key's length now runs past the claims.
        body[8] = 200;
        assert!(
            matches!(claims(&body, 7), Err(Error::Corrupt { position, .. }) if position == Position(7))
        );
    }
}
