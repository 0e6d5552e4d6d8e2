//! One value per callback of a run, in the shape a manifest gives them: each compressor by
//! name, the reader, the judge, the audit judges (SPEC §10) and the panel readers (SPEC §11) by
//! name. The manifest's
//! settings, the plan's identities, the runner's callables and the preview's launchers are
//! each a `CallbackSet`, so an audit judge is found by its name everywhere.

use std::collections::BTreeMap;

use super::Role;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CallbackSet<T> {
    pub compressors: BTreeMap<String, T>,
    pub reader: T,
    pub judge: T,
    /// The audit judges by name, in `[audit] judges` order.
    pub audits: Vec<(String, T)>,
    /// The panel readers by name, in `[audit] readers` order (SPEC §11).
    pub panel: Vec<(String, T)>,
}

impl<T> CallbackSet<T> {
    /// The same callbacks, each value made by `make` from the callback's manifest key
    /// (`compressors.NAME`, `reader`, `judge`, `judges.NAME`, `readers.NAME`), its role and its value here,
    /// in that order.
    pub(crate) fn map<U>(&self, mut make: impl FnMut(String, Role, &T) -> U) -> CallbackSet<U> {
        CallbackSet {
            compressors: self
                .compressors
                .iter()
                .map(|(name, value)| {
                    let made = make(format!("compressors.{name}"), Role::Compressor, value);
                    (name.clone(), made)
                })
                .collect(),
            reader: make("reader".into(), Role::Reader, &self.reader),
            judge: make("judge".into(), Role::Judge, &self.judge),
            audits: self
                .audits
                .iter()
                .map(|(name, value)| (name.clone(), make(format!("judges.{name}"), Role::Judge, value)))
                .collect(),
            panel: self
                .panel
                .iter()
                .map(|(name, value)| (name.clone(), make(format!("readers.{name}"), Role::Reader, value)))
                .collect(),
        }
    }

    /// A panel reader's value, by its name in `[audit] readers`.
    pub(crate) fn panel_reader(&self, name: &str) -> Option<&T> {
        self.panel.iter().find(|(n, _)| n == name).map(|(_, value)| value)
    }

    /// An audit judge's value, by its name in `[audit] judges`.
    pub(crate) fn audit(&self, name: &str) -> Option<&T> {
        self.audits
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value)
    }

    /// Every value with its callback's manifest key and role, in the order of `map`.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (String, Role, &T)> {
        let compressors = self
            .compressors
            .iter()
            .map(|(name, value)| (format!("compressors.{name}"), Role::Compressor, value));
        let audits = self
            .audits
            .iter()
            .map(|(name, value)| (format!("judges.{name}"), Role::Judge, value));
        let panel = self
            .panel
            .iter()
            .map(|(name, value)| (format!("readers.{name}"), Role::Reader, value));
        compressors
            .chain([
                ("reader".to_owned(), Role::Reader, &self.reader),
                ("judge".to_owned(), Role::Judge, &self.judge),
            ])
            .chain(audits)
            .chain(panel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set() -> CallbackSet<u32> {
        CallbackSet {
            compressors: [("b".to_owned(), 2), ("a".to_owned(), 1)].into_iter().collect(),
            reader: 3,
            judge: 4,
            audits: vec![("strict".to_owned(), 5), ("lenient".to_owned(), 6)],
            panel: vec![("small".to_owned(), 7)],
        }
    }

    #[test]
    fn each_callback_is_named_by_its_manifest_key_in_one_order() {
        let set = set();
        let keys: Vec<(String, Role, u32)> = set.iter().map(|(k, r, v)| (k, r, *v)).collect();
        let expected = [
            ("compressors.a", Role::Compressor, 1),
            ("compressors.b", Role::Compressor, 2),
            ("reader", Role::Reader, 3),
            ("judge", Role::Judge, 4),
            ("judges.strict", Role::Judge, 5),
            ("judges.lenient", Role::Judge, 6),
            ("readers.small", Role::Reader, 7),
        ];
        let expected: Vec<(String, Role, u32)> = expected
            .iter()
            .map(|(k, r, v)| ((*k).to_owned(), *r, *v))
            .collect();
        assert_eq!(keys, expected);
        // `map` visits them in the same order, and keeps the names.
        let mut visited = Vec::new();
        let doubled = set.map(|key, _, value| {
            visited.push(key);
            value * 2
        });
        assert_eq!(
            visited,
            expected.iter().map(|(k, _, _)| k.clone()).collect::<Vec<_>>()
        );
        assert_eq!(doubled.audit("lenient"), Some(&12));
        assert_eq!(doubled.panel_reader("small"), Some(&14));
        assert_eq!(doubled.compressors["b"], 4);
    }

    #[test]
    fn an_audit_judge_is_found_by_its_name_whatever_its_place() {
        let mut set = set();
        assert_eq!(set.audit("strict"), Some(&5));
        set.audits.reverse();
        assert_eq!(set.audit("strict"), Some(&5), "by name, not by position");
        assert_eq!(set.audit("absent"), None);
    }
}
