//! The requests a built-in serves, read from its stdin: each JSON value parsed from memory, a
//! line at a time, not a byte at a time through a reader (a compressor's request carries its
//! whole source, and a byte-wise parse took longer than the answer).

use std::io::BufRead;

use serde_json::Value;

/// The JSON values on `input`, one after another. A value may span lines (a request written
/// by hand) and one line may hold several; a value cut short by the end of input is an error.
pub(super) struct Requests<R> {
    input: R,
    buffer: Vec<u8>,
    /// Where in `buffer` the next value starts.
    start: usize,
    ended: bool,
}

impl<R: BufRead> Requests<R> {
    pub(super) fn of(input: R) -> Requests<R> {
        Requests {
            input,
            buffer: Vec::new(),
            start: 0,
            ended: false,
        }
    }
}

impl<R: BufRead> Iterator for Requests<R> {
    type Item = Result<Value, serde_json::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let mut values =
                serde_json::Deserializer::from_slice(&self.buffer[self.start..]).into_iter::<Value>();
            match values.next() {
                Some(Ok(value)) => {
                    self.start += values.byte_offset();
                    return Some(Ok(value));
                }
                // Not cut short, or cut short for good: what follows is not read.
                Some(Err(error)) if self.ended || !error.is_eof() => {
                    self.ended = true;
                    self.buffer.clear();
                    self.start = 0;
                    return Some(Err(error));
                }
                None if self.ended => return None,
                // A value not whole yet, or nothing but white space: read on.
                _ => {}
            }
            self.buffer.drain(..self.start);
            self.start = 0;
            if matches!(self.input.read_until(b'\n', &mut self.buffer), Ok(0) | Err(_)) {
                self.ended = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn read(input: &str) -> Vec<Result<Value, String>> {
        let requests = Requests::of(input.as_bytes());
        requests.map(|r| r.map_err(|e| e.to_string())).take(10).collect()
    }

    #[test]
    fn one_value_a_line_as_a_persistent_worker_is_sent() {
        let values = read("{\"a\": 1}\n{\"b\": \"x\\ny\"}\n\n  \n[3]\n");
        assert_eq!(
            values,
            [Ok(json!({"a": 1})), Ok(json!({"b": "x\ny"})), Ok(json!([3]))]
        );
    }

    #[test]
    fn a_value_over_several_lines_or_several_on_one_line_or_none_after_the_last() {
        assert_eq!(read("{\n  \"a\": [1,\n 2]\n}"), [Ok(json!({"a": [1, 2]}))]);
        assert_eq!(
            read("{\"a\": 1} {\"b\": 2}\n"),
            [Ok(json!({"a": 1})), Ok(json!({"b": 2}))]
        );
        assert_eq!(read("{\"a\": 1}"), [Ok(json!({"a": 1}))]);
        assert_eq!(read(""), []);
        assert_eq!(read("\n \n"), []);
    }

    #[test]
    fn a_value_cut_short_or_not_json_is_one_error_and_the_end() {
        let cut = read("{\"a\": 1}\n{\"b\": [1, 2");
        assert_eq!(cut[0], Ok(json!({"a": 1})));
        assert!(cut[1].as_ref().is_err_and(|e| e.contains("EOF")), "{cut:?}");
        assert_eq!(cut.len(), 2);
        let garbage = read("{\"a\": 1}\nnot json\n{\"b\": 2}\n");
        assert_eq!(garbage.len(), 2, "{garbage:?}");
        assert!(garbage[1].is_err());
    }
}
