//! A writer's reply from a model (SPEC §16): the JSON object its prompt asks for, read as the
//! op its request named. A reply that holds none, or a malformed one, is a failed call worth
//! another try (a model that samples may answer well the next time), never an empty dataset.

use serde_json::{Value, json};

use super::verdict::json_object;
use crate::protocol::writer::{self, WriterOp};

/// The protocol's response to a writer request of `op` asking for `n` items, made of a model's
/// reply text; or why it holds none.
pub(crate) fn written(text: &str, op: WriterOp, n: usize) -> Result<Value, String> {
    let object = json_object(text)
        .or_else(|| {
            // Prose around the object: the outermost braces.
            let (start, end) = (text.find('{')?, text.rfind('}')?);
            (start < end).then(|| json_object(&text[start..=end])).flatten()
        })
        .ok_or_else(|| format!("the writer's reply holds no JSON object: `{}`", shown(text)))?;
    let read = match op {
        WriterOp::Goals => writer::read_goals(&object, n).map(|goals| json!({"goals": goals})),
        WriterOp::Questions => {
            writer::read_questions(&object, n).map(|questions| json!({"questions": questions}))
        }
    };
    read.map_err(|missing| format!("the writer's reply has no {missing}: `{}`", shown(text)))
}

fn shown(text: &str) -> String {
    text.trim().chars().take(120).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_read_inside_a_fence_or_prose_and_a_malformed_one_is_named() {
        let fenced = "```json\n{\"goals\": [\"plan a trip\", \"learn the fares\", \"a third\"]}\n```";
        assert_eq!(
            written(fenced, WriterOp::Goals, 2).unwrap(),
            json!({"goals": ["plan a trip", "learn the fares"]})
        );
        let prose = "Here you are:\n{\"questions\": [{\"question\": \"Which pier?\", \"reference\": \"pier 3\", \"evidence\": [\"leaves from pier 3\"]}]}\nGood luck.";
        let read = written(prose, WriterOp::Questions, 5).unwrap();
        assert_eq!(read["questions"][0]["evidence"], json!(["leaves from pier 3"]));
        for (bad, op, says) in [
            ("no json here", WriterOp::Goals, "holds no JSON object"),
            ("{\"goals\": [\"a\"]}", WriterOp::Questions, "`questions`"),
            (
                "{\"questions\": [{\"question\": \"Q?\"}]}",
                WriterOp::Questions,
                "reference",
            ),
            ("{\"goals\": [3]}", WriterOp::Goals, "goals[0]"),
            ("{\"goals\": [\"a\"", WriterOp::Goals, "holds no JSON object"),
        ] {
            let error = written(bad, op, 3).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }
}
