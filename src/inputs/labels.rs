//! Human verdicts on answers (SPEC §10): `[audit] labels`, a CSV file with a header row or JSON
//! Lines, each row a `question_id`, an `answer` and `correct` (true or false); other columns are
//! ignored. A label applies to every answer of the run with that question id and exactly that
//! text, so it stays valid across runs and compressors that gave the same answer.

use std::collections::HashMap;
use std::path::Path;

use crate::error::Problem;

/// The labels of one file.
#[derive(Debug, Clone, Default)]
pub(crate) struct Labels {
    /// The file, as the manifest names it.
    pub file: String,
    /// question id → answer → (correct, the line it is on).
    verdicts: HashMap<String, HashMap<String, (bool, usize)>>,
}

impl Labels {
    fn find(&self, question_id: &str, answer: &str) -> Option<&(bool, usize)> {
        self.verdicts.get(question_id)?.get(answer)
    }

    /// The label of an answer, if it has one.
    pub(crate) fn verdict(&self, question_id: &str, answer: &str) -> Option<bool> {
        self.find(question_id, answer).map(|(correct, _)| *correct)
    }

    pub(crate) fn len(&self) -> usize {
        self.verdicts.values().map(HashMap::len).sum()
    }

    /// The labels no answer among `answers` (question id, answer) matches, as problems naming
    /// their lines.
    pub(crate) fn unmatched<'a>(&self, answers: impl Iterator<Item = (&'a str, &'a str)>) -> Vec<Problem> {
        let matched: std::collections::HashSet<usize> = answers
            .filter_map(|(question, answer)| Some(self.find(question, answer)?.1))
            .collect();
        let mut lines: Vec<(usize, &String)> = (self.verdicts.iter())
            .flat_map(|(question, answers)| answers.values().map(move |(_, line)| (*line, question)))
            .filter(|(line, _)| !matched.contains(line))
            .collect();
        lines.sort();
        lines
            .into_iter()
            .map(|(line, question)| Problem {
                place: format!("{}:{line}", self.file),
                message: format!("the label of question `{question}` matches no answer of this run (the question id and the answer text must both match)"),
            })
            .collect()
    }
}

/// Reads a labels file: `.jsonl`/`.json` as JSON Lines, anything else as CSV. Every problem
/// names the file and line.
pub(crate) fn read(path: &Path, shown: &str) -> Result<Labels, Vec<Problem>> {
    let text = super::read_text(path, shown, "labels").map_err(|problem| vec![problem])?;
    let json = path.extension().is_some_and(|e| e == "jsonl" || e == "json");
    let rows = super::table::rows(&text, shown, !json, &["question_id", "answer", "correct"]);
    let mut labels = Labels {
        file: shown.to_owned(),
        verdicts: HashMap::new(),
    };
    let mut problems = Vec::new();
    let problem = |line: usize, message: String| Problem {
        place: format!("{shown}:{line}"),
        message,
    };
    for row in rows {
        let (line, fields) = match row {
            Ok(row) => row,
            Err(refused) => {
                problems.push(refused);
                continue;
            }
        };
        let field = |name: &str| fields.get(name).map(String::as_str);
        let (Some(question), Some(answer)) = (field("question_id"), field("answer")) else {
            problems.push(problem(line, "expected `question_id` and `answer`".into()));
            continue;
        };
        let correct = match field("correct").map(|c| c.trim().to_ascii_lowercase()) {
            Some(c) if c == "true" => true,
            Some(c) if c == "false" => false,
            other => {
                let got = match other.as_deref() {
                    None | Some("") => "nothing (fill it in)".to_owned(),
                    Some(c) => format!("`{c}`"),
                };
                problems.push(problem(
                    line,
                    format!("`correct` must be true or false, got {got}"),
                ));
                continue;
            }
        };
        if let Some((_, first)) = labels.find(question, answer) {
            problems.push(problem(
                line,
                format!("question `{question}` with this answer is labelled already, on line {first}"),
            ));
            continue;
        }
        (labels.verdicts.entry(question.to_owned()).or_default()).insert(answer.to_owned(), (correct, line));
    }
    if problems.is_empty() {
        Ok(labels)
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(name: &str, text: &str) -> Result<Labels, Vec<Problem>> {
        let folder = std::env::temp_dir().join(format!("gacc-labels-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&folder).unwrap();
        let path = folder.join(name);
        std::fs::write(&path, text).unwrap();
        let read = read(&path, name);
        let _ = std::fs::remove_dir_all(&folder);
        read
    }

    #[test]
    fn labels_read_from_csv_and_json_lines_with_their_lines() {
        let csv = "question_id,answer,correct,note\nq1,\"a, with comma\",true,x\nq2,\"two\nlines\",FALSE,\n";
        let read = labels("l.csv", csv).unwrap();
        assert_eq!(read.verdict("q1", "a, with comma"), Some(true));
        assert_eq!(read.verdict("q2", "two\nlines"), Some(false));
        assert_eq!(read.verdict("q1", "other"), None);
        let unmatched = read.unmatched([("q1", "a, with comma")].into_iter());
        assert_eq!(unmatched.len(), 1);
        assert_eq!(unmatched[0].place, "l.csv:3");
        let jsonl = "{\"question_id\": \"q1\", \"answer\": \"a\", \"correct\": true}\n";
        assert_eq!(labels("l.jsonl", jsonl).unwrap().verdict("q1", "a"), Some(true));
    }

    #[test]
    fn bad_labels_name_their_lines() {
        let csv = "question_id,answer,correct\nq1,a,true\nq1,a,false\nq2,b,maybe\nq3,c\n";
        let problems = labels("bad.csv", csv).unwrap_err();
        let places: Vec<&str> = problems.iter().map(|p| p.place.as_str()).collect();
        assert_eq!(
            places,
            ["bad.csv:3", "bad.csv:4", "bad.csv:5, column `correct`"],
            "{problems:?}"
        );
        assert!(problems[0].message.contains("labelled already, on line 2"));
        assert!(problems[1].message.contains("`maybe`"));
    }

    #[test]
    fn labels_are_read_as_written_or_refused_with_their_lines() {
        // What a spreadsheet writes: CRLF, and the bad row on line 3.
        let crlf = "question_id,answer,correct\r\nq1,a,true\r\nq2,b,maybe\r\n";
        let problems = labels("crlf.csv", crlf).unwrap_err();
        assert_eq!(problems[0].place, "crlf.csv:3", "{problems:?}");
        // A cell too many (an unquoted comma) is refused, not cut.
        let extra = "question_id,answer,correct\nq1,1,000,true\n";
        let problems = labels("extra.csv", extra).unwrap_err();
        assert_eq!(problems[0].place, "extra.csv:2, column 4", "{problems:?}");
        // A header without the columns labels need: said once, not zero labels.
        let bare = "question,answer\nq1,a\n";
        let problems = labels("bare.csv", bare).unwrap_err();
        assert_eq!(
            problems[0].place, "bare.csv:1, column `question_id`",
            "{problems:?}"
        );
        // A byte-order mark before JSON Lines is not part of the first row.
        let bom = "\u{feff}{\"question_id\": \"q1\", \"answer\": \"a\", \"correct\": false}\n";
        assert_eq!(labels("bom.jsonl", bom).unwrap().verdict("q1", "a"), Some(false));
    }
}
