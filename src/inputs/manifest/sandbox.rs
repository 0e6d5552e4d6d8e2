//! A callback's `sandbox`: `true`, `false`, or a table of what it may reach.

use std::fmt;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `sandbox = false`, `sandbox = true`, or `sandbox = { read = [...], write = [...], network = true }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SandboxSpec {
    /// False for `sandbox = false`: the callback runs unrestricted (the report says so).
    pub enabled: bool,
    /// Files and folders the callback may read, relative to the manifest's folder.
    pub read: Vec<PathBuf>,
    /// Folders (or files) the callback may write, relative to the manifest's folder.
    pub write: Vec<PathBuf>,
    /// False cuts the callback off TCP (binding and connecting).
    pub network: bool,
}

impl Default for SandboxSpec {
    fn default() -> Self {
        SandboxSpec {
            enabled: true,
            read: Vec::new(),
            write: Vec::new(),
            network: true,
        }
    }
}

/// The table form of `sandbox`.
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SandboxTable {
    #[serde(default)]
    read: Vec<PathBuf>,
    #[serde(default)]
    write: Vec<PathBuf>,
    #[serde(default = "yes")]
    network: bool,
}

pub(super) fn yes() -> bool {
    true
}

impl JsonSchema for SandboxSpec {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "SandboxSpec".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let table = generator.subschema_for::<SandboxTable>();
        schemars::json_schema!({
            "description": "false to run unsandboxed, true for the defaults, or what the sandbox adds",
            "anyOf": [{"type": "boolean"}, table]
        })
    }
}

impl Serialize for SandboxSpec {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if !self.enabled {
            return serializer.serialize_bool(false);
        }
        SandboxTable {
            read: self.read.clone(),
            write: self.write.clone(),
            network: self.network,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for SandboxSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = SandboxSpec;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("`false`, `true` or a table { read = [...], write = [...], network = true }")
            }
            fn visit_bool<E: serde::de::Error>(self, enabled: bool) -> Result<SandboxSpec, E> {
                Ok(SandboxSpec {
                    enabled,
                    ..SandboxSpec::default()
                })
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<SandboxSpec, A::Error> {
                let table = SandboxTable::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(SandboxSpec {
                    enabled: true,
                    read: table.read,
                    write: table.write,
                    network: table.network,
                })
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}
