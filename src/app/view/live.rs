//! The live page of a run in flight: what its `run.json` says now (progress per stage, calls,
//! cache hits, 429s, pace, cost so far) and how many rows it has written, refreshed every
//! second from `/live.json` until the run has its report.

use std::fmt::Write as _;

use serde::Serialize;

use super::pages::{page, query};
use super::site::Site;
use crate::report::html::escape_html;
use crate::store::run_folder::{MEMORIES, REPORT_JSON, RESULTS, RUN, RunFolder};
use crate::store::run_record::{LiveProgress, RunRecord};

/// What the live page shows, as `/live.json` sends it.
#[derive(Debug, Default, Serialize)]
pub(super) struct Live {
    /// The run has its report.
    pub finished: bool,
    /// `running`, `interrupted`, `stopped` (its process is gone), `finished`, or `no record`
    /// (no readable `run.json`).
    pub state: String,
    pub seconds: f64,
    pub updated: String,
    pub progress: LiveProgress,
    /// Rows written so far.
    pub results: usize,
    pub memories: usize,
    pub failures: usize,
    /// Rows written and jobs finished, summed: it grows whenever the run moves (a finished
    /// run's record no longer holds its jobs, so it is not compared with one in flight).
    pub done: usize,
}

/// The run in `folder` as it is now (its rows counted by `site`, which reads each file once).
pub(super) fn now(site: &Site, folder: &RunFolder) -> Live {
    let record = folder
        .read_text(RUN)
        .ok()
        .and_then(|text| RunRecord::parse(&text));
    let finished = folder.file(REPORT_JSON).is_file();
    let lines = |name: &str| site.lines(&folder.file(name));
    let (state, progress, seconds, updated, failures) = match record {
        Some(record) => {
            let orphaned = record.orphaned();
            let progress = record.progress.unwrap_or_default();
            let state = if finished {
                "finished".to_owned()
            } else if orphaned {
                "stopped".to_owned()
            } else {
                serde_json::to_value(progress.state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default()
            };
            let seconds = if finished {
                record.seconds
            } else {
                progress.seconds
            };
            (
                state,
                progress.clone(),
                seconds,
                progress.updated,
                record.failures,
            )
        }
        None => (
            "no record".to_owned(),
            LiveProgress::default(),
            0.0,
            String::new(),
            0,
        ),
    };
    let (results, memories) = (lines(RESULTS), lines(MEMORIES));
    let jobs: usize = progress.stages.values().map(|s| s.finished).sum();
    Live {
        done: results + memories + jobs,
        finished,
        state,
        seconds,
        updated,
        progress,
        results,
        memories,
        failures,
    }
}

/// The live page, filled with `live` and refreshed by its script.
pub(super) fn page_of(id: &str, live: &Live) -> String {
    let mut body = format!(
        "<p><a href=\"/run?run={q}\">the run's page</a> (once it has its report)</p>\n\
         <p>State <b id=\"state\">{}</b> · <span id=\"seconds\">{:.0}</span> s · updated <span id=\"updated\">{}</span></p>\n\
         <p>Rows written: <span id=\"results\">{}</span> answers, <span id=\"memories\">{}</span> memories · \
         cost so far <span id=\"cost\">{:.4}</span> USD · audit judgements <span id=\"audited\">{}</span></p>\n",
        escape_html(&live.state),
        live.seconds,
        escape_html(&live.updated),
        live.results,
        live.memories,
        live.progress.cost_usd,
        live.progress.audited,
        q = query(id),
    );
    body.push_str(
        "<h2>Stages</h2>\n<table id=\"stages\"><tr><th>stage</th><th class=\"n\">planned</th>\
         <th class=\"n\">finished</th><th class=\"n\">cached</th><th class=\"n\">shared</th>\
         <th class=\"n\">failed</th><th>done</th></tr>\n",
    );
    for (stage, c) in &live.progress.stages {
        let share = if c.planned == 0 {
            0.0
        } else {
            c.finished as f64 / c.planned as f64
        };
        let _ = writeln!(
            body,
            "<tr data-stage=\"{s}\"><td>{s}</td><td class=\"n\">{}</td><td class=\"n\" data-field=\"finished\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td><span class=\"bar\" style=\"width:{:.1}em\"></span></td></tr>",
            c.planned,
            c.finished,
            c.cached,
            c.shared,
            c.failed,
            share * 10.0,
            s = escape_html(stage),
        );
    }
    body.push_str(
        "</table>\n<h2>Model endpoints</h2>\n<table id=\"endpoints\"><tr><th>endpoint</th>\
         <th class=\"n\">in flight</th><th class=\"n\">limit</th><th class=\"n\">peak</th>\
         <th class=\"n\">pace (req/min)</th><th class=\"n\">429s</th><th class=\"n\">replies/s</th></tr>\n",
    );
    for (name, e) in &live.progress.endpoints {
        let _ = writeln!(
            body,
            "<tr data-endpoint=\"{}\"><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            escape_html(name),
            escape_html(name),
            e.in_flight,
            e.limit,
            e.peak_in_flight,
            e.pace_rpm.map_or("learning".to_owned(), |p| format!("{p}")),
            e.rate_limited,
            e.throughput,
        );
    }
    body.push_str("</table>\n<pre id=\"history\"></pre>\n");
    let _ = write!(body, "<script>{}</script>", SCRIPT.replace("RUN", &query(id)));
    page(&format!("Live: {id}"), &body)
}

/// Asks `/live.json` for the next change (it answers when the run moves, or
/// after a few seconds) and rewrites the figures; each distinct `done` seen is
/// appended to `#history` (rows written and jobs finished), and `finished` once the run is,
/// when it stops.
const SCRIPT: &str = r#"
(function () {
  const seen = [];
  let after = '';
  const set = (id, v) => { const e = document.getElementById(id); if (e) e.textContent = v; };
  async function tick() {
    let live;
    try { live = await (await fetch('/live.json?run=RUN' + after, {cache: 'no-store'})).json(); }
    catch (e) { setTimeout(tick, 1000); return; }
    set('state', live.state); set('seconds', Math.round(live.seconds)); set('updated', live.updated);
    set('results', live.results); set('memories', live.memories);
    set('cost', live.progress.cost_usd.toFixed(4)); set('audited', live.progress.audited);
    for (const [stage, c] of Object.entries(live.progress.stages || {})) {
      const row = document.querySelector('tr[data-stage="' + stage + '"]');
      if (!row) continue;
      const cells = row.querySelectorAll('td');
      [c.planned, c.finished, c.cached, c.shared, c.failed].forEach((v, i) => cells[i + 1].textContent = v);
      const share = c.planned ? c.finished / c.planned : 0;
      cells[6].firstChild.style.width = (share * 10).toFixed(1) + 'em';
    }
    const table = document.getElementById('endpoints');
    table.querySelectorAll('tr[data-endpoint]').forEach((row) => row.remove());
    for (const [name, e] of Object.entries(live.progress.endpoints || {})) {
      const row = table.insertRow();
      row.dataset.endpoint = name;
      [name, e.in_flight, e.limit, e.peak_in_flight, e.pace_rpm ?? 'learning', e.rate_limited, e.throughput]
        .forEach((v, i) => { const td = row.insertCell(); td.textContent = v; if (i) td.className = 'n'; });
    }
    const now = live.finished ? 'finished' : live.done;
    if (seen[seen.length - 1] !== now) {
      seen.push(now);
      set('history', seen.join(' '));
    }
    after = '&after=' + live.done;
    if (!live.finished) setTimeout(tick, 250);
  }
  tick();
})();
"#;
