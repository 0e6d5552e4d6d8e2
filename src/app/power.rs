//! `gacc plan --power`: before anything is paid, the smallest paired difference the manifest's
//! goals can detect (SPEC §13), and the goals an effect needs, from a pilot run's per-goal
//! differences or, without one, from a stated worst case.

use std::path::Path;

use serde::Serialize;

use crate::error::Error;
use crate::report::pairs::{Z_SUM, goals_needed, largest_sd};
use crate::store::ledger::ResultRow;
use crate::store::run_folder::{RESULTS, resolve};
use crate::store::run_record::newest_first;

/// What `gacc plan --power` is asked: the effect to size for, and a pilot run.
#[derive(Debug, Clone)]
pub struct PowerAsked {
    pub effect: Option<f64>,
    pub pilot: Option<std::path::PathBuf>,
}

/// `gacc plan`: jobs per stage and how many the cache answers; with `power`, the smallest
/// difference the manifest's goals detect and the goals an effect needs (SPEC §13).
pub fn plan(
    manifest: &Path,
    sets: &[String],
    format: super::Format,
    (runs, asked): (&Path, Option<&PowerAsked>),
) -> Result<super::Ended, Error> {
    let preview = super::preview::plan_status(manifest, sets)?;
    let goals = preview.goals;
    let power = match asked {
        Some(asked) => Some(power(
            goals,
            asked.effect.unwrap_or(DEFAULT_EFFECT),
            asked.pilot.as_deref(),
            runs,
        )?),
        // Unasked, the text says it too when the experiment's last run compares a pair.
        None if format == super::Format::Text => (newest_first(&preview.runs).into_iter().next())
            .and_then(|(last, _)| power(goals, DEFAULT_EFFECT, Some(&last), runs).ok()),
        None => None,
    };
    let power = power.map(|p| (serde_json::to_value(&p).unwrap_or_default(), text(&p)));
    super::terminal::print_plan(&preview.stages, &preview.bounds, power, format);
    Ok(super::Ended::Success)
}

/// The effect `gacc plan --power` sizes for unless told (`--effect`).
pub(crate) const DEFAULT_EFFECT: f64 = 0.02;

/// Without a pilot: two independent goal scores in [0, 1], each of variance at most 1/4, so a
/// per-goal difference of variance at most 1/2.
const WORST_SD: f64 = std::f64::consts::FRAC_1_SQRT_2;

/// What `--power` says, as `gacc plan --json` gives it under `power`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Power {
    /// The goals each cell of the manifest scores.
    pub goals: usize,
    pub effect: f64,
    /// `pilot` or `worst-case`.
    pub basis: &'static str,
    /// The pilot run, where there was one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pilot: Option<String>,
    pub micro_mde: f64,
    pub macro_mde: f64,
    pub goals_needed: Needed,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Needed {
    pub micro: u64,
    #[serde(rename = "macro")]
    pub macro_: u64,
}

/// The power of `goals` per cell to detect `effect`, from `pilot` (a run folder, `latest` or -N
/// under `runs`) where given.
pub(crate) fn power(goals: usize, effect: f64, pilot: Option<&Path>, runs: &Path) -> Result<Power, Error> {
    if !(effect > 0.0 && effect <= 1.0) {
        return Err(usage(
            "--effect",
            format!("{effect}: give a difference above 0 and at most 1"),
        ));
    }
    let (basis, pilot, (micro, macro_)) = match pilot {
        None => ("worst-case", None, (WORST_SD, WORST_SD)),
        Some(given) => {
            let folder = resolve(given, runs)?;
            let rows: Vec<ResultRow> = folder.read_rows(RESULTS)?;
            let sd = largest_sd(&rows).ok_or_else(|| {
                usage(
                    "--pilot",
                    format!(
                        "{}: the run compares no two compressors on the same goals, so it says nothing of a paired difference",
                        folder.path().display()
                    ),
                )
            })?;
            ("pilot", Some(folder.path().display().to_string()), sd)
        }
    };
    let mde = |sd: f64| {
        if goals == 0 {
            f64::INFINITY
        } else {
            Z_SUM * sd / (goals as f64).sqrt()
        }
    };
    Ok(Power {
        goals,
        effect,
        basis,
        pilot,
        micro_mde: mde(micro),
        macro_mde: mde(macro_),
        goals_needed: Needed {
            micro: goals_needed(micro, effect),
            macro_: goals_needed(macro_, effect),
        },
    })
}

fn usage(place: &str, message: String) -> Error {
    Error::Invalid(crate::error::Invalid(vec![crate::error::Problem {
        place: place.to_owned(),
        message,
    }]))
}

/// The text `gacc plan --power` prints.
pub(crate) fn text(power: &Power) -> String {
    let basis = match &power.pilot {
        Some(pilot) => format!("the most variable pair of the pilot run {pilot}"),
        None => "a worst case, no pilot given: two independent goal scores of variance at most 1/4 each (give --pilot RUN for a measured one)".to_owned(),
    };
    format!(
        "\npower (α 0.05 two-sided, power 0.8, goals resampled: a goal's questions share one memory):\n\
         basis: {basis}\n\
         with the {} goals of each cell, the smallest paired difference detected: Micro {:.3}, Macro {:.3}\n\
         goals needed to detect {}: Micro {}, Macro {}\n",
        power.goals,
        power.micro_mde,
        power.macro_mde,
        power.effect,
        power.goals_needed.micro,
        power.goals_needed.macro_
    )
}
