//! Files written whole or not at all: a temporary file beside the target, renamed into place,
//! so a reader (another gacc, a node of the cluster, a user's script) sees nothing or everything.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, io};

/// The temporary file a write goes through: hidden beside its target, named by this process.
fn temporary(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// Writes a file whole.
pub(crate) fn write(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    write_with(path, |out| out.write_all(bytes))
}

/// Writes a file whole, streamed through a buffer.
pub(crate) fn write_with(
    path: &Path,
    body: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> Result<(), Error> {
    replace_whole(path, |file| {
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        body(&mut out)?;
        out.into_inner().map_err(|e| e.into_error())?;
        Ok(())
    })
}

/// Makes `path` whole or not at all: `write` fills a temporary file beside it, which is then
/// renamed into place (and removed if anything failed).
fn replace_whole<T>(
    path: &Path,
    write: impl FnOnce(std::fs::File) -> std::io::Result<T>,
) -> Result<T, Error> {
    let temp = temporary(path);
    let written = (|| {
        let made = write(std::fs::File::create(&temp)?)?;
        std::fs::rename(&temp, path)?;
        Ok(made)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written.map_err(io(path))
}

/// Writes a file whole and on disk before it appears (its folder made first): for files
/// another machine reads, where a crash must leave nothing half written.
pub(crate) fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let temp = temporary(path);
    let mut file = std::fs::File::create(&temp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&temp, path)
}

/// Writes rows as JSON Lines, one object a line, and gives the SHA-256 of the bytes written.
pub(crate) fn write_json_lines_hashed<T: serde::Serialize>(path: &Path, rows: &[T]) -> Result<String, Error> {
    replace_whole(path, |file| {
        // Hashed as the buffer is flushed: in large pieces, not a field at a time.
        let mut out = std::io::BufWriter::with_capacity(1 << 20, Hashing::new(file));
        json_lines(&mut out, rows)?;
        Ok(out.into_inner().map_err(|e| e.into_error())?.digest())
    })
}

/// The SHA-256 of what `body` writes, in hex (nothing is kept).
pub(crate) fn digest_of(body: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> std::io::Result<String> {
    let mut out = std::io::BufWriter::with_capacity(1 << 20, Hashing::new(std::io::sink()));
    body(&mut out)?;
    Ok(out.into_inner().map_err(|e| e.into_error())?.digest())
}

/// A writer that hashes what goes through it (to `io::sink()`, it only hashes).
pub(crate) struct Hashing<W> {
    inner: W,
    hasher: sha2::Sha256,
}

impl<W: Write> Hashing<W> {
    pub(crate) fn new(inner: W) -> Self {
        Hashing {
            inner,
            hasher: <sha2::Sha256 as sha2::Digest>::new(),
        }
    }

    /// The SHA-256 of everything written, in hex.
    pub(crate) fn digest(self) -> String {
        crate::hash::hex(&sha2::Digest::finalize(self.hasher))
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let written = self.inner.write(bytes)?;
        sha2::Digest::update(&mut self.hasher, &bytes[..written]);
        Ok(written)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes a file whole as gzip (fast level: a run folder's derived files are large, and
/// written on every run), streamed through the compressor.
pub(crate) fn write_gzip_with(
    path: &Path,
    body: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), Error> {
    write_with(path, |out| {
        let mut encoder = flate2::write::GzEncoder::new(out, flate2::Compression::fast());
        let mut buffered = std::io::BufWriter::with_capacity(1 << 16, &mut encoder);
        body(&mut buffered)?;
        buffered.into_inner().map_err(|e| e.into_error())?;
        encoder.try_finish()
    })
}

/// Writes rows as JSON Lines, one object a line, to any writer.
pub(crate) fn json_lines<T: serde::Serialize>(out: &mut dyn Write, rows: &[T]) -> std::io::Result<()> {
    for row in rows {
        serde_json::to_writer(&mut *out, row)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// Pretty JSON with a final newline, as every JSON file of a run folder is written.
pub(crate) fn pretty(value: &impl serde::Serialize) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

/// How much a writability probe writes: enough that a place with a few bytes left fails it.
const PROBE_BYTES: usize = 64 << 10;

/// Checks that `folder` takes a write and a sync (a probe file, removed after): a read-only
/// place, a full disk or an exhausted quota fails here, before a call is paid for.
pub(crate) fn probe_writable(folder: &Path) -> Result<(), Error> {
    let path = folder.join(format!(".gacc-probe-{}", std::process::id()));
    let written = (|| {
        let mut file = std::fs::File::create(&path)?;
        file.write_all(&vec![0u8; PROBE_BYTES])?;
        file.sync_all()
    })();
    let _ = std::fs::remove_file(&path);
    written.map_err(|error| Error::Io {
        path: folder.to_path_buf(),
        message: format!(
            "cannot be written ({error}); nothing was called: free space there (or make it writable) and run again"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_the_file_whole_and_leaves_no_temporary() {
        let folder = std::env::temp_dir().join(format!("gacc-files-{}", std::process::id()));
        std::fs::create_dir_all(&folder).unwrap();
        let path = folder.join("report.json");
        write(&path, b"old").unwrap();
        let digest = write_json_lines_hashed(&path, &[1, 2]).unwrap();
        assert_eq!(digest, crate::hash::sha256("1\n2\n"));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "1\n2\n");
        write_durably(&folder.join("calls/ab/x.json"), b"{}").unwrap();
        let failed = write_with(&path, |_| Err(std::io::Error::other("disk full")));
        assert!(failed.unwrap_err().to_string().contains("report.json: disk full"));
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "1\n2\n",
            "a failed write keeps the old file"
        );
        let names: Vec<String> = std::fs::read_dir(&folder)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.contains("tmp")), "{names:?}");
        std::fs::remove_dir_all(&folder).unwrap();
    }
}
