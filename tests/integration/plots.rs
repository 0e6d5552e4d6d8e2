//! Charts beside each report: valid SVG, with labelled axes, a legend, and every series.

use crate::common;

use common::Scratch;

fn texts(svg: &str) -> Vec<String> {
    let document = roxmltree::Document::parse(svg).expect("the chart is well-formed XML");
    assert_eq!(document.root_element().tag_name().name(), "svg");
    document
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text().map(|t| t.trim().to_owned()))
        .collect()
}

/// The interval bars of a chart: polylines of two points with one x, drawn translucent (the
/// axes' ticks are opaque); each bar's length in pixels.
fn interval_bars(svg: &str) -> Vec<f64> {
    let document = roxmltree::Document::parse(svg).unwrap();
    document
        .descendants()
        .filter(|n| n.has_tag_name("polyline") && n.attribute("opacity") != Some("1"))
        .filter_map(|n| {
            let points: Vec<(f64, f64)> = (n.attribute("points")?.split_whitespace())
                .filter_map(|p| {
                    let (x, y) = p.split_once(',')?;
                    Some((x.parse().ok()?, y.parse().ok()?))
                })
                .collect();
            match points[..] {
                [(x1, y1), (x2, y2)] if x1 == x2 => Some((y1 - y2).abs()),
                _ => None,
            }
        })
        .collect()
}

#[test]
fn the_baselines_charts_hold_every_series() {
    let scratch = Scratch::new();
    let (status, folder, _) = scratch.run("experiments/baselines.toml", &[]);
    assert_eq!(status, 0);
    let compressors = ["goal-bm25", "identity", "prefix", "random-sentences"];
    for (file, metric) in [("micro.svg", "micro"), ("macro.svg", "macro")] {
        let svg = std::fs::read_to_string(folder.join(file)).unwrap();
        let texts = texts(&svg);
        for condition in ["own-goal", "no-goal", "cross-goal"] {
            assert!(
                texts.contains(&format!("{metric} · {condition}")),
                "{file}: panel {condition}"
            );
        }
        for compressor in compressors {
            assert_eq!(
                texts.iter().filter(|t| *t == compressor).count(),
                3,
                "{file}: {compressor} in each legend"
            );
        }
        assert!(
            texts.iter().any(|t| t.starts_with("retention ratio r")),
            "{file}: x axis label"
        );
        // One line per compressor and panel, plus the legend's sample lines.
        let lines = svg.matches("<polyline").count();
        assert!(lines >= 3 * compressors.len(), "{file}: {lines} lines");
        // Each point's 95% interval over goals is a vertical bar from its low to its high.
        let report = common::read_json(&folder.join("report.json"));
        let cells = report["cells"].as_array().unwrap();
        let intervals = (cells.iter())
            .filter(|cell| cell[format!("{metric}_ci95")]["low"].is_number())
            .count();
        assert_eq!(intervals, cells.len(), "{file}: every cell has its interval");
        let bars = interval_bars(&svg);
        assert_eq!(bars.len(), intervals, "{file}: a bar per interval");
        let visible = bars.iter().filter(|length| **length >= 3.0).count();
        assert!(visible >= 6, "{file}: {visible} bars of 3 pixels or more");
    }
    let budget = texts(&std::fs::read_to_string(folder.join("budget.svg")).unwrap());
    for label in
        compressors
            .iter()
            .copied()
            .chain(["retained tokens", "unused budget", "tokens (cl100k_base)"])
    {
        assert!(budget.iter().any(|t| t == label), "budget.svg: {label}");
    }
    let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
    for file in ["micro.svg", "macro.svg", "budget.svg"] {
        assert!(markdown.contains(&format!("]({file})")), "report.md shows {file}");
    }
    // gacc report draws them again from report.json.
    std::fs::remove_file(folder.join("micro.svg")).unwrap();
    assert!(
        scratch
            .gacc()
            .arg("report")
            .arg(&folder)
            .output()
            .unwrap()
            .status
            .success()
    );
    assert!(folder.join("micro.svg").is_file());
}
