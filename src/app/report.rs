//! `gacc report RUN_DIR`: a finished run's views made again from what its folder holds.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Invalid};
use crate::report::html::Packing;
use crate::report::view::{Charts, Html, Markdown, RunView, write_views};
use crate::report::{load_template, render};
use crate::store::run_folder::{REPORT_JSON, RUN, RunFolder};

/// `gacc report RUN`: rewrites a run's views, or renders `template` to stdout.
pub fn report(runs: &Path, run: &Path, template: Option<&Path>) -> Result<super::Ended, Error> {
    if let Some(text) = rerender(crate::store::run_folder::resolve(run, runs)?.path(), template)? {
        super::terminal::emit(&text);
    }
    Ok(super::Ended::Success)
}

/// `gacc report RUN --format latex|csv`: the run's results as paper tables, on stdout or in
/// `output`.
pub fn report_tables(
    runs: &Path,
    run: &Path,
    format: Tables,
    output: Option<&Path>,
) -> Result<super::Ended, Error> {
    let text = tables(crate::store::run_folder::resolve(run, runs)?.path(), format)?;
    match output {
        Some(path) => crate::files::write(path, text.as_bytes())?,
        None => super::terminal::emit(&text),
    }
    Ok(super::Ended::Success)
}

/// Rewrites `report.md`, the charts and `report.html` from the stored `report.json`, `run.json`
/// and rows (an error names the file that is missing or wrong); or renders `template` and
/// returns the text.
pub(super) fn rerender(folder: &Path, template: Option<&Path>) -> Result<Option<String>, Error> {
    let folder = RunFolder::open(folder);
    let report = folder.read_json(REPORT_JSON)?;
    let run = folder.read_json(RUN).unwrap_or(Value::Null);
    let (text, name) = load_template(template).map_err(|message| Invalid::one("--template", message))?;
    if template.is_some() {
        let rendered =
            render(&text, &name, &report, &run).map_err(|message| Invalid::one("template", message))?;
        return Ok(Some(rendered));
    }
    let view = RunView {
        report: &report,
        run: &run,
        rows: None,
        page_key: None,
    };
    let markdown = Markdown {
        template: text,
        template_name: name,
    };
    write_views(&folder, &view, &[&Charts, &Html(Packing::Auto), &markdown])?;
    Ok(None)
}

/// What `gacc report --format` writes: paper tables of the run's results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tables {
    /// booktabs tables, one per condition, for `\input{}`.
    Latex,
    /// The same figures, one row per cell.
    Csv,
}

/// The run's results as `format` tables (SPEC §15), from its report.json.
pub(super) fn tables(folder: &Path, format: Tables) -> Result<String, Error> {
    let folder = RunFolder::open(folder);
    let report = crate::report::stored::StoredReport::of(&folder.read_json(REPORT_JSON)?);
    Ok(match format {
        Tables::Latex => crate::report::tables::latex(&report),
        Tables::Csv => crate::report::tables::csv(&report),
    })
}
