//! `gacc report RUN_DIR`: a finished run's views made again from what its folder holds.

use std::path::Path;

use serde_json::Value;

use crate::report::{load_template, render};

/// `gacc report RUN_DIR`: rewrites `report.md` from the stored `report.json` and
/// `run.json`, the charts, and `report.html` from the stored rows (an error names the file
/// that is missing or wrong); or renders `template` and returns the text.
pub fn rerender(folder: &Path, template: Option<&Path>) -> Result<Option<String>, crate::error::Error> {
    use crate::error::Invalid;
    let read = |name: &str| -> Result<Value, crate::error::Error> {
        let path = folder.join(name);
        let text = std::fs::read_to_string(&path).map_err(|error| crate::error::Error::Io {
            path: path.clone(),
            message: format!("cannot read: {error} (is this a finished gacc run folder?)"),
        })?;
        serde_json::from_str(&text)
            .map_err(|error| Invalid::one(path.display().to_string(), error.to_string()).into())
    };
    let report = read("report.json")?;
    let run = read("run.json").unwrap_or(Value::Null);
    let custom = template.is_some();
    let (text, name) = load_template(template).map_err(|message| Invalid::one("--template", message))?;
    let rendered =
        render(&text, &name, &report, &run).map_err(|message| Invalid::one("template", message))?;
    if custom {
        Ok(Some(rendered))
    } else {
        if let Err(error) = crate::report::charts::write(folder, &report) {
            tracing::warn!(%error, "could not draw the charts");
        }
        crate::files::write(&folder.join("report.md"), rendered.as_bytes())?;
        crate::report::html::write(folder, crate::report::html::Packing::Auto).map_err(|error| {
            let (path, message) = error.into_parts();
            crate::error::Error::Io { path, message }
        })?;
        Ok(None)
    }
}
