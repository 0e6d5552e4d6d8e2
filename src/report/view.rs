//! The views of a run, made from its `report.json` (and, for the page, its rows): one trait,
//! one writer, one failure policy, whichever command writes them (`gacc run`, `gacc report`).

use std::path::PathBuf;

use serde_json::Value;

use crate::error::Error;
use crate::report::html::{self, Packing, Rows};
use crate::store::run_folder::{REPORT_MD, RunFolder};

/// What views are made of.
pub(crate) struct RunView<'a> {
    /// `report.json` as a value.
    pub report: &'a Value,
    /// `run.json` as a value (Null when a folder has none).
    pub run: &'a Value,
    /// The run's rows still in memory; None: read them from the folder.
    pub rows: Option<Rows<'a>>,
    /// What the page is made from, hashed (report and rows): a page of another run of the
    /// experiment made from the same is shared, not made again.
    pub page_key: Option<&'a str>,
}

/// One way of showing a run, written into its folder.
pub(crate) trait View {
    /// What it writes, for messages.
    fn name(&self) -> &'static str;
    fn write(&self, folder: &RunFolder, run: &RunView) -> Result<(), Error>;
}

/// `report.md`, rendered from a minijinja template.
pub(crate) struct Markdown {
    pub template: String,
    pub template_name: String,
}

impl View for Markdown {
    fn name(&self) -> &'static str {
        REPORT_MD
    }

    fn write(&self, folder: &RunFolder, run: &RunView) -> Result<(), Error> {
        let text = crate::report::render(&self.template, &self.template_name, run.report, run.run)
            .map_err(|message| failed(self, folder, message))?;
        folder.write(REPORT_MD, text.as_bytes())
    }
}

/// The SVG charts.
pub(crate) struct Charts;

impl View for Charts {
    fn name(&self) -> &'static str {
        "charts"
    }

    fn write(&self, folder: &RunFolder, run: &RunView) -> Result<(), Error> {
        crate::report::charts::write(folder.path(), run.report)
            .map_err(|message| failed(self, folder, message))
    }
}

/// `report.html`, the self-contained page (it inlines the charts: write them first).
pub(crate) struct Html(pub Packing);

impl View for Html {
    fn name(&self) -> &'static str {
        crate::store::run_folder::REPORT_HTML
    }

    fn write(&self, folder: &RunFolder, run: &RunView) -> Result<(), Error> {
        match run.rows {
            Some(rows) => match run.page_key {
                Some(key) => folder.write_shared(crate::store::run_folder::REPORT_HTML, key, |path| {
                    html::write_rows_to(path, folder, run.report, rows, self.0)
                }),
                None => html::write_rows(folder, run.report, rows, self.0),
            },
            None => html::write(folder, self.0),
        }
        .map(|_| ())
    }
}

fn failed(view: &dyn View, folder: &RunFolder, message: String) -> Error {
    Error::Io {
        path: folder.path().join(view.name()),
        message,
    }
}

/// Writes every view, in order; one that fails does not stop the others. When any failed,
/// the error names each (the run's data files are written before the views, so nothing is
/// lost, and `gacc report` makes them again).
pub(crate) fn write_views(folder: &RunFolder, run: &RunView, views: &[&dyn View]) -> Result<(), Error> {
    let mut failures: Vec<(PathBuf, String)> = Vec::new();
    for view in views {
        if let Err(error) = view.write(folder, run) {
            failures.push(match error {
                Error::Io { path, message } => (path, message),
                other => (folder.file(view.name()), other.to_string()),
            });
        }
    }
    let mut failures = failures.into_iter();
    let Some((path, mut message)) = failures.next() else {
        return Ok(());
    };
    for (other, why) in failures {
        message.push_str(&format!("; and {}: {why}", other.display()));
    }
    Err(Error::Io { path, message })
}
