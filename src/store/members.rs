//! A row file as gzip members (RFC 1952 §2.2), one ended at every flush: what a run has
//! flushed is a whole gzip file (`zcat`, `gzip -dc`, any multi-member reader), while it is
//! still writing. A run that stops mid-member leaves a cut last member; its readers here take
//! every row before it, as they took every whole line of a plain file.
//!
//! Rows gzip to a quarter of their size (results and ledger rows are mostly ids and hex keys);
//! gzip's fast level costs about 0.6 s of a second thread per 176 MB, the results of a
//! paper-scale run.

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};

use flate2::Compression;
use flate2::write::GzEncoder;

/// Compressed bytes a member holds before they go to the file.
const CHUNK: usize = 1 << 20;

/// A writer of gzip members: each `flush` ends the member it wrote to.
pub(crate) struct Members<W: Write> {
    file: W,
    member: Option<GzEncoder<Vec<u8>>>,
}

impl<W: Write> Members<W> {
    pub(crate) fn new(file: W) -> Self {
        Members { file, member: None }
    }

    /// Ends the last member and gives the file back.
    pub(crate) fn finish(mut self) -> std::io::Result<W> {
        self.flush()?;
        Ok(self.file)
    }
}

impl<W: Write> Write for Members<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let member = (self.member)
            .get_or_insert_with(|| GzEncoder::new(Vec::with_capacity(CHUNK), Compression::fast()));
        member.write_all(bytes)?;
        if member.get_ref().len() >= CHUNK {
            self.file.write_all(member.get_ref())?;
            member.get_mut().clear();
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if let Some(member) = self.member.take() {
            self.file.write_all(&member.finish()?)?;
        }
        self.file.flush()
    }
}

/// The rows of a member file, decompressed: every member one after another, a cut last
/// member read as far as it goes.
pub(crate) fn reader(file: impl Read + 'static) -> impl Read {
    Uncut(flate2::bufread::MultiGzDecoder::new(BufReader::with_capacity(
        CHUNK, file,
    )))
}

/// A decoder whose input ends mid-member ends there.
struct Uncut<R>(R);

impl<R: Read> Read for Uncut<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self.0.read(buf) {
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => Ok(0),
            read => read,
        }
    }
}

/// Where counting a growing member file got to: the end of its last whole member, and the
/// lines before it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counted {
    pub offset: u64,
    pub lines: usize,
}

/// The lines of the member file `file`, reading only the members after `from`; with the
/// lines of a member still being written (not kept in the `Counted` given back: it is read
/// again, whole, next time).
pub(crate) fn count_lines(file: std::fs::File, from: Counted) -> (Counted, usize) {
    let mut counted = from;
    let mut input = BufReader::with_capacity(CHUNK, file);
    if input.seek(SeekFrom::Start(from.offset)).is_err() {
        return (from, 0);
    }
    let mut block = vec![0u8; CHUNK];
    while input.fill_buf().is_ok_and(|left| !left.is_empty()) {
        let mut member = flate2::bufread::GzDecoder::new(&mut input);
        let mut lines = 0;
        let whole = loop {
            match member.read(&mut block) {
                Ok(0) => break true,
                Ok(read) => lines += memchr::memchr_iter(b'\n', &block[..read]).count(),
                Err(_) => break false,
            }
        };
        let Some(offset) = whole.then(|| input.stream_position().ok()).flatten() else {
            return (counted, lines);
        };
        counted = Counted {
            offset,
            lines: counted.lines + lines,
        };
    }
    (counted, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(from: usize, to: usize) -> Vec<u8> {
        (from..to)
            .flat_map(|i| format!("{{\"row\":{i}}}\n").into_bytes())
            .collect()
    }

    #[test]
    fn each_flush_ends_a_member_that_readers_take_one_after_another() {
        let mut out = Members::new(Vec::new());
        out.write_all(&rows(0, 3)).unwrap();
        out.flush().unwrap();
        out.flush().unwrap();
        // Enough rows to pass a chunk on to the file before the member ends.
        out.write_all(&rows(3, 200_000)).unwrap();
        let file = out.finish().unwrap();
        let mut read = Vec::new();
        reader(std::io::Cursor::new(file.clone()))
            .read_to_end(&mut read)
            .unwrap();
        assert_eq!(read, rows(0, 200_000));
        // gzip itself reads it.
        let mut gzip = std::process::Command::new("gzip")
            .arg("-dc")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = gzip.stdin.take().unwrap();
        let writer = std::thread::spawn(move || stdin.write_all(&file).unwrap());
        let output = gzip.wait_with_output().unwrap();
        writer.join().unwrap();
        assert_eq!(output.stdout, rows(0, 200_000));
    }

    #[test]
    fn a_cut_member_is_read_as_far_as_it_goes_and_counted_whole_once_it_is() {
        let scratch = tempfile::tempdir().unwrap();
        let path = scratch.path().join("rows.jsonl.gz");
        let mut out = Members::new(Vec::new());
        out.write_all(&rows(0, 10)).unwrap();
        out.flush().unwrap();
        let first = out.file.len();
        out.write_all(&rows(10, 5000)).unwrap();
        let file = out.finish().unwrap();
        let open = || std::fs::File::open(&path).unwrap();
        // The run stopped in the second member's trailer.
        std::fs::write(&path, &file[..file.len() - 3]).unwrap();
        let mut read = Vec::new();
        reader(open()).read_to_end(&mut read).unwrap();
        assert_eq!(read, rows(0, 5000), "every row of a member cut in its trailer");
        let (counted, growing) = count_lines(open(), Counted::default());
        assert_eq!(
            counted,
            Counted {
                offset: first as u64,
                lines: 10
            }
        );
        assert_eq!(growing, 4990);
        // Whole now: counted from the first member's end on.
        std::fs::write(&path, &file).unwrap();
        let (counted, growing) = count_lines(open(), counted);
        assert_eq!((counted.lines, growing), (5000, 0));
        assert_eq!(counted.offset, file.len() as u64);
        assert_eq!(count_lines(open(), counted), (counted, 0), "nothing new");
        // A garbled file is not rows: its reader says so.
        let mut garbled = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff".to_vec();
        garbled.extend([0xff; 64]);
        std::fs::write(&path, garbled).unwrap();
        assert!(reader(open()).read_to_end(&mut Vec::new()).is_err());
    }
}
