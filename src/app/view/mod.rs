//! `gacc view [DIR]` (SPEC §12): a local, read-only web app over the runs and packs under a
//! folder — the runs list, a run's page and its full report, a cell's questions, a question's
//! drill-down, two runs compared, and a live page for a run in flight.
//!
//! It binds to 127.0.0.1 unless told otherwise and answers only GET. Every run is named by
//! its path inside the folder and checked to stay there (`site`); a request's Host must name
//! the address served (so a page of another site cannot read it through a rebound name). On any
//! other address it serves only requests that carry its token (`?token=`, then a cookie), since
//! the runs' questions, references and answers are then on the network. Every answer carries a
//! Content-Security-Policy: a page runs only the scripts gacc wrote into it.

mod drill;
mod live;
mod pages;
mod site;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;

use super::Ended;
use crate::error::{Error, runtime_error};
use crate::report::html::{Packing, escape_html, render};
use crate::store::run_folder::{REPORT_HTML, REPORT_JSON};
use site::Site;

/// Where `gacc view` listens.
#[derive(Debug, Clone)]
pub struct Address {
    pub host: String,
    pub port: u16,
    /// The token a request must carry; on an address other than loopback, one is made when
    /// none is given.
    pub token: Option<String>,
}

/// What every answer of the view allows a page to do: its own inline scripts and styles,
/// images from itself or inlined, requests to itself; nothing framed, no form elsewhere.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The cookie that carries the token after the first visit.
const TOKEN_COOKIE: &str = "gacc_view_token";

type Params = Query<HashMap<String, String>>;

/// Serves the folder until Ctrl-C; prints the address first.
pub fn view(dir: &Path, address: &Address, cache: &Path) -> Result<Ended, Error> {
    let site = Arc::new(Site::new(dir, cache)?);
    let runtime = crate::parallel::runtime(None).map_err(runtime_error)?;
    runtime.block_on(async {
        let bind = (address.host.as_str(), address.port);
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .map_err(|error| Error::Io {
                path: dir.to_path_buf(),
                message: format!("cannot listen on {}:{}: {error}", address.host, address.port),
            })?;
        let bound = listener.local_addr().map_err(|error| Error::Io {
            path: dir.to_path_buf(),
            message: format!("cannot listen: {error}"),
        })?;
        let token = match (&address.token, bound.ip().is_loopback()) {
            (Some(token), _) => Some(token.clone()),
            (None, true) => None,
            (None, false) => Some(new_token(dir)?),
        };
        if !bound.ip().is_loopback() {
            eprintln!(
                "warning: gacc view listens on {bound}: every run under {} (its questions, references and answers) is visible to anyone on the network who has the token",
                site.root.display()
            );
        }
        let shown = match &token {
            Some(token) => format!("http://{bound}/?token={token}"),
            None => format!("http://{bound}/"),
        };
        println!(
            "gacc view: serving {} at {shown} (Ctrl-C stops)",
            site.root.display()
        );
        let _ = std::io::Write::flush(&mut std::io::stdout());
        let app = router(site, bound, token);
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .map_err(|error| Error::Io {
                path: dir.to_path_buf(),
                message: format!("the server stopped: {error}"),
            })
    })?;
    Ok(Ended::Success)
}

/// 128 random bits, as hex, from the system's source.
fn new_token(dir: &Path) -> Result<String, Error> {
    let mut bytes = [0u8; 16];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").map_err(crate::error::io(Path::new("/dev/urandom")))?,
        &mut bytes,
    )
    .map_err(|error| Error::Io {
        path: dir.to_path_buf(),
        message: format!("cannot make a token for the view: {error}"),
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn router(site: Arc<Site>, bound: SocketAddr, token: Option<String>) -> Router {
    let hosts: Arc<Vec<String>> = Arc::new(allowed_hosts(bound));
    let token: Arc<Option<String>> = Arc::new(token);
    Router::new()
        .route("/", get(list))
        .route("/run", get(run))
        .route("/report", get(report))
        .route("/cell", get(cell))
        .route("/question", get(question))
        .route("/compare", get(compare))
        .route("/live", get(live_page))
        .route("/live.json", get(live_json))
        .fallback(|| async { not_found() })
        .with_state(site)
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            let (hosts, token) = (hosts.clone(), token.clone());
            async move { guard(&hosts, token.as_deref(), request, next).await }
        }))
}

/// The Host values a request may carry: the address served, and `localhost` for a loopback one.
fn allowed_hosts(bound: SocketAddr) -> Vec<String> {
    let port = bound.port();
    let mut hosts = vec![bound.to_string()];
    if bound.ip().is_loopback() {
        hosts.push(format!("localhost:{port}"));
        hosts.push(format!("127.0.0.1:{port}"));
    }
    hosts
}

/// Refuses a request for another host, or without the token where there is one; marks every
/// answer as not to be sniffed, framed or scripted from elsewhere.
async fn guard(hosts: &[String], token: Option<&str>, request: Request, next: Next) -> Response {
    let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok());
    let unspecified = hosts
        .first()
        .is_some_and(|h| h.starts_with("0.0.0.0") || h.starts_with("[::]"));
    let mut response = if !unspecified && !host.is_some_and(|h| hosts.iter().any(|allowed| allowed == h)) {
        (StatusCode::MISDIRECTED_REQUEST, "gacc view: not this host\n").into_response()
    } else {
        match token.map(|token| (token, carried_token(&request))) {
            None => next.run(request).await,
            Some((token, Some((given, from_query)))) if same(token, &given) => {
                let mut response = next.run(request).await;
                if from_query {
                    let cookie = format!("{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict");
                    if let Ok(value) = HeaderValue::from_str(&cookie) {
                        response.headers_mut().insert(header::SET_COOKIE, value);
                    }
                }
                response
            }
            Some(_) => (
                StatusCode::UNAUTHORIZED,
                "gacc view: this address needs the token `gacc view` printed (open the address it printed)\n",
            )
                .into_response(),
        }
    };
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The token a request carries, and whether in its query (`?token=`) rather than its cookie.
fn carried_token(request: &Request) -> Option<(String, bool)> {
    let query = request.uri().query().unwrap_or("");
    let in_query = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("token="))
        .map(|token| (token.to_owned(), true));
    let in_cookie = || {
        let cookies = request.headers().get_all(header::COOKIE);
        cookies
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(';'))
            .find_map(|pair| pair.trim().strip_prefix(TOKEN_COOKIE)?.strip_prefix('='))
            .map(|token| (token.to_owned(), false))
    };
    in_query.or_else(in_cookie)
}

/// Whether two tokens are equal, in time that does not depend on where they differ.
fn same(expected: &str, given: &str) -> bool {
    expected.len() == given.len()
        && expected
            .bytes()
            .zip(given.bytes())
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
}

fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Html(pages::page("Not found", "<p>Nothing here.</p>")),
    )
        .into_response()
}

fn failed(error: &Error) -> Response {
    let body = format!("<p>{}</p>", escape_html(&error.to_string()));
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Html(pages::page("Cannot show this", &body)),
    )
        .into_response()
}

/// Runs `work` off the runtime's threads (it reads files); a panic is a 500.
async fn blocking(work: impl FnOnce() -> Response + Send + 'static) -> Response {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|_| {
        (StatusCode::INTERNAL_SERVER_ERROR, "gacc view: the page failed\n").into_response()
    })
}

async fn list(State(site): State<Arc<Site>>) -> Response {
    blocking(move || Html(pages::runs(&site.runs(), &site.packs())).into_response()).await
}

async fn run(State(site): State<Arc<Site>>, Query(params): Params) -> Response {
    blocking(move || {
        let id = params.get("run").map(String::as_str).unwrap_or_default();
        let Some(folder) = site.run(id) else {
            return not_found();
        };
        if !folder.file(REPORT_JSON).is_file() {
            return Redirect::to(&format!("/live?run={}", pages::query(id))).into_response();
        }
        match site.load(&folder) {
            Ok(loaded) => Html(pages::run(id, &loaded, &site.runs())).into_response(),
            Err(error) => failed(&error),
        }
    })
    .await
}

async fn report(State(site): State<Arc<Site>>, Query(params): Params) -> Response {
    blocking(move || {
        let Some(folder) = params.get("run").and_then(|id| site.run(id)) else {
            return not_found();
        };
        let page = match std::fs::read_to_string(folder.file(REPORT_HTML)) {
            Ok(page) => Ok(page),
            Err(_) => render(folder.path(), Packing::Auto),
        };
        match page {
            Ok(page) => Html(crate::secrets::redact(&page).into_owned()).into_response(),
            Err(error) => failed(&error),
        }
    })
    .await
}

async fn cell(State(site): State<Arc<Site>>, Query(params): Params) -> Response {
    numbered(site, params, "cell", pages::cell).await
}

async fn question(State(site): State<Arc<Site>>, Query(params): Params) -> Response {
    numbered(site, params, "row", drill::question).await
}

/// A page of a run's numbered part (`?run=ID&{part}=N`); not found when the run or the
/// part is not.
async fn numbered(
    site: Arc<Site>,
    params: HashMap<String, String>,
    part: &'static str,
    render: fn(&str, &site::Loaded, usize) -> Option<String>,
) -> Response {
    blocking(move || {
        let id = params.get("run").map(String::as_str).unwrap_or_default();
        let index = params.get(part).and_then(|n| n.parse::<usize>().ok());
        let (Some(folder), Some(index)) = (site.run(id), index) else {
            return not_found();
        };
        match site.load(&folder) {
            Ok(loaded) => render(id, &loaded, index).map_or_else(not_found, |p| Html(p).into_response()),
            Err(error) => failed(&error),
        }
    })
    .await
}

async fn compare(State(site): State<Arc<Site>>, Query(params): Params) -> Response {
    blocking(move || {
        let (a, b) = (params.get("a"), params.get("b"));
        let (Some(a), Some(b)) = (a, b) else {
            return not_found();
        };
        let (Some(run_a), Some(run_b)) = (site.run(a), site.run(b)) else {
            return not_found();
        };
        match crate::review::diff::diff(run_a.path(), run_b.path()) {
            Ok(diff) => Html(pages::compare(&diff, (a, b))).into_response(),
            Err(error) => failed(&error),
        }
    })
    .await
}

async fn live_page(State(site): State<Arc<Site>>, Query(params): Params) -> Response {
    blocking(move || {
        let id = params.get("run").map(String::as_str).unwrap_or_default();
        match site.run(id) {
            Some(folder) => Html(live::page_of(id, &live::now(&site, &folder))).into_response(),
            None => not_found(),
        }
    })
    .await
}

/// The longest `/live.json?after=N` waits for the run to move from N.
const LONGEST_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The run as it is now; with `after=N`, once its `done` is no longer N (or it finished, or
/// `LONGEST_WAIT` passed), so the live page sees each change as it comes without a busy poll.
async fn live_json(State(site): State<Arc<Site>>, Query(params): Params) -> Response {
    let id = params.get("run").cloned().unwrap_or_default();
    let after = params.get("after").and_then(|n| n.parse::<usize>().ok());
    let Some(folder) = site.run(&id) else {
        return not_found();
    };
    let started = std::time::Instant::now();
    let live = loop {
        let (site, folder) = (site.clone(), folder.clone());
        let Ok(live) = tokio::task::spawn_blocking(move || live::now(&site, &folder)).await else {
            return (StatusCode::INTERNAL_SERVER_ERROR, "gacc view: the page failed\n").into_response();
        };
        let moved = after.is_none_or(|n| n != live.done);
        if moved || live.finished || started.elapsed() >= LONGEST_WAIT {
            break live;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let body = serde_json::to_string(&live).unwrap_or_default();
    let body = crate::secrets::redact(&body).into_owned();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}
