//! A segment's sidecar index, `<segment>.idx`: every entry of its first `covered` bytes (its
//! kind, key, checksum, and where its payload lies), each small payload inline (checked against
//! its checksum when the segment was scanned; a damaged one is left out), and a CRC-32 of it
//! all. Opening the cache then reads the segment again only past `covered`, not the
//! large payloads (the generations a re-run never reads): at paper scale 700 MB of segment
//! for 150 MB of index. Made the first time a segment is opened whole; one that is damaged,
//! or does not match its segment, is not used (the segment is scanned as before).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::{Index, Kind, Location, RESIDENT_PAYLOAD, Slot, intact, place};

/// Version 3: made only by a scan that knew the kind of every entry it covers. Version 2's
/// (whose inline payloads were checked too) could leave out the entries of a kind its gacc did
/// not know (a later gacc's): they are refused, and the segment is scanned again, once.
const INDEX_MAGIC: &[u8; 8] = b"GACCIDX3";
/// A record's fixed part: kind, key, checksum, offset, length, inline.
const RECORD: usize = 1 + 32 + 32 + 8 + 4 + 1;

pub(super) fn index_path(segment: &Path) -> PathBuf {
    segment.with_extension("idx")
}

/// Appends one entry's sidecar record.
pub(super) fn push_record(out: &mut Vec<u8>, slot: Slot, checksum: &[u8; 32], offset: u64, payload: &[u8]) {
    let inline = payload.len() <= RESIDENT_PAYLOAD;
    out.push(slot.0);
    out.extend_from_slice(&slot.1);
    out.extend_from_slice(checksum);
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&u32::try_from(payload.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.push(u8::from(inline));
    if inline {
        out.extend_from_slice(payload);
    }
}

/// Writes a segment's sidecar index whole: the records of its first `covered` bytes.
pub(super) fn write_index(segment: &Path, covered: u64, records: &[u8]) -> Result<(), crate::error::Error> {
    let mut bytes = Vec::with_capacity(records.len() + 20);
    bytes.extend_from_slice(INDEX_MAGIC);
    bytes.extend_from_slice(&covered.to_le_bytes());
    bytes.extend_from_slice(records);
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    crate::files::write(&index_path(segment), &bytes)
}

/// One sidecar record, read back.
struct Record<'a> {
    slot: Slot,
    checksum: [u8; 32],
    offset: u64,
    length: usize,
    inline: Option<&'a [u8]>,
}

/// The records of a sidecar index's body, each checked to lie within `covered`; None at the
/// first that is malformed.
fn records(mut body: &[u8], covered: u64) -> impl Iterator<Item = Option<Record<'_>>> {
    std::iter::from_fn(move || {
        if body.is_empty() {
            return None;
        }
        let record = (|| {
            let fixed = body.get(..RECORD)?;
            let kind = fixed[0];
            if usize::from(kind) >= Kind::ALL.len() {
                return None;
            }
            let key: [u8; 32] = fixed[1..33].try_into().ok()?;
            let checksum: [u8; 32] = fixed[33..65].try_into().ok()?;
            let offset = u64::from_le_bytes(fixed[65..73].try_into().ok()?);
            let length = u32::from_le_bytes(fixed[73..77].try_into().ok()?) as usize;
            let inline = match fixed[77] {
                0 => None,
                1 => Some(body.get(RECORD..RECORD + length)?),
                _ => return None,
            };
            if offset.checked_add(length as u64)? > covered {
                return None;
            }
            body = &body[RECORD + inline.map_or(0, <[u8]>::len)..];
            Some(Record {
                slot: (kind, key),
                checksum,
                offset,
                length,
                inline,
            })
        })();
        if record.is_none() {
            body = &[];
        }
        Some(record)
    })
}

/// Loads a segment's sidecar index into `index` (small payloads into `resident`) when it can be
/// trusted: intact (its CRC), covering no more than the segment holds and ending where a line
/// does, and its last entry's payload lying in the segment where it says (so the index is of
/// this segment). How many bytes of the segment it covers; None: scan the segment instead.
pub(super) fn load_index(
    path: &Path,
    file: &File,
    segment: usize,
    index: &mut Index,
    resident: &mut Vec<u8>,
) -> Option<u64> {
    let bytes = std::fs::read(index_path(path)).ok()?;
    let (content, crc) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
    if crc32fast::hash(content).to_le_bytes() != crc || content.get(..8)? != INDEX_MAGIC {
        return None;
    }
    let covered = u64::from_le_bytes(content.get(8..16)?.try_into().ok()?);
    let body = &content[16..];
    if covered > file.metadata().ok()?.len() {
        return None;
    }
    if covered > 0 {
        let mut last = [0u8];
        file.read_exact_at(&mut last, covered - 1).ok()?;
        if last[0] != b'\n' {
            return None;
        }
    }
    let (mut last, mut count) = (None, 0);
    for record in records(body, covered) {
        last = Some(record?);
        count += 1;
    }
    // Grown once, not doubled (and rehashed) on the way to a million entries.
    index.reserve(count);
    if let Some(last) = last {
        let mut payload = vec![0u8; last.length];
        file.read_exact_at(&mut payload, last.offset).ok()?;
        if !intact(&payload, &last.checksum) {
            return None;
        }
    }
    for record in records(body, covered).flatten() {
        let location = match record.inline {
            Some(payload) => place(segment, record.offset, payload, Some(&mut *resident)),
            None => Location {
                segment,
                offset: record.offset,
                length: record.length,
            },
        };
        index.insert(record.slot, (location, record.checksum));
    }
    Some(covered)
}
