//! Charts written beside a report, as SVG: Micro and Macro against the retention ratio (a line
//! per compressor, a panel per condition), and where each compressor's budget went.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;
use serde_json::Value;

use super::stored::{StoredCell, StoredPoint, StoredReport, text};

/// Each chart file a report gets, with the title report.md shows it under.
pub(crate) const CHARTS: &[(&str, &str)] = &[
    ("micro.svg", "Micro against the retention ratio"),
    ("macro.svg", "Macro against the retention ratio"),
    ("micro-tokens.svg", "Micro against the budget in tokens"),
    ("macro-tokens.svg", "Macro against the budget in tokens"),
    ("budget.svg", "Budget: tokens retained and left unused"),
    (
        "frontier.svg",
        "Micro against cost per question, the frontier marked",
    ),
];

const PANEL: (u32, u32) = (420, 340);

/// Writes every chart of `report` (a `report.json` value) into `folder`.
pub(crate) fn write(folder: &Path, report: &Value) -> Result<(), String> {
    let report = StoredReport::of(report);
    let cells = &report.cells;
    let conditions: Vec<String> = report.experiment.conditions.iter().map(text).collect();
    let (ratio_cells, token_cells): (Vec<&StoredCell>, Vec<&StoredCell>) =
        cells.iter().partition(|cell| cell.budget_tokens.is_none());
    let most = token_cells
        .iter()
        .filter_map(|c| c.budget_tokens.as_ref()?.as_f64())
        .fold(0.0, f64::max);
    let ratio = Axis {
        at: |cell| cell.ratio.as_f64(),
        description: "retention ratio r (share of source tokens)",
        end: 1.0,
    };
    let tokens = Axis {
        at: |cell| cell.budget_tokens.as_ref()?.as_f64(),
        description: "budget L in tokens (at most the source's)",
        end: (most * 1.05).max(1.0),
    };
    for (metric, label) in [
        ("micro", "Micro (share of questions right)"),
        ("macro", "Macro (share of goals all right)"),
    ] {
        let file = format!("{metric}.svg");
        metric_chart(
            &folder.join(&file),
            &ratio_cells,
            &conditions,
            metric,
            label,
            &ratio,
        )
        .map_err(|e| format!("{file}: {e}"))?;
        if !token_cells.is_empty() {
            let file = format!("{metric}-tokens.svg");
            metric_chart(
                &folder.join(&file),
                &token_cells,
                &conditions,
                metric,
                label,
                &tokens,
            )
            .map_err(|e| format!("{file}: {e}"))?;
        }
    }
    budget_chart(&folder.join("budget.svg"), cells).map_err(|e| format!("budget.svg: {e}"))?;
    let frontier = folder.join("frontier.svg");
    match frontier_svg(&report, &conditions)? {
        Some(svg) => std::fs::write(&frontier, svg).map_err(|e| format!("frontier.svg: {e}")),
        // An older report has no frontier: no chart, and none left from before.
        None => match std::fs::remove_file(&frontier) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!("frontier.svg: {e}")),
            _ => Ok(()),
        },
    }
}

/// Micro against cost per question (SPEC §15), a panel per condition: cost on a log axis (a
/// free setting at its left edge), each compressor in its colour, the frontier's points joined
/// and ringed. None when the report has no frontier.
pub(crate) fn frontier_svg(report: &StoredReport, conditions: &[String]) -> Result<Option<String>, String> {
    if report.frontier.is_empty() {
        return Ok(None);
    }
    let mut svg = String::new();
    frontier_chart(&mut svg, &report.frontier, conditions).map_err(|e| format!("frontier.svg: {e}"))?;
    Ok(Some(svg))
}

fn frontier_chart(svg: &mut String, points: &[StoredPoint], conditions: &[String]) -> Chart {
    let mut panels: Vec<(String, Vec<&StoredPoint>)> = Vec::new();
    for point in points {
        let condition = text(&point.condition);
        match panels.iter_mut().find(|(c, _)| *c == condition) {
            Some((_, here)) => here.push(point),
            None => panels.push((condition, vec![point])),
        }
    }
    panels.sort_by_key(|(c, _)| conditions.iter().position(|have| have == c).unwrap_or(usize::MAX));
    let mut compressors: Vec<String> = points.iter().map(|p| text(&p.compressor)).collect();
    compressors.sort();
    compressors.dedup();
    // The log axis spans the costs that are not free, with room either side; a free point is
    // drawn at its left edge.
    let costs = points
        .iter()
        .map(|p| p.usd_per_question)
        .filter(|c| c.is_finite() && *c > 0.0);
    let (low, high) = costs.fold((f64::MAX, 0f64), |(low, high), c| (low.min(c), high.max(c)));
    let (low, high) = if high > 0.0 {
        (low / 3.0, high * 3.0)
    } else {
        (1e-6, 1e-3)
    };
    let count = panels.len().max(1) as u32;
    let root = SVGBackend::with_string(svg, (PANEL.0 * count, PANEL.1)).into_drawing_area();
    root.fill(&WHITE)?;
    for (area, (condition, here)) in root.split_evenly((1, count as usize)).iter().zip(&panels) {
        let mut chart = ChartBuilder::on(area)
            .caption(format!("frontier · {condition}"), ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d((low..high).log_scale(), 0f64..1f64)?;
        chart
            .configure_mesh()
            .x_desc("USD per question (compression + reading), log; free at the left edge")
            .y_desc("Micro")
            .x_label_formatter(&|x| format!("{x:.1e}"))
            .draw()?;
        let at = |p: &StoredPoint| (p.usd_per_question.clamp(low, high), p.micro.clamp(0.0, 1.0));
        let mut front: Vec<(f64, f64)> = here.iter().filter(|p| p.on_frontier()).map(|p| at(p)).collect();
        front.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(front.clone(), BLACK.stroke_width(1)))?
            .label("frontier")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK.stroke_width(1)));
        chart.draw_series(
            front
                .iter()
                .map(|point| Circle::new(*point, 7, BLACK.stroke_width(1))),
        )?;
        for (index, name) in compressors.iter().enumerate() {
            let colour = Palette99::pick(index).to_rgba();
            let mine: Vec<&&StoredPoint> = here.iter().filter(|p| text(&p.compressor) == *name).collect();
            if mine.is_empty() {
                continue;
            }
            chart
                .draw_series(mine.iter().map(|p| Circle::new(at(p), 4, colour.filled())))?
                .label(name.clone())
                .legend(move |(x, y)| Circle::new((x + 8, y), 4, colour.filled()));
            let labels = mine
                .iter()
                .map(|p| Text::new(p.budget(), at(p), ("sans-serif", 11).into_font().color(&colour)));
            chart.draw_series(labels)?;
        }
        legend(&mut chart)?;
    }
    root.present()?;
    Ok(())
}

type Chart = Result<(), Box<dyn std::error::Error>>;

/// A panel's legend, in its lower right corner on a light ground.
fn legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
) -> Chart
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// What a metric chart's x axis shows: a cell's budget, described, from 0 to `end`.
struct Axis {
    at: fn(&StoredCell) -> Option<f64>,
    description: &'static str,
    end: f64,
}
/// One panel's lines: compressor -> [(ratio, mean, its 95% interval over goals)].
type Lines = BTreeMap<String, Vec<(f64, f64, Option<(f64, f64)>)>>;

/// The chart drawn top to bottom (axes, series, legend), as plotters builds it.
fn metric_chart(
    path: &Path,
    cells: &[&StoredCell],
    conditions: &[String],
    metric: &str,
    label: &str,
    axis: &Axis,
) -> Chart {
    // condition -> compressor -> [(ratio, mean)]
    let mut panels: BTreeMap<String, Lines> = BTreeMap::new();
    for cell in cells {
        let (score, interval) = if metric == "micro" {
            (cell.micro, cell.micro_ci95)
        } else {
            (cell.macro_, cell.macro_ci95)
        };
        // A cell that measured nothing has no point.
        let Some(score) = score else { continue };
        let interval = interval.map(|i| (i.low, i.high));
        let point = ((axis.at)(cell).unwrap_or(0.0), score.mean, interval);
        panels
            .entry(text(&cell.condition))
            .or_default()
            .entry(text(&cell.compressor))
            .or_default()
            .push(point);
    }
    let compressors: Vec<String> = {
        let mut names: Vec<String> = panels.values().flat_map(|p| p.keys().cloned()).collect();
        names.sort();
        names.dedup();
        names
    };
    // Panels in the manifest's order of conditions.
    let mut order: Vec<(&String, &Lines)> = panels.iter().collect();
    order.sort_by_key(|(condition, _)| {
        conditions
            .iter()
            .position(|c| c == *condition)
            .unwrap_or(usize::MAX)
    });
    let count = order.len().max(1) as u32;
    let root = SVGBackend::new(path, (PANEL.0 * count, PANEL.1)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((1, count as usize));
    for (area, (condition, lines)) in areas.iter().zip(order) {
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{metric} · {condition}"), ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..axis.end, 0f64..1f64)?;
        chart
            .configure_mesh()
            .x_desc(axis.description)
            .y_desc(label)
            .draw()?;
        for (name, cells) in lines {
            let mut cells = cells.clone();
            cells.sort_by(|a, b| a.0.total_cmp(&b.0));
            let points: Vec<(f64, f64)> = cells.iter().map(|&(x, y, _)| (x, y)).collect();
            let index = compressors.iter().position(|c| c == name).unwrap_or(0);
            let colour = Palette99::pick(index).to_rgba();
            // Earlier compressors are drawn wider, so a line that another covers still shows.
            let width = 2 + 2 * (compressors.len() - 1 - index).min(3) as u32;
            chart
                .draw_series(LineSeries::new(points.clone(), colour.stroke_width(width)))?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], colour.stroke_width(width))
                });
            chart.draw_series(points.iter().map(|point| Circle::new(*point, 3, colour.filled())))?;
            // Each point's 95% interval over goals, as a bar: what the gap to another line
            // must clear before it says anything (the Pairs section tests it).
            let bars = cells.iter().filter_map(|&(x, _, interval)| {
                let (low, high) = interval?;
                Some(PathElement::new(
                    vec![(x, low), (x, high)],
                    colour.mix(0.6).stroke_width(1),
                ))
            });
            chart.draw_series(bars)?;
        }
        if metric == "micro" {
            anchor_lines(&mut chart, cells, condition, axis.end)?;
        }
        legend(&mut chart)?;
    }
    root.present()?;
    Ok(())
}

/// The floor and the ceiling of a Micro panel (SPEC §11) as dashed lines across it: each the
/// mean over the panel's cells (their questions are the same ones).
fn anchor_lines<DB: DrawingBackend>(
    chart: &mut ChartContext<
        '_,
        DB,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    cells: &[&StoredCell],
    condition: &str,
    end: f64,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let here: Vec<&&StoredCell> = cells.iter().filter(|c| text(&c.condition) == condition).collect();
    type Anchor = (&'static str, fn(&StoredCell) -> Option<f64>, RGBColor);
    let lines: [Anchor; 2] = [
        ("floor (empty memory)", |c| c.floor_micro, RGBColor(120, 120, 120)),
        (
            "ceiling (whole source)",
            |c| c.ceiling_micro,
            RGBColor(20, 20, 20),
        ),
    ];
    for (label, value, colour) in lines {
        let values: Vec<f64> = here.iter().filter_map(|c| value(c)).collect();
        if values.is_empty() {
            continue;
        }
        let level = values.iter().sum::<f64>() / values.len() as f64;
        let style = colour.stroke_width(2);
        chart
            .draw_series(DashedLineSeries::new([(0.0, level), (end, level)], 8, 5, style))?
            .label(format!("{label}: {level:.3}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style));
    }
    Ok(())
}

fn budget_chart(path: &Path, cells: &[StoredCell]) -> Chart {
    // compressor -> (retained, unused) tokens over all its cells
    let mut totals: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for cell in cells {
        let entry = totals.entry(text(&cell.compressor)).or_default();
        entry.0 += cell.ledger.retained_tokens;
        entry.1 += cell.ledger.unused_budget;
    }
    let names: Vec<String> = totals.keys().cloned().collect();
    let top = totals.values().map(|(r, u)| r + u).fold(1.0, f64::max) * 1.3;
    let width = (170 * names.len().max(1) as u32).max(PANEL.0);
    let root = SVGBackend::new(path, (width, PANEL.1)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("budget use per compressor (all cells)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d((0..names.len().max(1) as i32).into_segmented(), 0f64..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => names.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_label_formatter(&|y| format!("{y:.0}"))
        .x_desc("compressor")
        .y_desc("tokens (cl100k_base)")
        .draw()?;
    let retained = BLUE.mix(0.7);
    let unused = RGBColor(230, 140, 40).mix(0.8);
    for (i, (r, u)) in totals.values().enumerate() {
        let i = i as i32;
        let bar = |from: f64, to: f64, colour: RGBAColor| {
            Rectangle::new(
                [(SegmentValue::Exact(i), from), (SegmentValue::Exact(i + 1), to)],
                colour.filled(),
            )
        };
        let lower = chart.draw_series(std::iter::once(bar(0.0, *r, retained)))?;
        if i == 0 {
            lower
                .label("retained tokens")
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], retained.filled()));
        }
        let upper = chart.draw_series(std::iter::once(bar(*r, r + u, unused)))?;
        if i == 0 {
            upper
                .label("unused budget")
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], unused.filled()));
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
