//! Rule built-ins answered by gacc itself. Each is a pure function of the request (SPEC §3), so
//! a call needs no process: it is given the request's bytes and nothing else, so the hold-out
//! holds by construction, and it costs microseconds where a process costs milliseconds.
//! `gacc callback NAME` serves the same functions as a program.

use crate::builtin::{self, Respond};
use crate::exec::callback::{
    Attempt, AttemptFuture, Callback, FailureKind, Launcher, check_response, parse_response, reported_error,
};
use crate::protocol::Role;

/// The launcher of one rule built-in.
#[derive(Debug)]
pub(crate) struct InProcess {
    name: &'static str,
    respond: Respond,
}

impl InProcess {
    /// The rule built-in `name`; None for a built-in that runs only as a program (`bench-*`).
    pub(crate) fn of(name: &str) -> Option<Self> {
        let (name, respond) = builtin::in_process(name)?;
        Some(InProcess { name, respond })
    }
}

impl Launcher for InProcess {
    fn answers_at_once(&self) -> bool {
        true
    }

    fn attempt<'a>(&'a self, callback: &'a Callback, _key: &'a str, request: &'a [u8]) -> AttemptFuture<'a> {
        let (name, respond, role) = (self.name, self.respond, callback.role);
        let request = request.to_vec();
        Box::pin(async move {
            // A ranking over a long source is real work: it runs beside the runtime's threads.
            let answered = tokio::task::spawn_blocking(move || answer(name, respond, role, &request));
            answered.await.unwrap_or_else(|error| Attempt {
                result: Err(FailureKind::Reported {
                    message: format!("the built-in `{name}` failed: {error}"),
                    retryable: false,
                }),
                stderr_tail: String::new(),
                stderr_of_worker: false,
            })
        })
    }
}

/// One request answered as `gacc callback NAME` answers it, and read back as a process's
/// stdout is: the same bytes, so the same response, down to a float's last digit.
fn answer(name: &str, respond: Respond, role: Role, request: &[u8]) -> Attempt {
    let answered = respond.answer_bytes(request);
    let (response, complaint) = builtin::reply(name, answered);
    let status = if complaint.is_some() { 1 } else { 0 };
    let stdout = response.to_string();
    let result = parse_response(stdout.as_bytes()).and_then(|response| {
        if let Some(error) = reported_error(&response, status) {
            return Err(error);
        }
        check_response(role, &response)?;
        Ok(response)
    });
    Attempt {
        result,
        stderr_tail: complaint.map(|line| line + "\n").unwrap_or_default(),
        stderr_of_worker: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn answered(name: &str, role: Role, request: Value) -> Attempt {
        let respond = InProcess::of(name).map(|b| b.respond).expect("a rule built-in");
        answer(name, respond, role, request.to_string().as_bytes())
    }

    #[test]
    fn a_rule_built_in_answers_as_its_program_would() {
        let request = json!({"protocol": "gacc/1", "role": "judge", "question": "q",
            "reference": "Paris", "answer": " paris. ", "source": "s", "params": {}});
        let attempt = answered("normalized", Role::Judge, request.clone());
        assert_eq!(attempt.result.expect("a verdict")["correct"], json!(true));
        let exact = answered("exact", Role::Judge, request);
        assert_eq!(exact.result.expect("a verdict")["correct"], json!(false));
    }

    #[test]
    fn a_bad_request_is_the_built_in_s_reported_error() {
        let attempt = answered("goal-line", Role::Compressor, json!({"role": "compressor"}));
        match attempt.result {
            Err(FailureKind::Reported { message, retryable }) => {
                assert!(message.contains("context"), "{message}");
                assert!(!retryable);
            }
            other => panic!("{other:?}"),
        }
        assert!(
            attempt.stderr_tail.starts_with("goal-line: "),
            "{}",
            attempt.stderr_tail
        );
    }

    #[test]
    fn programs_stay_programs() {
        assert!(InProcess::of("bench-batch-reader").is_none());
        assert!(InProcess::of("no-such").is_none());
        assert!(InProcess::of("token-f1").is_some());
    }
}
