//! The kinds of entry a cache holds (SPEC §4), by name in a segment and by number in an index.

use crate::protocol::Role;

/// The kinds of entry a cache holds: one per callback role, truncated memories (their
/// counts), memory texts (once each, by their SHA-256), provider batches' answers, the
/// recount's proven token counts and a report's pair tests. Written into each entry by name,
/// and into an index by place. Its number is its place in `ALL`, which a segment's index file
/// records: new kinds go last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub(crate) enum Kind {
    Compressor,
    Reader,
    Judge,
    Memory,
    Text,
    Batch,
    Count,
    Writer,
    Pair,
}

impl Kind {
    pub(super) const ALL: [Kind; 9] = [
        Kind::Compressor,
        Kind::Reader,
        Kind::Judge,
        Kind::Memory,
        Kind::Text,
        Kind::Batch,
        Kind::Count,
        Kind::Writer,
        Kind::Pair,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Compressor => "compressor",
            Kind::Reader => "reader",
            Kind::Judge => "judge",
            Kind::Memory => "memory",
            Kind::Text => "text",
            Kind::Batch => "batch",
            Kind::Count => "count",
            Kind::Writer => "writer",
            Kind::Pair => "pair",
        }
    }

    pub(crate) fn named(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|kind| kind.as_str() == name)
    }

    /// Its place in an index: where it stands in `ALL` (every cache read and write asks).
    pub(super) fn number(self) -> u8 {
        self as u8
    }
}

impl From<Role> for Kind {
    /// A callback's answers are kept under its role.
    fn from(role: Role) -> Kind {
        match role {
            Role::Compressor => Kind::Compressor,
            Role::Reader => Kind::Reader,
            Role::Judge => Kind::Judge,
            Role::Writer => Kind::Writer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kinds_number_is_its_place_and_its_name_reads_back() {
        for (place, kind) in Kind::ALL.into_iter().enumerate() {
            assert_eq!(usize::from(kind.number()), place);
            assert_eq!(Kind::named(kind.as_str()), Some(kind));
        }
        assert_eq!(Kind::named("compressors"), None);
    }
}
