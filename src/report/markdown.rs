//! `report.md`: a minijinja template rendered over `report.json` and `run.json`.

use std::path::Path;

use serde_json::Value;

/// The default `report.md` template, compiled in.
pub(crate) const DEFAULT_TEMPLATE: &str = include_str!("../../templates/report.md.j2");

/// Renders a template over a report (and the run's own record as `run`), with undefined
/// variables as errors that name the template line.
pub(crate) fn render(
    template: &str,
    template_name: &str,
    report: &Value,
    run: &Value,
) -> Result<String, String> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(true)
        .build()
    {
        env.set_syntax(syntax);
    }
    // Absent values (a condition not run, a cell that scored no question) print as `n/a`
    // rather than failing the template or reading as a zero.
    env.add_filter("fixed", |value: Option<f64>, places: Option<usize>| match value {
        Some(value) => format!("{value:.*}", places.unwrap_or(3)),
        None => "n/a".to_owned(),
    });
    env.add_filter("signed", |value: Option<f64>| match value {
        Some(value) => format!("{value:+.3}"),
        None => "n/a".to_owned(),
    });
    env.add_filter("percent", |value: f64| format!("{:.1}%", value * 100.0));
    // Text gacc did not write (ids, descriptions, failure reasons, served model names) is
    // escaped for Markdown: no HTML reaches a viewer, no `|` adds a table column. A template
    // opts out with `| safe`.
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::Custom(MARKDOWN.into()));
    env.set_formatter(|out, state, value| {
        let escaping = matches!(state.auto_escape(), minijinja::AutoEscape::Custom(mode) if mode == MARKDOWN);
        match value.as_str() {
            Some(text) if escaping && !value.is_safe() => out.write_str(&escape_markdown(text))?,
            _ => write!(out, "{value}")?,
        }
        Ok(())
    });
    env.add_template(template_name, template)
        .map_err(describe_template_error)?;
    let template = env.get_template(template_name).map_err(describe_template_error)?;
    let mut context = report.clone();
    if let Value::Object(fields) = &mut context {
        fields.insert("run".into(), run.clone());
    }
    let mut text = template
        .render(minijinja::Value::from(minijinja::value::Serde(&context)))
        .map_err(describe_template_error)?;
    if !text.ends_with('\n') {
        text.push('\n');
    }
    Ok(text)
}

/// The auto-escape mode of report templates.
const MARKDOWN: &str = "markdown";

/// `text` safe in Markdown, in a paragraph or a table cell: HTML's special characters as
/// entities, `|` and `\` escaped.
pub(crate) fn escape_markdown(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '|' => escaped.push_str("\\|"),
            '\\' => escaped.push_str("\\\\"),
            c => escaped.push(c),
        }
    }
    escaped
}

fn describe_template_error(error: minijinja::Error) -> String {
    let place = match (error.name(), error.line()) {
        (Some(name), Some(line)) => format!("{name}:{line}: "),
        (Some(name), None) => format!("{name}: "),
        _ => String::new(),
    };
    let detail = error.detail().map(|d| format!(" ({d})")).unwrap_or_default();
    format!("{place}{}{detail}", error.kind())
}

/// Reads a template file, or the compiled-in default when `path` is None.
pub(crate) fn load_template(path: Option<&Path>) -> Result<(String, String), String> {
    match path {
        None => Ok((DEFAULT_TEMPLATE.to_owned(), "report.md.j2".to_owned())),
        Some(path) => std::fs::read_to_string(path)
            .map(|text| (text, path.display().to_string()))
            .map_err(|error| format!("{}: cannot read the template: {error}", path.display())),
    }
}
