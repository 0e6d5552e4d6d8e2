//! A diff as Markdown: the settings that changed, each cell's metrics side by side with their
//! paired tests, the judge audits, and the questions that flipped.

use super::{AuditDiff, CellLabel, Diff, Direction, SettingChange};

/// One line: how many cells of both runs changed, which way, and how many settings differ.
/// A cell is better where its Micro rose (or, Micro equal, its Macro), worse where it fell.
pub(super) fn summary(diff: &Diff) -> String {
    let (mut better, mut worse, mut same) = (0, 0, 0);
    for cell in &diff.cells {
        let sign = |delta: Option<f64>| delta.map_or(0.0, f64::signum);
        match (sign(cell.micro_delta), sign(cell.macro_delta)) {
            (m, _) if m > 0.0 => better += 1,
            (m, _) if m < 0.0 => worse += 1,
            (_, a) if a > 0.0 => better += 1,
            (_, a) if a < 0.0 => worse += 1,
            _ => same += 1,
        }
    }
    let settings = diff.settings.len();
    format!(
        "**{} of {} cell(s) changed** ({better} better, {worse} worse; {} regression(s) by the tests below), {same} unchanged; {settings} setting(s) changed{}.",
        better + worse,
        diff.cells.len(),
        diff.regressions,
        match (diff.only_in_a.len(), diff.only_in_b.len()) {
            (0, 0) => String::new(),
            (a, b) => format!("; {a} cell(s) only in A, {b} only in B"),
        }
    )
}

/// The settings that differ, as a Markdown table.
pub(super) fn settings_table(settings: &[SettingChange]) -> String {
    let mut out = String::new();
    if settings.is_empty() {
        out.push_str("No setting changed.\n\n");
    } else {
        out.push_str("| key | A | B |\n|---|---|---|\n");
        for s in settings {
            let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "—".into()).replace('|', "\\|");
            out.push_str(&format!("| {} | {} | {} |\n", s.key, show(&s.a), show(&s.b)));
        }
        out.push('\n');
    }
    out
}

/// The audit judges' agreement in both runs, as a Markdown section (nothing without one).
pub(super) fn audit_table(audits: &[AuditDiff]) -> String {
    let mut out = String::new();
    if !audits.is_empty() {
        let number = |v: Option<f64>| v.map_or("—".to_owned(), |v| format!("{v:.3}"));
        let count = |v: Option<u64>| v.map_or("—".to_owned(), |v| v.to_string());
        out.push_str("\n## Judge audit\n\nEach audit judge against the scoring judge, in A and in B.\n\n| audit judge | compared A | compared B | agreement A | agreement B | κ A | κ B |\n|---|---:|---:|---:|---:|---:|---:|\n");
        for j in audits {
            out.push_str(&format!(
                "| `{}` | {} | {} | {} | {} | {} | {} |\n",
                j.judge,
                count(j.compared_a),
                count(j.compared_b),
                number(j.agreement_a),
                number(j.agreement_b),
                number(j.kappa_a),
                number(j.kappa_b),
            ));
        }
    }
    out
}

/// The diff as Markdown; with `colour`, gains green and losses red (ANSI).
pub(crate) fn render(diff: &Diff, colour: bool) -> String {
    let paint = |value: f64, text: String| match (colour, value) {
        (true, v) if v > 0.0 => format!("\x1b[32m{text}\x1b[0m"),
        (true, v) if v < 0.0 => format!("\x1b[31m{text}\x1b[0m"),
        _ => text,
    };
    let cell = |c: &CellLabel| format!("{} | {} | {}", c.compressor, c.condition, c.ratio);
    // Nothing measured is `n/a`, never a number.
    let number = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{v:.3}"));
    let delta = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| paint(v, format!("{v:+.3}")));
    let mut out = format!(
        "# gacc diff\n\n- A: `{}`\n- B: `{}`\n\n{}\n\n## Settings\n\n",
        diff.a,
        diff.b,
        summary(diff)
    );
    out.push_str(&settings_table(&diff.settings));
    out.push_str("## Cells\n\nMicro: paired sign-flip permutation over the goals both runs scored (a goal's questions share one memory, so goals, not questions, are the units); McNemar over questions, which counts them as independent, is shown beside it and decides nothing. Macro: paired bootstrap over goals (10,000 resamples), 95% interval of B − A. A cell is *better* or *worse* where either test says so at 0.05, else *within noise* (with the smallest Micro difference its goals detect).\n\n");
    out.push_str("| compressor | condition | ratio | Micro A | Micro B | Δ Micro | goals | goal p | right→wrong | wrong→right | McNemar p (questions) | Macro A | Macro B | Δ Macro | 95% interval | verdict |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n");
    for c in &diff.cells {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.4} | {} | {} | {} | {} | {} | {} | [{:+.3}, {:+.3}] | {} |\n",
            cell(&c.cell),
            number(c.micro_a),
            number(c.micro_b),
            delta(c.micro_delta),
            c.micro_test.goals,
            c.micro_test.p_value,
            c.mcnemar.right_to_wrong,
            c.mcnemar.wrong_to_right,
            if c.mcnemar.p_value < 1e-4 {
                format!("{:.1e}", c.mcnemar.p_value)
            } else {
                format!("{:.4}", c.mcnemar.p_value)
            },
            number(c.macro_a),
            number(c.macro_b),
            delta(c.macro_delta),
            c.macro_bootstrap.ci95_low,
            c.macro_bootstrap.ci95_high,
            match c.verdict {
                "worse" => paint(-1.0, c.verdict_text()),
                "better" => paint(1.0, c.verdict_text()),
                _ => c.verdict_text(),
            },
        ));
    }
    for (title, cells) in [("Only in A", &diff.only_in_a), ("Only in B", &diff.only_in_b)] {
        if !cells.is_empty() {
            out.push_str(&format!("\n## {title}\n\n"));
            for c in cells.iter() {
                out.push_str(&format!("- {}\n", cell(c).replace(" | ", " · ")));
            }
        }
    }
    out.push_str(&super::why::table(&diff.why));
    out.push_str(&diff.frontier.table());
    out.push_str(&audit_table(&diff.judge_audit));
    let count = |d: Direction| diff.flipped.iter().filter(|f| f.direction == d).count();
    out.push_str(&format!(
        "\n## Flipped questions\n\n{} right→wrong, {} wrong→right.\n",
        count(Direction::Lost),
        count(Direction::Gained)
    ));
    if !diff.flipped.is_empty() {
        out.push_str("\n| compressor | condition | ratio | seed | question | | answer A | answer B |\n|---|---|---:|---:|---|---|---|---|\n");
        for f in &diff.flipped {
            let clip = |s: &str| {
                let s: String = s.chars().take(80).collect();
                s.replace('|', "\\|").replace('\n', " ")
            };
            out.push_str(&format!(
                "| {} | {} | {} `{}` | {} | {} | {} |\n",
                cell(&f.cell),
                f.seed,
                clip(&f.question),
                f.question_id,
                paint(
                    if f.direction == Direction::Gained {
                        1.0
                    } else {
                        -1.0
                    },
                    f.direction.as_str().to_owned()
                ),
                clip(&f.answer_a),
                clip(&f.answer_b),
            ));
        }
    }
    out
}
