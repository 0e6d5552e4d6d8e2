//! A provider's batch API over HTTP: the requests its `Batches` describes, sent with the
//! endpoint's key, and what comes back read as it says.

use std::collections::HashMap;

use serde_json::Value;

use super::{BatchResults, Queued, Record};
use crate::exec::model::{Endpoint, refusal, scrub, without_url};
use crate::providers::{Http, Lost, NewBatch, Refusal};

async fn send_json(endpoint: &Endpoint, request: reqwest::RequestBuilder) -> Result<Value, Refusal> {
    let response = request
        .send()
        .await
        .map_err(|error| (without_url(&error), true))?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response
        .text()
        .await
        .map_err(|error| (without_url(&error), true))?;
    if !(200..300).contains(&status) {
        let message = refusal(status, &headers, &text);
        let retryable = status == 429 || status >= 500;
        return Err((scrub(&message, endpoint.key.as_deref()), retryable));
    }
    serde_json::from_str(&text).map_err(|error| (format!("a reply that is not JSON ({error})"), true))
}

/// Submits a batch; its provider id.
pub(super) async fn create(
    endpoint: &Endpoint,
    record: &Record,
    requests: &[Queued],
) -> Result<String, Refusal> {
    let base = endpoint.base();
    let batches = endpoint.spec.api.provider().batches();
    let window = endpoint
        .batcher
        .get()
        .map_or("24h".to_owned(), |b| b.spec.window.clone());
    let batch = NewBatch {
        requests: requests.iter().map(|r| (r.key.as_str(), &r.body)).collect(),
        local: &record.local,
        submission: &record.submission,
        window: &window,
    };
    let uploaded = match batches.upload(base, &batch) {
        Some(upload) => Some(send_json(endpoint, endpoint.http(upload)).await?),
        None => None,
    };
    let create = batches
        .create(base, &batch, uploaded.as_ref())
        .map_err(|message| (message, false))?;
    let reply = send_json(endpoint, endpoint.http(create)).await?;
    batches
        .id(&reply)
        .ok_or(("the batch's reply has no id".to_owned(), false))
}

/// A batch's state: None while it runs, its results once it ended.
pub(super) async fn poll(endpoint: &Endpoint, record: &Record) -> Result<Option<BatchResults>, String> {
    let base = endpoint.base();
    let batches = endpoint.spec.api.provider().batches();
    let id = record.batch_id.as_deref().unwrap_or_default();
    let state = get_json(endpoint, &batches.state_url(base, id)).await?;
    let Some(ended) = batches.ended(base, id, &state) else {
        return Ok(None);
    };
    let mut results = HashMap::new();
    for url in &ended.results {
        let text = fetch_text(endpoint, url).await?;
        results.extend(batches.result_lines(&text));
    }
    Ok(Some(BatchResults {
        status: ended.status,
        results,
    }))
}

/// A JSON document the provider serves at `url` (authorised), or why not.
async fn get_json(endpoint: &Endpoint, url: &str) -> Result<Value, String> {
    send_json(endpoint, endpoint.http(Http::get(url.to_owned())))
        .await
        .map_err(|(message, _)| message)
}

async fn fetch_text(endpoint: &Endpoint, url: &str) -> Result<String, String> {
    let response = endpoint
        .http(Http::get(url.to_owned()))
        .send()
        .await
        .map_err(|error| without_url(&error))?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.map_err(|error| without_url(&error))?;
    if (200..300).contains(&status) {
        Ok(text)
    } else {
        Err(scrub(&refusal(status, &headers, &text), endpoint.key.as_deref()))
    }
}

/// The provider id of a batch recorded as `submitting`, found among the account's recent
/// batches as its provider can tell it.
pub(super) async fn find_lost(endpoint: &Endpoint, record: &Record) -> Option<String> {
    let batches = endpoint.spec.api.provider().batches();
    let list = get_json(endpoint, &batches.list_url(endpoint.base()))
        .await
        .ok()?;
    let lost = Lost {
        submission: &record.submission,
        requests: record.keys.len(),
        created: &record.created,
    };
    batches
        .listed(&list)
        .into_iter()
        .filter(|batch| batches.is_lost(batch, &lost))
        .find_map(|batch| batches.id(batch))
}

/// Cancels a recorded batch at its provider (`gacc batches cancel`).
pub(crate) async fn cancel(record: &Record, client: &reqwest::Client) -> Result<(), String> {
    let key = match &record.api_key_env {
        Some(variable) => Some(std::env::var(variable).map_err(|_| format!("`{variable}` is not set"))?),
        None => None,
    };
    let base = record.base_url.trim_end_matches('/');
    let id = record
        .batch_id
        .as_deref()
        .ok_or("the batch has no provider id yet")?;
    let provider = record.api.provider();
    // A POST with no body: signed as the provider signs, sent by hand.
    let mut signed = Http::get(provider.batches().cancel_url(base, id));
    provider.sign(&mut signed, key.as_deref());
    let mut request = client.post(signed.url);
    for (name, value) in signed.headers {
        request = request.header(name, value);
    }
    let response = request.send().await.map_err(|error| without_url(&error))?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap_or_default();
    if (200..300).contains(&status) {
        Ok(())
    } else {
        Err(scrub(&refusal(status, &headers, &text), key.as_deref()))
    }
}
