//! `report.html`: one self-contained page whose embedded data holds the run, and which works in
//! a real browser (Debian's `chromium`, headless): no console errors and no request blocked by
//! its content policy, the summary table sorts, a goal opens with its questions, memories
//! (truncation marked), answers and verdicts.

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use base64::Engine;
use common::browser::{browse, chromium};
use common::{Scratch, read_json, read_lines};
use serde_json::Value;

const DATA_START: &str = "<script type=\"application/json\" id=\"gacc-data\">";
/// What a memory, an answer and a reference carry to try to end the data element early.
const BREAKOUT: &str = "</script><!--x";

/// The embedded data: the text up to the first `</script>` after its start must be the whole
/// blob, whatever the memories, answers and references hold.
fn blob(html: &str) -> Value {
    let start = html.find(DATA_START).expect("the page embeds its data") + DATA_START.len();
    let end = start + html[start..].find("</script>").expect("the data element ends");
    serde_json::from_str(&html[start..end]).expect("the data blob parses as JSON")
}

fn unpack(data: &Value, packed: &Value) -> Value {
    if data["packing"] == "json" {
        return packed.clone();
    }
    assert_eq!(data["packing"], "gzip");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(packed.as_str().expect("packed data is a string"))
        .expect("base64");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut text).expect("gzip");
    serde_json::from_str(&text).expect("packed JSON")
}

fn question_ids(folder: &Path) -> Vec<String> {
    read_lines(&folder.join("dataset.jsonl"))
        .iter()
        .flat_map(|s| s["goals"].as_array().unwrap().clone())
        .flat_map(|g| g["questions"].as_array().unwrap().clone())
        .map(|q| q["id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_fixture_page_is_self_contained_and_holds_every_question_once() {
    let scratch = Scratch::new();
    let (status, folder, stderr) = scratch.run("experiments/fixture.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    let html = std::fs::read_to_string(folder.join("report.html")).unwrap();
    for forbidden in [
        "http://",
        "https://",
        "<script src",
        "<link",
        " src=",
        "url(",
        "@import",
    ] {
        assert!(!html.contains(forbidden), "report.html contains {forbidden:?}");
    }
    assert!(
        html.contains("default-src 'none'"),
        "a content policy forbids every request"
    );
    assert_eq!(html.matches("<svg").count(), 4, "the four charts are inlined");
    for tag in html
        .match_indices("<script")
        .map(|(at, _)| &html[at..at + html[at..].find('>').unwrap() + 1])
    {
        assert!(
            tag == "<script>" || tag == DATA_START,
            "unexpected script tag {tag}"
        );
    }

    let data = blob(&html);
    assert_eq!(data["format"], gacc::report::html::FORMAT);
    assert_eq!(data["packing"], "json", "a small run's data stays plain JSON");
    let report = read_json(&folder.join("report.json"));
    assert_eq!(data["report"]["cells"], report["cells"]);
    let index = unpack(&data, &data["index"]);
    let ids: Vec<String> = serde_json::from_value(index["questions"]["id"].clone()).unwrap();
    assert_eq!(
        ids,
        question_ids(&folder),
        "every question once, in dataset order"
    );
    let results = read_lines(&folder.join("results.jsonl.gz"));
    assert_eq!(
        index["results"]["question"].as_array().unwrap().len(),
        results.len()
    );
    let ledger = read_lines(&folder.join("memories.jsonl.gz"));
    assert_eq!(
        index["memories"]["budget"].as_array().unwrap().len(),
        ledger.len()
    );
    let goals = index["goals"]["id"].as_array().unwrap().len();
    assert_eq!(
        index["goals"]["result_start"].as_array().unwrap().len(),
        goals + 1
    );
    assert_eq!(index["goals"]["result_start"][goals], results.len());
    let right = index["results"]["verdict"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| **v == 1)
        .count();
    assert_eq!(right, results.iter().filter(|r| r["correct"] == true).count());
    let texts: usize = data["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_array().unwrap().len())
        .sum();
    assert_eq!(texts, read_lines(&folder.join("memory_texts.jsonl.gz")).len());
}

#[test]
fn the_page_reads_without_javascript_and_holds_every_section_of_report_md() {
    let scratch = Scratch::new();
    let sets = ["-q", "--set", "seeds=[1]", "--set", "ratios=[0.25, 1.0]"];
    let (status, folder, stderr) = scratch.run("experiments/baselines.toml", &sets);
    assert_eq!(status, 0, "{stderr}");
    let html = std::fs::read_to_string(folder.join("report.html")).unwrap();
    // What a reader without JavaScript sees: the page with its scripts taken out.
    let mut text = html.clone();
    while let Some(start) = text.find("<script") {
        let end = start + text[start..].find("</script>").unwrap() + "</script>".len();
        text.replace_range(start..end, "");
    }
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    let headings: Vec<(&str, &str)> = markdown
        .lines()
        .filter_map(|line| {
            line.strip_prefix("## ")
                .map(|t| ("h2", t))
                .or_else(|| line.strip_prefix("### ").map(|t| ("h3", t)))
        })
        .collect();
    assert!(headings.len() >= 6, "{headings:?}");
    for (tag, title) in headings {
        assert!(
            text.contains(&format!("<{tag}>{title}</{tag}>")),
            "no {tag} {title:?} in the page without its script"
        );
    }
    // Every cell is a row of the results table, with its Micro as report.md states it.
    let report = read_json(&folder.join("report.json"));
    let cells = report["cells"].as_array().unwrap();
    let table = &text[text.find("<table id=\"cells\"").unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    assert_eq!(table.matches("<tr data-cell=").count(), cells.len());
    for cell in cells {
        let micro = format!("{:.3}", cell["micro"]["mean"].as_f64().unwrap());
        assert!(table.contains(&micro), "{micro} in {table}");
        assert!(markdown.contains(&micro));
    }
    for gone in ["Loading", "hidden></section>"] {
        assert!(!text.contains(gone), "{gone:?} in the page without its script");
    }
}

/// A copy of the fixture where the reactor has a `label` whose value tries to end the page's
/// data element, asked about by a fourth question; and a manifest with eight cells (two
/// compressors, two ratios, two conditions) and two seeds, so the table has something to sort.
fn breakout_run(scratch: &Scratch) -> PathBuf {
    let fixture = std::fs::read_to_string(scratch.path("experiments/data/fixture.jsonl")).unwrap();
    let mut lines = Vec::new();
    for line in fixture.lines() {
        let mut source: Value = serde_json::from_str(line).unwrap();
        if source["id"] == "plant" {
            let text = source["text"]
                .as_str()
                .unwrap()
                .replace("status=green", &format!("status=green label={BREAKOUT}"));
            source["text"] = text.into();
            source["goals"][0]["questions"].as_array_mut().unwrap().push(serde_json::json!({
                "id": "plant-reactor-label", "question": "What is the label of the reactor?", "reference": BREAKOUT}));
        }
        lines.push(source.to_string());
    }
    scratch.write("experiments/data/html.jsonl", &(lines.join("\n") + "\n"));
    scratch.write(
        "experiments/html.toml",
        r#"name = "html"
seeds = [1, 2]
ratios = [0.15, 1]
conditions = ["own-goal", "no-goal"]

[dataset]
path = "data/html.jsonl"

[compressors.goal-line]
builtin = "goal-line"

[compressors.prefix]
builtin = "prefix"

[reader]
builtin = "field-lookup"

[judge]
builtin = "exact"
"#,
    );
    let (status, folder, stderr) = scratch.run("experiments/html.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    folder
}

#[test]
fn a_script_end_in_a_memory_answer_or_reference_cannot_break_out() {
    let scratch = Scratch::new();
    let folder = breakout_run(&scratch);
    let results = read_lines(&folder.join("results.jsonl.gz"));
    assert!(
        results.iter().any(|r| r["answer"] == BREAKOUT),
        "the reader answered with the breakout text"
    );
    let html = std::fs::read_to_string(folder.join("report.html")).unwrap();
    assert_eq!(
        html.matches("</script>").count(),
        3,
        "only the page's own script elements end"
    );
    for packing in [
        gacc::report::html::Packing::Json,
        gacc::report::html::Packing::Gzip,
    ] {
        let html = gacc::report::html::render(&folder, packing).unwrap();
        let data = blob(&html);
        let index = unpack(&data, &data["index"]);
        assert!(index["answers"].as_array().unwrap().iter().any(|a| a == BREAKOUT));
        assert!(
            index["questions"]["reference"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a == BREAKOUT)
        );
        let memories: Vec<Value> = data["texts"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|t| unpack(&data, t).as_array().unwrap().clone())
            .collect();
        assert!(memories.iter().any(|m| m.as_str().unwrap().contains(BREAKOUT)));
    }
}

#[test]
fn gacc_report_rewrites_the_page_and_names_a_broken_file() {
    let scratch = Scratch::new();
    let (status, folder, _) = scratch.run("experiments/fixture.toml", &[]);
    assert_eq!(status, 0);
    let written = std::fs::read(folder.join("report.html")).unwrap();
    std::fs::remove_file(folder.join("report.html")).unwrap();
    scratch.gacc().arg("report").arg(&folder).assert().success();
    assert_eq!(
        std::fs::read(folder.join("report.html")).unwrap(),
        written,
        "gacc report builds the page gacc run built"
    );

    let ledger = folder.join("memories.jsonl.gz");
    let rows = std::fs::read(&ledger).unwrap();
    let broken = common::read_text(&ledger).replacen("{\"seed\"", "{\"seed\" oops", 1);
    std::fs::write(&ledger, common::gzip(broken.as_bytes())).unwrap();
    let output = scratch.gacc().arg("report").arg(&folder).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("memories.jsonl") && stderr.contains("line 1"),
        "{stderr}"
    );
    std::fs::write(&ledger, rows).unwrap();

    std::fs::remove_file(folder.join("memory_texts.jsonl.gz")).unwrap();
    let output = scratch.gacc().arg("report").arg(&folder).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("memory_texts.jsonl.gz") && stderr.contains("cannot read"),
        "{stderr}"
    );
}

// ---- in a browser ------------------------------------------------------------------------------

fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&amp;", "&")
}

/// The page's own self-test, as the browser left it in the DOM.
fn selftest(dom: &str) -> Value {
    let start = dom
        .find("<pre id=\"selftest\">")
        .expect("the page kept its self-test element")
        + "<pre id=\"selftest\">".len();
    let end = start + dom[start..].find("</pre>").unwrap();
    let text = unescape(&dom[start..end]);
    serde_json::from_str(&text).unwrap_or_else(|_| panic!("the self-test did not finish: {text:?}"))
}

fn url(page: &Path, fragment: &str) -> String {
    format!("file://{}#{fragment}", page.canonicalize().unwrap().display())
}

#[test]
fn the_page_works_in_chromium() {
    let Some(browser) = chromium() else {
        return;
    };
    let scratch = Scratch::new();
    let folder = breakout_run(&scratch);
    let report = read_json(&folder.join("report.json"));
    let micro: Vec<f64> = report["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["micro"]["mean"].as_f64().unwrap())
        .collect();
    // The page as written (plain JSON) and the same run packed as a large run is (gzip).
    let gzip_page = folder.join("report-gzip.html");
    std::fs::write(
        &gzip_page,
        gacc::report::html::render(&folder, gacc::report::html::Packing::Gzip).unwrap(),
    )
    .unwrap();
    for page in [folder.join("report.html"), gzip_page] {
        let dom = browse(
            &browser,
            &["--dump-dom".into()],
            &url(&page, "selftest&goal=plant-reactor"),
        );
        let result = selftest(&dom);
        let name = page.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(
            result["errors"],
            Value::Array(vec![]),
            "{name}: console errors or blocked requests"
        );
        assert!(result.get("failed").is_none(), "{name}: {}", result["failed"]);
        let checks = &result["checks"];
        for check in ["ascending", "descending", "order_changed"] {
            assert_eq!(checks[check], true, "{name}: sorting: {check} in {checks}");
        }
        // The table as the browser left it: sorted by Micro, descending, and no longer in
        // report.json's order.
        let tbody = &dom[dom.find("<tbody>").unwrap()..];
        let tbody = &tbody[..tbody.find("</tbody>").unwrap()];
        let order: Vec<usize> = tbody
            .match_indices("data-cell=\"")
            .map(|(at, m)| tbody[at + m.len()..].split('"').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(
            order.iter().copied().collect::<BTreeSet<_>>().len(),
            micro.len(),
            "{name}: every cell once"
        );
        assert!(
            order.windows(2).all(|w| micro[w[0]] >= micro[w[1]]),
            "{name}: {order:?} by Micro {micro:?}"
        );
        assert_ne!(
            order,
            (0..micro.len()).collect::<Vec<_>>(),
            "{name}: the order changed"
        );

        // The goal opened: 4 questions, 8 cells x 2 seeds = 16 memories, 64 answers, both
        // kinds of verdict, the cut marked where the budget cut (r = 0.15) and the end of the
        // output where it did not (r = 1).
        assert_eq!(checks["goal"], "plant-reactor");
        assert_eq!(checks["questions"], 4, "{name}: {checks}");
        assert_eq!(checks["memories"], 16, "{name}: {checks}");
        assert_eq!(checks["answers"], 64, "{name}: {checks}");
        assert!(
            checks["right"].as_u64().unwrap() > 0 && checks["wrong"].as_u64().unwrap() > 0,
            "{name}: {checks}"
        );
        assert!(checks["cut_markers"].as_u64().unwrap() > 0, "{name}: {checks}");
        assert!(checks["end_markers"].as_u64().unwrap() > 0, "{name}: {checks}");
        assert_eq!(
            checks["search_hits"], 1,
            "{name}: searching the goal's id finds it alone"
        );
        let detail = &dom[dom.find("id=\"goal-detail\"").unwrap()..];
        for text in [
            "What is the temperature of the reactor?",
            "Understand the condition of the reactor",
            "✂ budget L =",
            "verdict-right",
            "verdict-wrong",
        ] {
            assert!(detail.contains(text), "{name}: the opened goal shows {text:?}");
        }
        // (The evidence a memory kept is marked: the text is read without the marks.)
        let unmarked = detail
            .replace("<mark class=\"span-kept\">", "")
            .replace("</mark>", "");
        assert!(
            unmarked.contains("label=&lt;/script&gt;&lt;!--x"),
            "{name}: the memory shows the text as text"
        );
        assert!(!dom.contains("label=</script>"), "{name}: no text became markup");
    }

    let artifacts = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("test-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let shot = artifacts.join("report-html.png");
    let _ = std::fs::remove_file(&shot);
    browse(
        &browser,
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1280,1600".into(),
        ],
        &url(
            &folder.join("report.html"),
            "goal=plant-reactor&open=4&hide=charts",
        ),
    );
    let png = std::fs::read(&shot).expect("the screenshot was written");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "{} is a real picture",
        shot.display()
    );
    eprintln!("screenshot: {}", shot.display());
}

#[test]
fn the_judge_audit_shows_in_the_page() {
    let scratch = Scratch::new();
    let manifest = std::fs::read_to_string(scratch.path("experiments/baselines.toml")).unwrap();
    scratch.write(
        "experiments/audited.toml",
        &format!("{manifest}\n[audit]\njudges = [\"exact\", \"token-f1\"]\n"),
    );
    let sets = ["-q", "--set", "seeds=[1]", "--set", "ratios=[0.1]"];
    let (status, folder, stderr) = scratch.run("experiments/audited.toml", &sets);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    let changes = report["judge_audit"]["ranking_changes"].as_array().unwrap().len();
    // The page as written, before any script ran.
    let dom = std::fs::read_to_string(folder.join("report.html")).unwrap();
    let section = &dom[dom.find("<section id=\"audit\"").expect("the audit section")..];
    let section = &section[..section.find("</section>").unwrap()];
    assert!(section.contains("<h2>Judge audit</h2>"), "{section}");
    for judge in ["exact", "token-f1"] {
        assert!(
            section.contains(&format!("<td><code>{judge}</code></td>")),
            "{judge}: {section}"
        );
    }
    // One line per change the report lists.
    assert_eq!(section.matches("<li>").count(), changes, "{section}");
}

/// What a `data-NAME="…"` attribute holds, each time it occurs, in order.
fn attributes<'a>(dom: &'a str, name: &str) -> Vec<&'a str> {
    let marker = format!("{name}=\"");
    dom.match_indices(&marker)
        .map(|(at, _)| {
            let rest = &dom[at + marker.len()..];
            &rest[..rest.find('"').unwrap()]
        })
        .collect()
}

#[test]
fn why_a_score_is_what_it_is_shows_in_the_page() {
    let Some(browser) = chromium() else {
        return;
    };
    let scratch = Scratch::new();
    let sets = ["-q", "--set", "seeds=[1]", "--set", "ratios=[0.25, 1.0]"];
    let (status, folder, stderr) = scratch.run("experiments/baselines.toml", &sets);
    assert_eq!(status, 0, "{stderr}");
    let report = read_json(&folder.join("report.json"));
    let dom = browse(
        &browser,
        &["--dump-dom".into()],
        &url(&folder.join("report.html"), "goal=water-finance&open=1000"),
    );

    // A bar per cell, in the report's order, of its four attribution counts.
    let bars: Vec<String> = report["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let a = &c["attribution"];
            format!(
                "{},{},{},{}",
                a["kept_right"], a["kept_wrong"], a["lost_right"], a["lost_wrong"]
            )
        })
        .collect();
    assert_eq!(attributes(&dom, "data-attribution"), bars);
    for column in ["floor", "ceiling", "gap closed"] {
        assert!(dom.contains(&format!(">{column}</button>")), "no {column} column");
    }

    // The goal's memories: each answer lists its question's spans, kept or lost as its row
    // says; the memory marks what it kept, and only that.
    let results = read_lines(&folder.join("results.jsonl.gz"));
    let dataset = read_lines(&folder.join("dataset.jsonl"));
    let goal = dataset
        .iter()
        .flat_map(|s| s["goals"].as_array().unwrap())
        .find(|g| g["id"] == "water-finance")
        .unwrap();
    let spans: Vec<String> = goal["questions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["evidence"].as_str().unwrap().to_owned())
        .collect();
    let rows: Vec<&Value> = results
        .iter()
        .filter(|r| r["goal_id"] == "water-finance")
        .collect();
    let kept = rows.iter().filter(|r| r["evidence_kept"] == 1.0).count();
    let flags = attributes(&dom, "data-kept");
    assert_eq!(flags.len(), rows.len(), "one span per question in this dataset");
    assert_eq!(flags.iter().filter(|f| **f == "1").count(), kept);
    assert!(
        kept > 0 && kept < rows.len(),
        "some memories keep, some lose: {kept}"
    );
    let marks: Vec<&str> = dom
        .match_indices("<mark class=\"span-kept\">")
        .map(|(at, found)| {
            let rest = &dom[at + found.len()..];
            &rest[..rest.find("</mark>").unwrap()]
        })
        .collect();
    assert!(!marks.is_empty());
    for mark in marks {
        let mark = unescape(mark).to_lowercase();
        assert!(spans.iter().any(|s| s.to_lowercase() == mark), "{mark}");
    }

    // The Micro chart draws the floor and the ceiling as lines, at the cells' values.
    let cell = &report["cells"][0];
    for (line, field) in [
        ("floor (empty memory)", "floor_micro"),
        ("ceiling (whole source)", "ceiling_micro"),
    ] {
        let label = format!("{line}: {:.3}", cell[field].as_f64().unwrap());
        assert!(dom.contains(&label), "no {label} in the chart");
    }
}
