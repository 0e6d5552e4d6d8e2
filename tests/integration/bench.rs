//! `gacc bench --baseline`: this gacc against another binary, side by side, as ratios.

use serde_json::Value;

use crate::common;
use common::{Scratch, gacc_binary};

#[test]
fn bench_against_a_baseline_says_each_ratio_and_whether_the_counts_agree() {
    let scratch = Scratch::empty();
    let baseline = gacc_binary().display().to_string();
    let out = (scratch.gacc())
        .args([
            "bench",
            "--folder",
            "b",
            "--sources",
            "3",
            "--goals",
            "3",
            "--questions",
            "6",
        ])
        .args([
            "--compressors",
            "1",
            "--tokens",
            "300",
            "--spawns",
            "10",
            "--rounds",
            "2",
        ])
        .args(["--baseline", &baseline])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let measurements: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(scratch.path("b/bench.json")).unwrap()).unwrap();
    let compared: Vec<&Value> = (measurements.iter())
        .filter(|m| m["name"].as_str().unwrap().starts_with("vs baseline: "))
        .collect();
    let names: Vec<&str> = compared.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "vs baseline: full run on an empty cache, one each",
            "vs baseline: run folder",
            "vs baseline: cached re-run, median of 2",
            "vs baseline: gacc dataset stats, median of 2",
        ],
        "{stdout}"
    );
    for m in &compared {
        assert!(stdout.contains(m["name"].as_str().unwrap()), "{stdout}");
        let (this, baseline) = (
            m["detail"]["this"].as_f64().unwrap(),
            m["detail"]["baseline"].as_f64().unwrap(),
        );
        assert!(this > 0.0 && baseline > 0.0, "{m}");
        let ratio = m["detail"]["ratio"].as_f64().unwrap();
        assert!((ratio - this / baseline).abs() < 1e-3, "{m}");
    }
    let units: Vec<_> = compared.iter().map(|m| m["unit"].as_str()).collect();
    assert_eq!(units, [Some("s"), Some("MB"), Some("s"), Some("s")]);
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("vs baseline: run folder ") && l.contains(" MB ")),
        "{stdout}"
    );
    // The same binary on both sides: the same run folder, give or take its timings' digits.
    let folder = compared[1]["detail"]["ratio"].as_f64().unwrap();
    assert!((0.95..=1.05).contains(&folder), "{}", compared[1]);
    assert_eq!(compared[2]["detail"]["each_this"].as_array().unwrap().len(), 2);
    assert_eq!(compared[3]["detail"]["same_tokens"], true, "{}", compared[3]);
}
