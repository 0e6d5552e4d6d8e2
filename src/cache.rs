//! The call cache (SPEC §4): one file per key, written whole or not at all.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};

use crate::builtin::Role;
use crate::hash::sha256;

/// The prefix of every cache key's canonical description; bump it to invalidate all keys.
const KEY_DOMAIN: &str = "gacc/1 cache key\n";

/// SHA-256 of a canonical description (serde_json sorts object keys, so equal values
/// serialise to equal bytes).
pub fn key(description: &Value) -> String {
    sha256(format!("{KEY_DOMAIN}{description}"))
}

/// A persistent, content-addressed store of successful callback responses.
#[derive(Debug, Clone)]
pub struct Cache {
    root: PathBuf,
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl Cache {
    pub fn open(root: &Path) -> std::io::Result<Cache> {
        std::fs::create_dir_all(root)?;
        Ok(Cache {
            root: root.to_path_buf(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, role: Role, key: &str) -> PathBuf {
        let shard = key.get(..2).unwrap_or("00");
        self.root
            .join(role.as_str())
            .join(shard)
            .join(format!("{key}.json"))
    }

    /// The stored response for `key`, if any. An unreadable entry counts as a miss.
    pub fn get(&self, role: Role, key: &str) -> Option<Value> {
        let bytes = std::fs::read(self.path(role, key)).ok()?;
        let entry: Value = serde_json::from_slice(&bytes).ok()?;
        (entry.get("key")?.as_str()? == key).then(|| entry.get("response").cloned())?
    }

    pub fn contains(&self, role: Role, key: &str) -> bool {
        self.path(role, key).is_file()
    }

    /// Stores a response durably: written to a temporary file, synced, then renamed into
    /// place, so a reader sees the whole entry or none, even after `kill -9` or power loss.
    pub fn put(&self, role: Role, key: &str, description: &Value, response: &Value) -> std::io::Result<()> {
        let path = self.path(role, key);
        let folder = path.parent().unwrap_or(&self.root);
        std::fs::create_dir_all(folder)?;
        let entry =
            json!({"key": key, "role": role.as_str(), "description": description, "response": response});
        let temp = folder.join(format!(
            ".tmp-{}-{}",
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            let mut file = std::fs::File::create(&temp)?;
            file.write_all(entry.to_string().as_bytes())?;
            file.sync_all()?;
            std::fs::rename(&temp, &path)?;
            // The rename itself is durable once the folder is synced.
            std::fs::File::open(folder)?.sync_all()
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_ignore_object_key_order() {
        let a: Value = serde_json::from_str(r#"{"b": 1, "a": {"y": 2, "x": 3}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a": {"x": 3, "y": 2}, "b": 1}"#).unwrap();
        assert_eq!(key(&a), key(&b));
        assert_ne!(key(&a), key(&json!({"b": 2})));
    }

    #[test]
    fn round_trip_and_no_temporary_files_left() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let k = key(&json!({"x": 1}));
        assert_eq!(cache.get(Role::Reader, &k), None);
        cache
            .put(Role::Reader, &k, &json!({"x": 1}), &json!({"answer": "a"}))
            .unwrap();
        assert_eq!(cache.get(Role::Reader, &k), Some(json!({"answer": "a"})));
        assert_eq!(cache.get(Role::Judge, &k), None);
        let shard = dir.path().join("reader").join(&k[..2]);
        let names: Vec<_> = std::fs::read_dir(shard)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(format!("{k}.json"))]);
    }

    #[test]
    fn a_partial_entry_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let k = key(&json!({"x": 2}));
        let path = cache.path(Role::Reader, &k);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"{\"key\": \"").unwrap();
        assert_eq!(cache.get(Role::Reader, &k), None);
    }
}
