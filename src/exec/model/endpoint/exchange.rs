//! One HTTP exchange with an endpoint, and what its reply means: the reply read (within a size),
//! its status classed by the provider, its `Retry-After`; the HTTP client; and the key scrubbed
//! from every message.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::Value;

use crate::parallel::Locked;
use crate::providers::{self, Announced, Class, Reply};

use super::{Endpoint, MAX_REPLY_BYTES};

impl Endpoint {
    pub(super) async fn exchange(&self, body: &Value) -> Exchange {
        let request = self
            .spec
            .api
            .provider()
            .request(self.base(), &self.spec.model, body);
        let response = match self.http(request).send().await {
            Ok(response) => response,
            Err(error) => {
                let why = if error.is_timeout() {
                    format!(
                        "no reply within {:?} (`models.{}.timeout`)",
                        self.spec.timeout.0, self.name
                    )
                } else if error.is_connect() {
                    let why = without_url(&error);
                    return Exchange::Unreachable(format!(
                        "could not connect to {}: {why}",
                        self.spec.base_url
                    ));
                } else {
                    format!("the connection failed: {}", without_url(&error))
                };
                return Exchange::Transient {
                    wait: None,
                    status: None,
                    why,
                };
            }
        };
        self.answered.store(true, Ordering::Relaxed);
        *self.unreachable_since.locked() = None;
        let status = response.status().as_u16();
        let announced = self.announced(response.headers());
        let wait = retry_after(response.headers(), &announced);
        let headers = response.headers().clone();
        let text = match read_limited(response).await {
            Ok(text) => text,
            Err(why) => {
                return Exchange::Transient {
                    wait,
                    status: Some(status),
                    why,
                };
            }
        };
        let message = || providers::error_message(&text);
        if (300..=399).contains(&status) {
            // Every later call would be sent to the same place.
            return Exchange::Rejected {
                status,
                message: refusal(status, &headers, &text),
            };
        }
        match self.spec.api.provider().class(status, &text) {
            Class::Answered => match serde_json::from_str::<Value>(&text) {
                Ok(value) => match self.spec.api.provider().reply(&value) {
                    Ok(reply) => Exchange::Answered(reply, announced),
                    Err(why) => Exchange::Transient {
                        wait: None,
                        status: Some(status),
                        why: format!("an unreadable reply: {why}"),
                    },
                },
                Err(error) => Exchange::Transient {
                    wait: None,
                    status: Some(status),
                    why: format!("a reply that is not JSON ({error})"),
                },
            },
            Class::RateLimited => Exchange::RateLimited {
                wait,
                message: message(),
                announced,
            },
            Class::Transient => Exchange::Transient {
                wait,
                status: Some(status),
                why: format!("{status}: {}", message()),
            },
            Class::Rejected => Exchange::Rejected {
                status,
                message: message(),
            },
            Class::Refused => Exchange::Refused {
                status,
                message: message(),
            },
        }
    }
}

pub(super) enum Exchange {
    Answered(Reply, Announced),
    RateLimited {
        wait: Option<Duration>,
        message: String,
        announced: Announced,
    },
    /// A failure worth another attempt; `status` is the HTTP status where one came back.
    Transient {
        wait: Option<Duration>,
        status: Option<u16>,
        why: String,
    },
    /// No connection: refused, a name that does not resolve, a failed TLS handshake.
    Unreachable(String),
    Rejected {
        status: u16,
        message: String,
    },
    Refused {
        status: u16,
        message: String,
    },
}

/// The HTTP client of every model and batch call: no redirect is followed (a 3xx is a failed
/// call naming where it pointed: a POST turned into a GET would go to a server gacc was not
/// told of, without its key, and its answer would be paid for and cached).
pub(crate) fn http_client(timeout: Duration) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(30)))
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("gacc/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|error| format!("cannot make an HTTP client: {error}"))
}

/// What a reply that is not a success says: its status and the provider's message, or for a
/// redirect, where it pointed.
pub(in crate::exec::model) fn refusal(
    status: u16,
    headers: &reqwest::header::HeaderMap,
    text: &str,
) -> String {
    if (300..400).contains(&status) {
        let location = headers
            .get(reqwest::header::LOCATION)
            .map_or("nowhere".into(), |l| {
                String::from_utf8_lossy(l.as_bytes()).into_owned()
            });
        return format!(
            "{status}: a redirect to {location}, which gacc does not follow (set base_url to the server that answers)"
        );
    }
    format!("{status}: {}", providers::error_message(text))
}

/// A transport error's words without its URL (which holds nothing secret, but is noise).
pub(in crate::exec::model) fn without_url(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    if let Some(url) = error.url() {
        // "error sending request for url (…)": the address goes (the endpoint's name says
        // where), and no empty "()" is left behind.
        text = text
            .replace(&format!(" for url ({})", url.as_str()), "")
            .replace(url.as_str(), "");
    }
    let mut source = std::error::Error::source(error);
    while let Some(inner) = source {
        text.push_str(&format!(": {inner}"));
        source = inner.source();
    }
    text
}

pub(super) async fn read_limited(mut response: reqwest::Response) -> Result<String, String> {
    let mut bytes = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if bytes.len() + chunk.len() > MAX_REPLY_BYTES {
                    return Err(format!("a reply over {MAX_REPLY_BYTES} bytes"));
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(error) => return Err(format!("the reply broke off: {}", without_url(&error))),
        }
    }
    String::from_utf8(bytes).map_err(|_| "a reply that is not UTF-8".into())
}

/// `retry-after-ms`, `Retry-After` (seconds), or when the limits the reply announced are
/// full again (OpenAI's reset headers: `1s`, `6m0s`, `20ms`).
pub(in crate::exec::model) fn retry_after(
    headers: &reqwest::header::HeaderMap,
    announced: &Announced,
) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    // Whatever a server sends, a wait is a finite number of seconds within an hour.
    let number = |text: &str| text.parse::<f64>().ok().filter(|n| n.is_finite());
    if let Some(ms) = header("retry-after-ms").and_then(number) {
        return Some(Duration::from_secs_f64(ms.clamp(0.0, 3.6e6) / 1000.0));
    }
    if let Some(seconds) = header("retry-after").and_then(number) {
        return Some(Duration::from_secs_f64(seconds.clamp(0.0, 3600.0)));
    }
    [announced.requests, announced.tokens]
        .iter()
        .flatten()
        .map(|allowance| allowance.reset)
        .max()
}

/// No part of the key reaches a message: a word sharing `SHARED` or more characters in a row
/// with it, or shaped like a key (`sk-…`, masked `…****…`), is replaced. (Four characters
/// caught URLs whose port shared four digits with a key.)
pub(in crate::exec::model) fn scrub(text: &str, key: Option<&str>) -> String {
    const SHARED: usize = crate::secrets::MIN_SECRET;
    let shares = |word: &str| {
        key.is_some_and(|key| {
            let chars: Vec<char> = word.chars().collect();
            chars.len() >= SHARED
                && chars
                    .windows(SHARED)
                    .any(|w| key.contains(&w.iter().collect::<String>()))
        })
    };
    text.split_inclusive(|c: char| c.is_whitespace() || c == '"' || c == '\'' || c == ',')
        .map(|piece| {
            let word =
                piece.trim_end_matches(|c: char| c.is_whitespace() || c == '"' || c == '\'' || c == ',');
            let tail = &piece[word.len()..];
            if word.starts_with("sk-") || word.contains("****") || shares(word) {
                format!("[redacted]{tail}")
            } else {
                piece.to_owned()
            }
        })
        .collect()
}
