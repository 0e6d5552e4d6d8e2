//! A tokenizer of the user's own: a program speaking the `tokenizer` role of `gacc/1`
//! (`{"op": "encode", "text": …}` → `{"tokens": […]}`, `{"op": "decode", "tokens": […]}` →
//! `{"text": …}`), called once per request (`oneshot`) or kept running (`persistent`).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin};
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Tokenizer, TokenizerError, TokenizerIdentity};
use crate::parallel::Locked;
use crate::protocol::messages::{self, DecodeRequest, DecodeResponse, EncodeRequest, EncodeResponse};
use crate::protocol::{MAX_RESPONSE_BYTES, Mode};
use serde::Deserialize;

/// An external tokenizer, ready to call.
pub(crate) struct External {
    argv: Vec<String>,
    cwd: PathBuf,
    timeout: Duration,
    mode: Mode,
    /// Passed-through variables (`[tokenizer] env`); their values are never written anywhere.
    env: Vec<(String, String)>,
    identity: TokenizerIdentity,
    /// The running process in persistent mode.
    worker: Mutex<Option<TokenizerProcess>>,
}

/// A started tokenizer process: its stdin, and its stdout's lines arriving on a channel.
struct TokenizerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Result<Vec<u8>, String>>,
    stderr: std::sync::Arc<Mutex<Vec<u8>>>,
    stderr_reader: Option<std::thread::JoinHandle<()>>,
}

/// How long a tokenizer that stopped answering gets to exit, so its status can be reported.
const EXIT_GRACE: Duration = Duration::from_millis(500);

impl TokenizerProcess {
    /// What became of a process that stopped answering: its exit status and last stderr line.
    fn post_mortem(&mut self) -> String {
        let deadline = Instant::now() + EXIT_GRACE;
        let mut status = None;
        while Instant::now() < deadline {
            if let Ok(Some(exited)) = self.child.try_wait() {
                status = Some(exited);
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Let the stderr reader drain what the process wrote before it ended.
        while status.is_some()
            && Instant::now() < deadline
            && !self.stderr_reader.as_ref().is_none_or(|r| r.is_finished())
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        let stderr = self.stderr.locked();
        let last = String::from_utf8_lossy(&stderr);
        let last = last
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim()
            .to_owned();
        let mut out = match status {
            Some(status) => format!("; it ended with {status}"),
            None => String::new(),
        };
        if !last.is_empty() {
            out.push_str(&format!("; stderr: {last}"));
        }
        out
    }
}

impl Drop for TokenizerProcess {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our child's own process group.
        unsafe {
            libc::kill(-(self.child.id() as i32), libc::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl External {
    /// Prepares the tokenizer; its identity is verified by `super::verify`, not here.
    pub(crate) fn new(
        argv: Vec<String>,
        cwd: PathBuf,
        (timeout, mode): (Duration, Mode),
        env: Vec<(String, String)>,
        name: &str,
        revision: &str,
    ) -> External {
        External {
            argv,
            cwd,
            timeout,
            mode,
            env,
            identity: TokenizerIdentity {
                name: name.to_owned(),
                revision: revision.to_owned(),
                builtin: false,
                identity_verified: false,
                vocabulary_sha256: None,
                first_mismatch: None,
                allow_unverified: false,
            },
            worker: Mutex::new(None),
        }
    }

    pub(crate) fn identity_mut(&mut self) -> &mut TokenizerIdentity {
        &mut self.identity
    }

    fn start(&self) -> Result<TokenizerProcess, TokenizerError> {
        let line: Vec<std::ffi::OsString> = self.argv.iter().map(Into::into).collect();
        let mut command = crate::protocol::callback_command(
            &line,
            &self.cwd,
            "tokenizer",
            self.mode,
            self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        );
        let mut child = command
            .spawn()
            .map_err(|error| TokenizerError(format!("could not start `{}`: {error}", self.argv[0])))?;
        let stdout = child.stdout.take();
        let stdin = child.stdin.take();
        let stderr_tail = std::sync::Arc::new(Mutex::new(Vec::new()));
        let stderr_reader = child.stderr.take().map(|mut stderr| {
            let sink = stderr_tail.clone();
            std::thread::spawn(move || {
                let mut buffer = [0u8; 4096];
                while let Ok(n @ 1..) = stderr.read(&mut buffer) {
                    let mut tail = sink.locked();
                    tail.extend_from_slice(&buffer[..n]);
                    let excess = tail.len().saturating_sub(crate::protocol::STDERR_TAIL_BYTES);
                    tail.drain(..excess);
                }
            })
        });
        let (sender, lines) = channel();
        if let Some(stdout) = stdout {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stdout).take(MAX_RESPONSE_BYTES as u64 + 1);
                loop {
                    let mut line = Vec::new();
                    match reader.read_until(b'\n', &mut line) {
                        Ok(0) => {
                            let _ = sender.send(Err("its stdout closed".to_owned()));
                            return;
                        }
                        Ok(_) if line.len() > MAX_RESPONSE_BYTES => {
                            let _ =
                                sender.send(Err(format!("it wrote more than {MAX_RESPONSE_BYTES} bytes")));
                            return;
                        }
                        Ok(_) => {
                            if sender.send(Ok(line)).is_err() {
                                return;
                            }
                        }
                        Err(error) => {
                            let _ = sender.send(Err(error.to_string()));
                            return;
                        }
                    }
                }
            });
        }
        Ok(TokenizerProcess {
            child,
            stdin,
            lines,
            stderr: stderr_tail,
            stderr_reader,
        })
    }

    /// Sends one request and reads one response line, within the timeout; a process that
    /// stopped answering is described by its exit status and stderr.
    fn exchange(&self, process: &mut TokenizerProcess, request: &[u8]) -> Result<Value, TokenizerError> {
        self.exchange_once(process, request)
            .map_err(|TokenizerError(reason)| {
                let post_mortem = if reason.starts_with("no response") || reason.starts_with("could not send")
                {
                    process.post_mortem()
                } else {
                    String::new()
                };
                // What the tokenizer says is shown: never with a passed-through secret in it.
                TokenizerError(crate::secrets::redact(&format!("{reason}{post_mortem}")).into_owned())
            })
    }

    fn exchange_once(&self, process: &mut TokenizerProcess, request: &[u8]) -> Result<Value, TokenizerError> {
        let deadline = Instant::now() + self.timeout;
        let mut line = request.to_vec();
        line.push(b'\n');
        let stdin = process
            .stdin
            .as_mut()
            .ok_or_else(|| TokenizerError("its stdin is closed".into()))?;
        stdin
            .write_all(&line)
            .and_then(|_| stdin.flush())
            .map_err(|error| TokenizerError(format!("could not send the request ({error})")))?;
        if self.mode == Mode::Oneshot {
            process.stdin = None;
        }
        let response = match process
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            Ok(Ok(line)) => line,
            Ok(Err(reason)) => return Err(TokenizerError(format!("no response: {reason}"))),
            Err(RecvTimeoutError::Timeout) => {
                return Err(TokenizerError(format!("timed out after {:?}", self.timeout)));
            }
            Err(RecvTimeoutError::Disconnected) => return Err(TokenizerError("no response".into())),
        };
        let text =
            std::str::from_utf8(&response).map_err(|_| TokenizerError("stdout is not UTF-8".into()))?;
        let value: Value = serde_json::from_str(text.trim())
            .map_err(|error| TokenizerError(format!("response is not one JSON object: {error}")))?;
        if let Some(error) = value.get("error") {
            return Err(TokenizerError(format!("it reported an error: {error}")));
        }
        Ok(value)
    }

    fn call(&self, request: &[u8]) -> Result<Value, TokenizerError> {
        match self.mode {
            Mode::Oneshot => {
                let mut process = self.start()?;
                self.exchange(&mut process, request)
            }
            Mode::Persistent => {
                let mut worker = self.worker.locked();
                // A worker that died is started again, once, for the same request.
                for attempt in 0..2 {
                    if worker.is_none() {
                        *worker = Some(self.start()?);
                    }
                    let Some(process) = worker.as_mut() else { continue };
                    match self.exchange(process, request) {
                        Ok(value) => return Ok(value),
                        Err(error) => {
                            *worker = None;
                            let died =
                                error.0.starts_with("no response") || error.0.starts_with("could not send");
                            if attempt == 1 || !died {
                                return Err(error);
                            }
                        }
                    }
                }
                Err(TokenizerError("no response".into()))
            }
        }
    }
}

impl Tokenizer for External {
    fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let response = self.call(&messages::to_bytes(&EncodeRequest::new(text)))?;
        EncodeResponse::deserialize(&response)
            .map(|r| r.tokens)
            .map_err(|_| TokenizerError("the encode response has no `tokens` list of token ids".into()))
    }

    fn decode_bytes(&self, tokens: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        let response = self.call(&messages::to_bytes(&DecodeRequest::new(tokens)))?;
        messages::read::<DecodeResponse>(&response)
            .map(|r| r.text.as_bytes().to_vec())
            .ok_or_else(|| TokenizerError("the decode response has no `text` string".into()))
    }

    fn identity(&self) -> &TokenizerIdentity {
        &self.identity
    }
}
