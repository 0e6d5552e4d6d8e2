//! Built-in callbacks, served over the same protocol as any other (`gacc callback NAME`).

use std::fmt;
use std::io::{Read, Write};

use serde_json::{Value, json};

/// The roles a callback can play (SPEC §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    Compressor,
    Reader,
    Judge,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Compressor => "compressor",
            Role::Reader => "reader",
            Role::Judge => "judge",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A built-in callback: its name, role, and behaviour version (part of its cache identity).
struct Builtin {
    name: &'static str,
    role: Role,
    revision: &'static str,
    respond: fn(&Value) -> Result<Value, String>,
}

const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "identity",
        role: Role::Compressor,
        revision: "1",
        respond: identity,
    },
    Builtin {
        name: "goal-line",
        role: Role::Compressor,
        revision: "1",
        respond: goal_line,
    },
    Builtin {
        name: "field-lookup",
        role: Role::Reader,
        revision: "1",
        respond: field_lookup,
    },
    Builtin {
        name: "exact",
        role: Role::Judge,
        revision: "1",
        respond: exact,
    },
];

/// The built-in callbacks that can play `role`.
pub fn names(role: Role) -> Vec<&'static str> {
    BUILTINS
        .iter()
        .filter(|b| b.role == role)
        .map(|b| b.name)
        .collect()
}

/// The behaviour version of a built-in, bound into its cache keys.
pub fn revision(name: &str) -> Option<&'static str> {
    BUILTINS.iter().find(|b| b.name == name).map(|b| b.revision)
}

/// Serves one request from stdin to stdout; returns the process exit status.
pub fn serve(name: &str) -> i32 {
    let Some(builtin) = BUILTINS.iter().find(|b| b.name == name) else {
        let all: Vec<_> = BUILTINS.iter().map(|b| b.name).collect();
        eprintln!(
            "gacc callback: unknown built-in `{name}`: expected one of {}",
            all.join(", ")
        );
        return 2;
    };
    let mut input = String::new();
    let response = match std::io::stdin().read_to_string(&mut input) {
        Err(error) => Err(format!("cannot read the request: {error}")),
        Ok(_) => serde_json::from_str::<Value>(&input)
            .map_err(|error| format!("the request is not JSON: {error}"))
            .and_then(|request| (builtin.respond)(&request)),
    };
    let (response, status) = match response {
        Ok(response) => (response, 0),
        Err(message) => {
            eprintln!("{name}: {message}");
            (json!({"error": message, "retryable": false}), 1)
        }
    };
    let mut stdout = std::io::stdout().lock();
    if writeln!(stdout, "{response}")
        .and_then(|_| stdout.flush())
        .is_err()
    {
        return 1;
    }
    status
}

fn field<'a>(request: &'a Value, name: &str) -> Result<&'a str, String> {
    request
        .get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("the request has no string field `{name}`"))
}

/// The full context: the baseline that truncation alone compresses.
fn identity(request: &Value) -> Result<Value, String> {
    Ok(json!({"memory": field(request, "context")?}))
}

/// The goal's keyword: its last word, lowercased, letters and digits only.
fn keyword(goal: &str) -> Option<String> {
    goal.split(|c: char| !c.is_alphanumeric())
        .rfind(|word| !word.is_empty())
        .map(str::to_lowercase)
}

fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

/// The source lines that contain the goal's keyword as a word; with no goal, the whole source.
fn goal_line(request: &Value) -> Result<Value, String> {
    let context = field(request, "context")?;
    let goal = match request.get("goal") {
        Some(Value::String(goal)) => goal.as_str(),
        Some(Value::Null) | None => return Ok(json!({"memory": context})),
        Some(_) => return Err("`goal` must be a string or null".into()),
    };
    let Some(keyword) = keyword(goal) else {
        return Ok(json!({"memory": ""}));
    };
    let lines: Vec<&str> = context
        .lines()
        .filter(|line| words(line).any(|w| w == keyword))
        .collect();
    Ok(json!({"memory": lines.join("\n")}))
}

/// Answers with the value of the first `field=value` pair in the memory whose field the
/// question names as a word; an empty answer when there is none.
fn field_lookup(request: &Value) -> Result<Value, String> {
    let memory = field(request, "memory")?;
    let question: Vec<String> = words(field(request, "question")?).collect();
    let answer = memory
        .split_whitespace()
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, value)| !value.is_empty() && question.contains(&name.to_lowercase()))
        .map(|(_, value)| value.trim_end_matches([',', ';', '.']))
        .unwrap_or("");
    Ok(json!({"answer": answer}))
}

/// Correct when the answer equals the reference, ignoring surrounding white space.
fn exact(request: &Value) -> Result<Value, String> {
    let answer = field(request, "answer")?;
    let reference = field(request, "reference")?;
    Ok(json!({"correct": answer.trim() == reference.trim()}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goal_line_keeps_lines_with_the_keyword() {
        let request =
            json!({"context": "intro\nreactor: temp=1 status=ok\npump: flow=2", "goal": "Check the reactor"});
        assert_eq!(
            goal_line(&request).unwrap(),
            json!({"memory": "reactor: temp=1 status=ok"})
        );
        let request = json!({"context": "a\nb", "goal": null});
        assert_eq!(goal_line(&request).unwrap(), json!({"memory": "a\nb"}));
    }

    #[test]
    fn field_lookup_answers_only_from_the_memory() {
        let request = json!({"memory": "reactor: temp=451, status=ok", "question": "What is the temp?"});
        assert_eq!(field_lookup(&request).unwrap(), json!({"answer": "451"}));
        let request = json!({"memory": "reactor: temp=451", "question": "What is the status?"});
        assert_eq!(field_lookup(&request).unwrap(), json!({"answer": ""}));
    }

    #[test]
    fn exact_ignores_only_surrounding_space() {
        let check = |answer, reference| {
            exact(&json!({"answer": answer, "reference": reference})).unwrap()["correct"].clone()
        };
        assert_eq!(check("451\n", "451"), json!(true));
        assert_eq!(check("451", "45"), json!(false));
        assert_eq!(check("Ok", "ok"), json!(false));
    }
}
