//! `gacc report RUN_DIR`: a finished run's views made again from what its folder holds.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Invalid};
use crate::report::html::Packing;
use crate::report::view::{Charts, Html, Markdown, RunView, write_views};
use crate::report::{load_template, render};
use crate::store::run_folder::{REPORT_JSON, RUN, RunFolder};

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
