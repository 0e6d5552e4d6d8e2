//! The anchor reads of a plan (SPEC §11).

/// The anchor reads of every (seed, question) (SPEC §11): with an empty memory, and with the
/// whole source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Anchors {
    pub floor: bool,
    pub ceiling: bool,
}

impl Anchors {
    pub(super) fn of(manifest: &crate::inputs::manifest::Manifest) -> Anchors {
        let (floor, ceiling) = manifest.anchored();
        Anchors { floor, ceiling }
    }

    /// Each anchor on, with the memory it reads from `source`.
    pub(crate) fn each<'s>(&self, source: &'s str) -> impl Iterator<Item = (Anchor, &'s str)> {
        let floor = self.floor.then_some((Anchor::Floor, ""));
        let ceiling = self.ceiling.then_some((Anchor::Ceiling, source));
        floor.into_iter().chain(ceiling)
    }
}

/// One anchor read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Anchor {
    Floor,
    Ceiling,
}

impl Anchor {
    /// The names its reader and judge calls have in a row's `calls`.
    pub(crate) fn call_names(self) -> (&'static str, &'static str) {
        match self {
            Anchor::Floor => ("floor.reader", "floor.judge"),
            Anchor::Ceiling => ("ceiling.reader", "ceiling.judge"),
        }
    }
}
