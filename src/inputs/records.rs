//! The dataset's records (SPEC §2): a source, its goals, and each goal's questions.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::hash::sha256;

/// One source as written: inline text or a path to it.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SourceRecord {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    #[serde(default)]
    pub goals: Vec<Goal>,
    /// Labels to break scores down by (SPEC §11), e.g. the source's genre.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Goal {
    pub id: String,
    pub text: String,
    #[serde(default)]
    pub questions: Vec<Question>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Question {
    pub id: String,
    pub question: String,
    pub reference: String,
    /// The spans of the source the answer rests on (SPEC §11): each verbatim in the source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<Evidence>,
    /// Labels to break scores down by, e.g. the question's type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

/// A question's evidence as written: one span, or a list of them.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub(crate) enum Evidence {
    One(String),
    Many(Vec<String>),
}

impl<'de> Deserialize<'de> for Evidence {
    /// As `untagged` would, but a value of another kind says what was expected.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Spans;
        impl<'de> serde::de::Visitor<'de> for Spans {
            type Value = Evidence;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("evidence as a string or a list of strings")
            }
            fn visit_str<E: serde::de::Error>(self, span: &str) -> Result<Evidence, E> {
                Ok(Evidence::One(span.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, span: String) -> Result<Evidence, E> {
                Ok(Evidence::One(span))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Evidence, A::Error> {
                let mut spans = Vec::new();
                while let Some(span) = seq.next_element::<Span>()? {
                    spans.push(span.0);
                }
                Ok(Evidence::Many(spans))
            }
        }
        /// One span of a list, whose error says so.
        struct Span(String);
        impl<'de> Deserialize<'de> for Span {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Text;
                impl serde::de::Visitor<'_> for Text {
                    type Value = Span;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("each evidence span a string")
                    }
                    fn visit_str<E: serde::de::Error>(self, span: &str) -> Result<Span, E> {
                        Ok(Span(span.to_owned()))
                    }
                }
                deserializer.deserialize_str(Text)
            }
        }
        deserializer.deserialize_any(Spans)
    }
}

impl Question {
    /// The spans a memory must keep for this question (SPEC §11): its evidence, or else its
    /// reference as its one span; and whether they are its evidence.
    pub(crate) fn spans(&self) -> (Vec<&str>, bool) {
        match &self.evidence {
            Some(Evidence::One(span)) => (vec![span.as_str()], true),
            Some(Evidence::Many(spans)) => (spans.iter().map(String::as_str).collect(), true),
            None => (vec![self.reference.as_str()], false),
        }
    }
}

/// A source with its text loaded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Source {
    pub id: String,
    pub text: String,
    pub goals: Vec<Goal>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

impl Source {
    pub(crate) fn sha256(&self) -> String {
        sha256(&self.text)
    }
}
