//! `gacc view`: a local, read-only web app over a folder of runs. Its pages, opened in a real
//! browser, show the figures the run's files hold; the live page follows a run in flight; no
//! request reaches a file outside the folder; it listens on 127.0.0.1 unless told otherwise.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::browser::{browse, chromium};
use common::{Scratch, gacc_binary, read_json, read_lines};
use serde_json::Value;

/// A `gacc view` process, ended when dropped.
struct Served {
    child: Child,
    /// `host:port`, as it printed.
    address: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `gacc view DIR --port 0` in the scratch folder: the process, and the first line it
/// printed (the address).
fn started(scratch: &Scratch, dir: &str, extra: &[&str], stderr: Stdio) -> (Child, String) {
    let mut child = std::process::Command::new(gacc_binary())
        .current_dir(scratch.path(""))
        .args(["view", dir, "--port", "0"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line)
}

/// Starts `gacc view DIR --port 0` in the scratch folder and waits for its address.
fn serve(scratch: &Scratch, dir: &str, extra: &[&str]) -> Served {
    let (child, line) = started(scratch, dir, extra, Stdio::null());
    let address = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("gacc view printed no address: {line:?}"))
        .to_owned();
    Served { child, address }
}

/// A GET of `target` exactly as written (no normalising), with `host` as the Host header:
/// the status code and the body.
fn get_as(served: &Served, target: &str, host: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(&served.address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        stream,
        "GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let status = reply
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {reply:?}"));
    let body = reply
        .split_once("\r\n\r\n")
        .map_or("", |(_, body)| body)
        .to_owned();
    (status, body)
}

fn get(served: &Served, target: &str) -> (u16, String) {
    get_as(served, target, &served.address)
}

/// `text` as a query value.
fn query(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// A run's name in the site: its path under `runs/`.
fn id_of(folder: &Path, runs: &Path) -> String {
    let runs = runs.canonicalize().unwrap();
    let folder = folder.canonicalize().unwrap();
    folder.strip_prefix(&runs).unwrap().to_str().unwrap().to_owned()
}

/// The `data-value` of each element with `data-field="field"`, in page order.
fn values(dom: &str, field: &str) -> Vec<Option<f64>> {
    let marker = format!("data-field=\"{field}\"");
    dom.match_indices(&marker)
        .map(|(at, _)| {
            let rest = &dom[at + marker.len()..];
            let tag_end = rest.find('>').unwrap();
            let attrs = &rest[..tag_end];
            attrs
                .split("data-value=\"")
                .nth(1)
                .and_then(|v| v.split('"').next())
                .map(|v| v.parse().unwrap())
        })
        .collect()
}

/// The text of the element with `id`, as the browser left it.
fn text_of(dom: &str, id: &str) -> String {
    let start = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id}"));
    let start = start + dom[start..].find('>').unwrap() + 1;
    let end = start + dom[start..].find("</").unwrap();
    dom[start..end]
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

fn close(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => (a - b).abs() < 1e-9,
        (None, None) => true,
        _ => false,
    }
}

/// Two baselines runs, one compressor's parameters changed in the second.
fn two_runs(scratch: &Scratch) -> (PathBuf, PathBuf) {
    let (status, a, _) = scratch.run("experiments/baselines.toml", &[]);
    assert_eq!(status, 0);
    let changed = [
        "--set",
        "compressors.goal-bm25.params.k1=0.1",
        "--set",
        "compressors.goal-bm25.params.b=0.0",
    ];
    let (status, b, _) = scratch.run("experiments/baselines.toml", &changed);
    assert_eq!(status, 0);
    (a, b)
}

#[test]
fn the_runs_list_a_run_two_runs_compared_and_a_question_show_the_runs_figures_in_chromium() {
    let Some(browser) = chromium() else {
        return;
    };
    let scratch = Scratch::new();
    let (a, b) = two_runs(&scratch);
    let runs = scratch.path("runs");
    let (id_a, id_b) = (id_of(&a, &runs), id_of(&b, &runs));
    let served = serve(&scratch, "runs", &[]);
    let page = |target: &str| {
        browse(
            &browser,
            &["--dump-dom".into()],
            &format!("http://{}{target}", served.address),
        )
    };

    let list = page("/");
    for id in [&id_a, &id_b] {
        assert!(list.contains(&format!("data-run=\"{id}\"")), "{id} not listed");
    }

    // A run's page: each cell's Micro and Macro as report.json states them.
    let report = read_json(&a.join("report.json"));
    let cells = report["cells"].as_array().unwrap();
    let dom = page(&format!("/run?run={}", query(&id_a)));
    let (micro, macro_) = (values(&dom, "micro"), values(&dom, "macro"));
    assert_eq!(micro.len(), cells.len());
    for (i, cell) in cells.iter().enumerate() {
        assert!(
            close(micro[i], cell["micro"]["mean"].as_f64()),
            "cell {i}: {:?} vs {}",
            micro[i],
            cell["micro"]
        );
        assert!(close(macro_[i], cell["macro"]["mean"].as_f64()), "cell {i}");
    }
    // Its pairs of compressors (SPEC §13), each with its verdict.
    let pairs = report["pairs"].as_array().unwrap();
    assert!(!pairs.is_empty());
    assert!(
        dom.contains("<h2>Pairs</h2>"),
        "the run's page has no Pairs section"
    );
    let verdicts = dom.matches("separated").count() + dom.matches("within noise").count();
    assert!(
        verdicts >= pairs.len(),
        "{verdicts} verdicts shown for {} pairs",
        pairs.len()
    );
    // Each cell's compression cost and break-even (SPEC §15), as report.json states them.
    let (usd, break_even) = (
        values(&dom, "compression_usd"),
        values(&dom, "break_even_questions"),
    );
    assert_eq!((usd.len(), break_even.len()), (cells.len(), cells.len()));
    for (i, cell) in cells.iter().enumerate() {
        assert!(close(usd[i], cell["compression"]["usd"].as_f64()), "cell {i}");
        assert!(
            close(break_even[i], cell["read_cost"]["break_even_questions"].as_f64()),
            "cell {i}"
        );
    }
    // The cost–quality frontier (SPEC §15): plotted, and every point with its rank.
    let points = report["frontier"].as_array().unwrap();
    assert!(dom.contains("<h2>Frontier</h2>") && dom.contains("frontier · own-goal"));
    let ranks = values(&dom, "frontier_micro");
    assert_eq!(ranks.len(), points.len());
    for (shown, point) in ranks.iter().zip(points) {
        assert!(close(*shown, point["micro"].as_f64()), "{point}");
    }

    // Two runs compared: each side's Micro, and the flipped questions recounted from the rows.
    let dom = page(&format!("/compare?a={}&b={}", query(&id_a), query(&id_b)));
    let report_b = read_json(&b.join("report.json"));
    let (shown_a, shown_b) = (values(&dom, "micro_a"), values(&dom, "micro_b"));
    assert_eq!(shown_a.len(), cells.len());
    for (i, (cell_a, cell_b)) in cells
        .iter()
        .zip(report_b["cells"].as_array().unwrap())
        .enumerate()
    {
        assert!(close(shown_a[i], cell_a["micro"]["mean"].as_f64()), "cell {i}");
        assert!(close(shown_b[i], cell_b["micro"]["mean"].as_f64()), "cell {i}");
    }
    let (va, vb) = (common::verdicts(&a), common::verdicts(&b));
    let flips = va
        .iter()
        .filter(|(key, verdict)| {
            verdict.is_boolean() && vb.get(*key).is_some_and(|v| v.is_boolean() && v != *verdict)
        })
        .count();
    assert!(flips > 0, "the changed parameters flip some questions");
    let flipped = dom.split("id=\"flipped\" data-value=\"").nth(1).unwrap();
    assert_eq!(flipped.split('"').next().unwrap(), flips.to_string());

    // A question's drill-down: its answer, reference and verdict, and the evidence marked.
    let results = read_lines(&a.join("results.jsonl.gz"));
    let dataset = read_lines(&a.join("dataset.jsonl"));
    let index = results.iter().position(|r| r["correct"] == true).unwrap();
    let row = &results[index];
    let dom = page(&format!("/question?run={}&row={index}", query(&id_a)));
    assert_eq!(text_of(&dom, "answer"), row["answer"].as_str().unwrap());
    let asked = dataset
        .iter()
        .flat_map(|s| s["goals"].as_array().unwrap())
        .flat_map(|g| g["questions"].as_array().unwrap())
        .find(|q| q["id"] == row["question_id"])
        .unwrap();
    let reference = asked["reference"].as_str().unwrap();
    assert_eq!(text_of(&dom, "reference"), reference);
    assert!(dom.contains("data-correct=\"true\""));
    // Its evidence spans (its reference when it states none), each marked where it occurs.
    let spans: Vec<&str> = match &asked["evidence"] {
        Value::String(span) => vec![span.as_str()],
        Value::Array(spans) => spans.iter().map(|s| s.as_str().unwrap()).collect(),
        _ => vec![reference],
    };
    let source = dataset.iter().find(|s| s["id"] == row["source_id"]).unwrap()["text"]
        .as_str()
        .unwrap();
    let in_source: usize = (spans.iter())
        .map(|span| {
            source
                .to_ascii_lowercase()
                .matches(&span.to_ascii_lowercase())
                .count()
        })
        .sum();
    assert!(in_source > 0, "the spans occur in their sources");
    assert_eq!(dom.matches("<mark class=\"evidence\">").count(), in_source);
    let kept = (row["evidence_kept"].as_f64().unwrap() * spans.len() as f64).round() as usize;
    assert!(dom.contains(&format!("data-spans=\"{}\" data-kept=\"{kept}\"", spans.len())));
    assert_eq!(dom.matches("<li class=\"kept\"").count(), kept);
    assert_eq!(dom.matches("<li class=\"lost\"").count(), spans.len() - kept);
    assert_eq!(
        dom.contains("<mark class=\"kept\">"),
        kept > 0,
        "the memory marks what it kept"
    );
    assert!(
        !dom.contains("api_key") && !dom.contains("sk-"),
        "no secret on the page"
    );
}

#[test]
fn nothing_outside_the_folder_is_served_and_only_loopback_is_bound() {
    let scratch = Scratch::new();
    let (status, run, _) = scratch.run("experiments/fixture.toml", &[]);
    assert_eq!(status, 0);
    // A second folder of runs beside the one served, and a link out of the served one.
    let outside = scratch.path("elsewhere");
    std::fs::create_dir_all(&outside).unwrap();
    let copy = outside.join(run.file_name().unwrap());
    std::fs::create_dir_all(&copy).unwrap();
    for file in ["report.json", "run.json", "results.jsonl.gz"] {
        std::fs::copy(run.join(file), copy.join(file)).unwrap();
    }
    std::os::unix::fs::symlink(&outside, scratch.path("runs/out")).unwrap();
    let served = serve(&scratch, "runs", &[]);
    assert!(
        served.address.starts_with("127.0.0.1:"),
        "bound {}",
        served.address
    );

    let id = id_of(&run, &scratch.path("runs"));
    assert_eq!(get(&served, &format!("/run?run={}", query(&id))).0, 200);
    let absolute = copy.canonicalize().unwrap().display().to_string();
    let name = copy.file_name().unwrap().to_str().unwrap().to_owned();
    for target in [
        "/../../etc/passwd".to_owned(),
        "/%2e%2e/%2e%2e/etc/passwd".to_owned(),
        "/run?run=../elsewhere/".to_owned() + &name,
        "/run?run=..%2Felsewhere%2F".to_owned() + &name,
        format!("/run?run={}", query(&absolute)),
        format!("/report?run={}", query(&absolute)),
        format!("/live.json?run={}", query(&absolute)),
        format!("/run?run=out/{name}"),
        format!("/report?run=fixture/..%2F..%2Felsewhere%2F{name}"),
        "/report?run=/etc".to_owned(),
        format!("/question?run={}&row=99999", query(&id)),
        format!("/cell?run={}&cell=-1", query(&id)),
        "/runs/fixture/report.json".to_owned(),
    ] {
        let (status, body) = get(&served, &target);
        assert_eq!(status, 404, "{target}: {body}");
    }
    // A pack in the folder is listed and opens as its run.
    std::fs::create_dir_all(scratch.path("runs/shared")).unwrap();
    let packed = scratch
        .gacc()
        .args(["pack"])
        .arg(&run)
        .args(["-o", "runs/shared/fixture.gacc.tar.gz"])
        .output()
        .unwrap();
    assert!(
        packed.status.success(),
        "{}",
        String::from_utf8_lossy(&packed.stderr)
    );
    assert!(
        get(&served, "/")
            .1
            .contains("/run?run=shared/fixture.gacc.tar.gz")
    );
    let (status, body) = get(&served, "/run?run=shared/fixture.gacc.tar.gz");
    assert_eq!(status, 200, "{body}");
    let micro = read_json(&run.join("report.json"))["cells"][0]["micro"]["mean"].as_f64();
    assert!(close(values(&body, "micro")[0], micro), "{body}");
    // Another Host (a name rebound to 127.0.0.1 by another site) is refused.
    assert_eq!(get_as(&served, "/", "evil.example").0, 421);
    assert_eq!(
        get_as(
            &served,
            "/",
            &format!("localhost:{}", served.address.split(':').nth(1).unwrap())
        )
        .0,
        200
    );
}

/// The fixture with a reader (a shell script) that takes a fifth of a second per answer, two
/// at a time: its 36 answers take several seconds.
fn slow_fixture(scratch: &Scratch) -> &'static str {
    scratch.script(
        "experiments/slow-reader.sh",
        "#!/bin/sh\ncat >/dev/null\nsleep 0.4\nprintf '{\"answer\":\"unknown\"}'\n",
    );
    let manifest = std::fs::read_to_string(scratch.path("experiments/fixture.toml"))
        .unwrap()
        .replace(
            "[reader]\nbuiltin = \"field-lookup\"",
            "[reader]\ncommand = [\"./slow-reader.sh\"]\nconcurrency = 2",
        );
    scratch.write("experiments/slow.toml", &manifest);
    "experiments/slow.toml"
}

#[test]
fn the_live_page_follows_a_run_in_flight() {
    let Some(browser) = chromium() else {
        return;
    };
    let scratch = Scratch::new();
    let manifest = slow_fixture(&scratch);
    let mut run = scratch.gacc_process();
    let mut run = run
        .args(["run", manifest, "-q"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let folder = loop {
        let found = std::fs::read_dir(scratch.path("runs/fixture"))
            .into_iter()
            .flatten()
            .flatten()
            .find(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with(|c: char| c.is_ascii_digit()) && e.path().join("run.json").is_file()
            });
        if let Some(found) = found {
            break found.path();
        }
        assert!(Instant::now() < deadline, "the run folder did not appear");
        std::thread::sleep(Duration::from_millis(20));
    };
    let served = serve(&scratch, "runs", &[]);
    let id = id_of(&folder, &scratch.path("runs"));
    // The page asks for each change as it comes; the browser's clock waits for each answer.
    let dom = browse(
        &browser,
        &["--dump-dom".into(), "--virtual-time-budget=4000".into()],
        &format!("http://{}/live?run={}", served.address, query(&id)),
    );
    let history = text_of(&dom, "history");
    let counts: Vec<u64> = history
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    assert!(
        counts.len() >= 3,
        "the page saw the run move at least three times: {history:?}"
    );
    assert!(counts.windows(2).all(|w| w[0] < w[1]), "{history:?}");
    assert!(
        text_of(&dom, "state") == "running" || history.ends_with("finished"),
        "{dom}"
    );
    assert_eq!(run.wait().unwrap().code(), Some(0));
    // Once finished, the live page says so and the run's page has its figures.
    let (status, body) = get(&served, &format!("/live.json?run={}", query(&id)));
    assert_eq!(status, 200);
    let live: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(live["finished"], true);
    assert_eq!(live["results"], 36);
    assert!(
        get(&served, &format!("/run?run={}", query(&id)))
            .1
            .contains("data-field=\"micro\"")
    );
}

/// A raw GET to `address` with extra header lines: the whole reply (status line, headers, body).
fn raw_get(address: &str, target: &str, host: &str, headers: &str) -> String {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        stream,
        "GET {target} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

#[test]
fn off_loopback_every_request_needs_the_printed_token_and_every_page_has_a_csp() {
    let scratch = Scratch::new();
    let (status, _, _) = scratch.run("experiments/fixture.toml", &[]);
    assert_eq!(status, 0);
    let mut child = std::process::Command::new(gacc_binary())
        .current_dir(scratch.path(""))
        .args(["view", "runs", "--port", "0", "--host", "0.0.0.0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let mut warning = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut warning)
        .unwrap();
    let served = Served {
        child,
        address: String::new(),
    };
    assert!(
        warning.starts_with("warning: gacc view listens on 0.0.0.0:"),
        "{warning}"
    );
    assert!(warning.contains("visible to anyone on the network"), "{warning}");
    // `…at http://0.0.0.0:PORT/?token=HEX (Ctrl-C stops)`; asked on loopback only.
    let (port, token) = line
        .split("http://0.0.0.0:")
        .nth(1)
        .and_then(|rest| rest.split_once("/?token="))
        .map(|(port, rest)| (port.to_owned(), rest.split(' ').next().unwrap().to_owned()))
        .unwrap_or_else(|| panic!("no address with a token: {line:?}"));
    assert_eq!(token.len(), 32, "{token}");
    let address = format!("127.0.0.1:{port}");
    let status = |reply: &str| reply.split(' ').nth(1).unwrap_or("").to_owned();
    let csp = "content-security-policy: default-src 'none'";
    for (target, headers) in [
        ("/", String::new()),
        ("/run?run=x", String::new()),
        (&format!("/?token={}", "0".repeat(32)), String::new()),
        ("/", format!("Cookie: gacc_view_token={}\r\n", "f".repeat(32))),
    ] {
        let reply = raw_get(&address, target, &address, &headers);
        assert_eq!(status(&reply), "401", "{target} {headers}: {reply}");
        assert!(reply.to_ascii_lowercase().contains(csp), "{reply}");
    }
    let first = raw_get(&address, &format!("/?token={token}"), &address, "");
    assert_eq!(status(&first), "200", "{first}");
    assert!(first.to_ascii_lowercase().contains(csp), "{first}");
    let cookie = format!("set-cookie: gacc_view_token={token}; path=/; httponly; samesite=strict");
    assert!(first.to_ascii_lowercase().contains(&cookie), "{first}");
    let later = raw_get(
        &address,
        "/",
        &address,
        &format!("Cookie: gacc_view_token={token}\r\n"),
    );
    assert_eq!(status(&later), "200", "{later}");
    assert!(later.to_ascii_lowercase().contains(csp), "{later}");
    drop(served);
}

#[test]
fn a_loopback_view_carries_a_csp_on_every_answer() {
    let scratch = Scratch::new();
    let (status, _, _) = scratch.run("experiments/fixture.toml", &[]);
    assert_eq!(status, 0);
    let served = serve(&scratch, "runs", &[]);
    for target in ["/", "/nothing", "/run?run=missing"] {
        let reply = raw_get(&served.address, target, &served.address, "");
        assert!(
            reply
                .to_ascii_lowercase()
                .contains("content-security-policy: default-src 'none'"),
            "{target}: {reply}"
        );
    }
}
