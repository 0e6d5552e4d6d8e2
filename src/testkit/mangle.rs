//! Test-only: what an attacker or a careless hand sends, as proptest strategies for the
//! property tests of every reader of outside data (`testkit::app`, `testkit::providers`).

use proptest::prelude::*;
use serde_json::{Value, json};

/// Bytes that break formats: line ends, quotes, separators, a BOM, a NUL, a byte that is not
/// UTF-8, numbers no field holds, brackets, TOML headers.
const HOSTILE: &[&[u8]] = &[
    b"\r\n",
    b"\n",
    b",",
    b"\"",
    b"\xef\xbb\xbf",
    b"\0",
    b"\xff",
    b"-1",
    b"1e400",
    b"18446744073709551616",
    b"{",
    b"}",
    b"[",
    b"]",
    b":",
    b"=",
    b"null",
    b"'''",
    b"[run]",
    b"\\",
    b"\t",
    b"\xc3\xa9",
    b"NaN",
];

/// One change to a file's bytes; positions wrap around its length.
#[derive(Debug, Clone)]
pub(crate) enum Edit {
    Cut(usize),
    Drop(usize, usize),
    Insert(usize, usize),
    Repeat(usize, usize),
}

/// One to four edits: cuts, dropped and repeated runs, hostile bytes spliced in.
pub(crate) fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let edit = prop_oneof![
        1 => any::<usize>().prop_map(Edit::Cut),
        3 => (any::<usize>(), 1..48usize).prop_map(|(at, n)| Edit::Drop(at, n)),
        4 => (any::<usize>(), 0..HOSTILE.len()).prop_map(|(at, h)| Edit::Insert(at, h)),
        2 => (any::<usize>(), 1..48usize).prop_map(|(at, n)| Edit::Repeat(at, n)),
    ];
    prop::collection::vec(edit, 1..5)
}

/// `bytes` with `edits` applied in turn.
pub(crate) fn mangled(bytes: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut bytes = bytes.to_vec();
    for edit in edits {
        let len = bytes.len().max(1);
        match *edit {
            Edit::Cut(at) => bytes.truncate(at % len),
            Edit::Drop(at, n) => {
                let at = (at % len).min(bytes.len());
                bytes.drain(at..(at + n).min(bytes.len()));
            }
            Edit::Insert(at, h) => {
                let at = (at % len).min(bytes.len());
                bytes.splice(at..at, HOSTILE[h].iter().copied());
            }
            Edit::Repeat(at, n) => {
                let at = (at % len).min(bytes.len());
                let copy = bytes[at..(at + n).min(bytes.len())].to_vec();
                bytes.splice(at..at, copy);
            }
        }
    }
    bytes
}

/// JSON values no field expects: nulls, negative, fractional and huge numbers, numbers as text,
/// the wrong kinds, and small arrays and objects of them.
pub(crate) fn hostile_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        Just(json!(-1)),
        Just(json!(-0.5)),
        Just(json!(1.5)),
        Just(json!(1e300)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(1_000_000_000_001u64)),
        Just(json!("")),
        Just(json!("9999999999999999999999")),
        Just(json!(true)),
        Just(json!([])),
        Just(json!({})),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..3)
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

/// `value` with its node number `at` (in document order, the whole value being 0) replaced.
pub(crate) fn replaced(value: &Value, mut at: usize, with: &Value) -> Value {
    fn walk(value: &mut Value, at: &mut usize, with: &Value) -> bool {
        if *at == 0 {
            *value = with.clone();
            return true;
        }
        *at -= 1;
        match value {
            Value::Array(items) => items.iter_mut().any(|item| walk(item, at, with)),
            Value::Object(fields) => fields.values_mut().any(|field| walk(field, at, with)),
            _ => false,
        }
    }
    let mut value = value.clone();
    walk(&mut value, &mut at, with);
    value
}

/// A header's text: numbers of every size and sign, durations, dates, and anything.
pub(crate) fn header_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<f64>().prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        (
            0..100_000u64,
            prop::sample::select(vec!["ms", "s", "m", "h", "m0s", "h1m"])
        )
            .prop_map(|(n, unit)| format!("{n}{unit}")),
        (any::<i64>(), 0..40i64, any::<i64>(), any::<i64>(), -30..30i64)
            .prop_map(|(y, d, h, m, o)| format!("{y}-12-{d:02}T{h}:{m}:00.5+{o}:00")),
        Just("2026-12-01T20:44:34Z".to_owned()),
        Just("1e400".to_owned()),
        Just("inf".to_owned()),
        Just("0.000000001s".to_owned()),
        ".{0,16}",
    ]
}
