//! Reading a segment: its lines indexed where they lie, small payloads checked and kept.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::index::push_record;
use super::{Index, Kind, RESIDENT_PAYLOAD, Slot, Stats, decode_hex, intact, place};

/// Indexes one segment's lines from byte `start` on, keeping small payloads in `resident`
/// while it has room, and (with `records`) writing each entry's sidecar record; a line without
/// its newline or with a malformed header is skipped (a checksum mismatch is caught when the
/// entry is read). The segment is read in large blocks and each line parsed where it lies.
/// Gives how far the segment's whole lines go.
pub(super) fn scan(mut file: &File, segment: usize, start: u64, sinks: Sinks) -> std::io::Result<u64> {
    let Sinks {
        index,
        stats,
        mut resident,
        mut records,
    } = sinks;
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(start))?;
    let mut block = vec![0u8; SCAN_BLOCK];
    // Bytes of `block` holding data, and the segment offset of `block[0]`.
    let (mut filled, mut base) = (0usize, start);
    loop {
        if filled == block.len() {
            // A line longer than the block: the block grows to hold it.
            block.resize(block.len() * 2, 0);
        }
        let read = std::io::Read::read(&mut file, &mut block[filled..])?;
        if read == 0 {
            if filled > 0 {
                stats.torn_lines += 1;
            }
            return Ok(base);
        }
        filled += read;
        let mut start = 0;
        while let Some(length) = memchr::memchr(b'\n', &block[start..filled]) {
            let line = &block[start..start + length];
            let offset = base + start as u64;
            match parse_line(line) {
                Ok((entry_slot, checksum, header)) => {
                    let payload = &line[header..];
                    let at = offset + header as u64;
                    // A small payload is checked now, once (it may be kept in memory, or in
                    // the sidecar index, and is not checked again); a damaged one is a miss.
                    if payload.len() <= RESIDENT_PAYLOAD && !intact(payload, &checksum) {
                        stats.damaged += 1;
                    } else {
                        if let Some(records) = records.as_deref_mut() {
                            push_record(records, entry_slot, &checksum, at, payload);
                        }
                        let location = place(segment, at, payload, resident.as_deref_mut());
                        index.insert(entry_slot, (location, checksum));
                    }
                }
                Err(Unread::UnknownKind) => stats.unknown_kind += 1,
                Err(Unread::Torn) => stats.torn_lines += 1,
            }
            start += length + 1;
        }
        block.copy_within(start..filled, 0);
        filled -= start;
        base += start as u64;
    }
}

/// The segment files (`*.log`) of a cache's `segments/` folder, in no order.
pub(super) fn segment_files(folder: &Path) -> std::io::Result<Vec<PathBuf>> {
    Ok(std::fs::read_dir(folder)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect())
}

/// Where a scan puts what it finds.
pub(super) struct Sinks<'a> {
    pub(super) index: &'a mut Index,
    pub(super) stats: &'a mut Stats,
    pub(super) resident: Option<&'a mut Vec<u8>>,
    /// A sidecar index being made, if one is.
    pub(super) records: Option<&'a mut Vec<u8>>,
}

/// How much of a segment is read at once when it is indexed.
pub(super) const SCAN_BLOCK: usize = 4 << 20;

/// Why a line is not an entry this gacc reads.
#[derive(Debug, PartialEq)]
pub(super) enum Unread {
    /// Not a whole entry (a process killed mid-write).
    Torn,
    /// A whole entry of a kind this gacc does not know (a later gacc's): lowercase letters.
    UnknownKind,
}

/// A line's slot, payload checksum and header length (`<key> <kind> <sha256> `), if its
/// header is well formed and of a kind this gacc knows.
pub(super) fn parse_line(line: &[u8]) -> Result<(Slot, [u8; 32], usize), Unread> {
    let mut fields = line.splitn(4, |b| *b == b' ');
    let mut field = || fields.next().ok_or(Unread::Torn);
    let (key, kind, checksum, _) = (field()?, field()?, field()?, field()?);
    let (Some(key), Some(checksum)) = (decode_hex(key), decode_hex(checksum)) else {
        return Err(Unread::Torn);
    };
    let header = 64 + kind.len() + 64 + 3;
    match std::str::from_utf8(kind).ok().and_then(Kind::named) {
        Some(kind) => Ok(((kind.number(), key), checksum, header)),
        None if !kind.is_empty() && kind.iter().all(u8::is_ascii_lowercase) => Err(Unread::UnknownKind),
        None => Err(Unread::Torn),
    }
}
