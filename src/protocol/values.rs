//! The values the SPEC's manifest and rows are made of: a retention ratio, a truncation mode,
//! a condition, a callback mode and a duration. Each reads and writes itself as the user wrote it.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A retention fraction held as the exact decimal the user wrote: `numerator / 10^scale`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ratio {
    numerator: u64,
    scale: u32,
}

/// The most decimal places a ratio may have (10^18 still fits a u64).
const MAX_SCALE: u32 = 18;

impl Ratio {
    /// The token budget `L = floor(r * N)`, in integer arithmetic.
    pub fn budget(self, source_tokens: usize) -> usize {
        let product = u128::from(self.numerator) * source_tokens as u128;
        (product / 10u128.pow(self.scale)) as usize
    }

    pub fn as_f64(self) -> f64 {
        self.numerator as f64 / 10f64.powi(self.scale as i32)
    }
}

impl Ord for Ratio {
    /// By value: 0.25 < 0.5 < 1.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let scale = self.scale.max(other.scale);
        let widen = |r: &Ratio| u128::from(r.numerator) * 10u128.pow(scale - r.scale);
        widen(self).cmp(&widen(other))
    }
}

impl PartialOrd for Ratio {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl FromStr for Ratio {
    type Err = String;

    /// Parses a plain decimal (`0.29`, `1`, `.5`, `1e-1` is refused) within `0..=1`.
    fn from_str(text: &str) -> Result<Self, String> {
        let expected = || format!("`{text}` is not a retention ratio: expected a decimal from 0 to 1");
        let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
        let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if (whole.is_empty() && fraction.is_empty()) || !all_digits(whole) || !all_digits(fraction) {
            return Err(expected());
        }
        let fraction = fraction.trim_end_matches('0');
        let scale = fraction.len() as u32;
        if scale > MAX_SCALE {
            return Err(format!("`{text}` has more than {MAX_SCALE} decimal places"));
        }
        let digits = format!("{whole}{fraction}");
        let digits = digits.trim_start_matches('0');
        let numerator: u64 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| expected())?
        };
        if u128::from(numerator) > 10u128.pow(scale) {
            return Err(format!("`{text}` is outside 0..=1"));
        }
        Ok(Ratio { numerator, scale })
    }
}

impl TryFrom<f64> for Ratio {
    type Error = String;

    /// Recovers the decimal the user wrote: Rust prints the shortest text that reads back
    /// as the same double, which for a written decimal is that decimal.
    fn try_from(value: f64) -> Result<Self, String> {
        if !value.is_finite() {
            return Err(format!("`{value}` is not a retention ratio"));
        }
        let text = format!("{value}");
        if text.contains('e') || text.starts_with('-') {
            return Err(format!("`{text}` is outside 0..=1"));
        }
        text.parse()
    }
}

impl fmt::Display for Ratio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scale = self.scale as usize;
        if scale == 0 {
            return write!(f, "{}", self.numerator);
        }
        let digits = format!("{:0>width$}", self.numerator, width = scale + 1);
        let (whole, fraction) = digits.split_at(digits.len() - scale);
        write!(f, "{whole}.{fraction}")
    }
}

impl Serialize for Ratio {
    /// Serialised as a JSON number with the exact digits the user wrote.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(self.as_f64())
    }
}

impl<'de> Deserialize<'de> for Ratio {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Number(f64),
            Text(String),
        }
        let ratio = match Written::deserialize(deserializer)? {
            Written::Number(value) => Ratio::try_from(value),
            Written::Text(text) => text.parse(),
        };
        ratio.map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for Ratio {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Ratio".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "a retention fraction in 0..=1, read as the exact decimal written",
            "anyOf": [
                {"type": "number", "minimum": 0, "maximum": 1},
                {"type": "string", "pattern": "^[0-9]*(\\.[0-9]*)?$", "minLength": 1}
            ]
        })
    }
}

/// A cell's budget rule: a retention fraction of each source (`L = floor(r · N)`), or a number of
/// tokens (`L = min(b, N)`). In a cell's JSON it is its `ratio` or its `budget_tokens`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "Budget")]
pub(crate) enum BudgetRule {
    Ratio(Ratio),
    #[serde(rename = "budget_tokens")]
    Tokens(usize),
}

impl BudgetRule {
    /// `L` for a source of `source_tokens` tokens.
    pub(crate) fn tokens(self, source_tokens: usize) -> usize {
        match self {
            BudgetRule::Ratio(ratio) => ratio.budget(source_tokens),
            BudgetRule::Tokens(tokens) => tokens.min(source_tokens),
        }
    }

    pub(crate) fn ratio(self) -> Option<Ratio> {
        match self {
            BudgetRule::Ratio(ratio) => Some(ratio),
            BudgetRule::Tokens(_) => None,
        }
    }

    pub(crate) fn budget_tokens(self) -> Option<usize> {
        match self {
            BudgetRule::Ratio(_) => None,
            BudgetRule::Tokens(tokens) => Some(tokens),
        }
    }

    /// From a row's `ratio` or `budget_tokens`.
    pub(crate) fn of(ratio: Option<Ratio>, tokens: Option<usize>) -> BudgetRule {
        match (ratio, tokens) {
            (Some(ratio), _) => BudgetRule::Ratio(ratio),
            (None, tokens) => BudgetRule::Tokens(tokens.unwrap_or(0)),
        }
    }
}

impl fmt::Display for BudgetRule {
    /// `r=0.25` or `L=128`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            BudgetRule::Ratio(ratio) => format!("r={ratio}"),
            BudgetRule::Tokens(tokens) => format!("L={tokens}"),
        };
        f.pad(&text)
    }
}

/// How a cut inside a multi-byte character is decoded (SPEC §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TruncationMode {
    /// Like tiktoken's `decode(errors="replace")`: the broken tail becomes U+FFFD.
    #[default]
    Replace,
    /// Drop the incomplete bytes.
    Utf8Safe,
}

impl TruncationMode {
    /// As a manifest and every key write it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TruncationMode::Replace => "replace",
            TruncationMode::Utf8Safe => "utf8-safe",
        }
    }
}

/// Which goal the compressor sees (SPEC §1).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
#[allow(clippy::enum_variant_names)] // the SPEC's names: own-goal, no-goal, cross-goal
pub(crate) enum Condition {
    OwnGoal,
    NoGoal,
    CrossGoal,
}

impl Condition {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Condition::OwnGoal => "own-goal",
            Condition::NoGoal => "no-goal",
            Condition::CrossGoal => "cross-goal",
        }
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// How a callback process serves its calls (SPEC §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Mode {
    #[default]
    Oneshot,
    Persistent,
}

impl Mode {
    /// As written in a manifest and in `GACC_MODE`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Mode::Oneshot => "oneshot",
            Mode::Persistent => "persistent",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A duration written as `500ms`, `60s`, `2m` or `1h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timeout(pub Duration);

impl FromStr for Timeout {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let expected = || format!("`{text}` is not a duration: expected e.g. `500ms`, `60s`, `2m`, `1h`");
        let number: u64 = number.parse().map_err(|_| expected())?;
        let millis = match unit.trim() {
            "ms" => Some(number),
            "s" | "" => number.checked_mul(1_000),
            "m" => number.checked_mul(60_000),
            "h" => number.checked_mul(3_600_000),
            _ => return Err(expected()),
        };
        match millis {
            Some(millis) if millis > 0 => Ok(Timeout(Duration::from_millis(millis))),
            _ => Err(format!("`{text}`: a timeout must be positive and finite")),
        }
    }
}

impl schemars::JsonSchema for Timeout {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Timeout".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "a duration: 500ms, 60s, 2m, 1h, or whole seconds",
            "anyOf": [
                {"type": "integer", "minimum": 1},
                {"type": "string", "pattern": "^[0-9]+ *(ms|s|m|h)?$"}
            ]
        })
    }
}

impl fmt::Display for Timeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.0.as_millis();
        if millis.is_multiple_of(1000) {
            write!(f, "{}s", millis / 1000)
        } else {
            write!(f, "{millis}ms")
        }
    }
}

impl Serialize for Timeout {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timeout {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Seconds(u64),
            Text(String),
        }
        match Written::deserialize(deserializer)? {
            Written::Seconds(seconds) => format!("{seconds}s").parse(),
            Written::Text(text) => text.parse(),
        }
        .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ratio(text: &str) -> Ratio {
        text.parse().unwrap()
    }

    #[test]
    fn parses_exact_decimals() {
        assert_eq!(
            ratio("0.29"),
            Ratio {
                numerator: 29,
                scale: 2
            }
        );
        assert_eq!(
            ratio("0.290"),
            Ratio {
                numerator: 29,
                scale: 2
            }
        );
        assert_eq!(
            ratio("1"),
            Ratio {
                numerator: 1,
                scale: 0
            }
        );
        assert_eq!(
            ratio("1.0"),
            Ratio {
                numerator: 1,
                scale: 0
            }
        );
        assert_eq!(
            ratio("0"),
            Ratio {
                numerator: 0,
                scale: 0
            }
        );
        assert_eq!(
            ratio(".5"),
            Ratio {
                numerator: 5,
                scale: 1
            }
        );
        for bad in ["", ".", "1.01", "2", "-0.1", "0.1.2", "abc", "1e-1", " 0.5"] {
            assert!(bad.parse::<Ratio>().is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn floats_read_back_as_the_written_decimal() {
        assert_eq!(Ratio::try_from(0.29).unwrap(), ratio("0.29"));
        assert_eq!(Ratio::try_from(0.1).unwrap(), ratio("0.1"));
        assert_eq!(Ratio::try_from(1.0).unwrap(), ratio("1"));
        assert!(Ratio::try_from(1.5).is_err());
        assert!(Ratio::try_from(-0.0001).is_err());
        assert!(Ratio::try_from(f64::NAN).is_err());
        assert!(Ratio::try_from(1e-30).is_err());
    }

    #[test]
    fn budget_is_integer_arithmetic() {
        // 0.29 * 100 is 28.999999999999996 in floating point.
        let float = std::hint::black_box(0.29f64) * 100.0;
        assert_eq!(float.floor(), 28.0);
        assert_eq!(ratio("0.29").budget(100), 29);
        assert_eq!(Ratio::try_from(0.29).unwrap().budget(100), 29);
        assert_eq!(ratio("0.57").budget(100), 57);
        assert_eq!(ratio("0.5").budget(7), 3);
        assert_eq!(ratio("0").budget(1000), 0);
        assert_eq!(ratio("1").budget(1000), 1000);
        assert_eq!(ratio("0.1").budget(9), 0);
        assert_eq!(ratio("0.5").budget(usize::MAX), usize::MAX / 2);
        assert_eq!(ratio("1").budget(usize::MAX), usize::MAX);
    }

    #[test]
    fn ratios_order_by_value() {
        let mut ratios = [ratio("1"), ratio("0.5"), ratio("0.25"), ratio("0.1"), ratio("0")];
        ratios.sort();
        let shown: Vec<String> = ratios.iter().map(Ratio::to_string).collect();
        assert_eq!(shown, ["0", "0.1", "0.25", "0.5", "1"]);
    }

    #[test]
    fn absolute_budgets_never_exceed_the_source() {
        assert_eq!(BudgetRule::Tokens(128).tokens(1000), 128);
        assert_eq!(BudgetRule::Tokens(128).tokens(100), 100);
        assert_eq!(BudgetRule::Tokens(0).tokens(100), 0);
        assert_eq!(BudgetRule::Ratio(ratio("0.29")).tokens(100), 29);
        assert_eq!(BudgetRule::Tokens(64).to_string(), "L=64");
        assert_eq!(format!("{:<6}|", BudgetRule::Ratio(ratio("0.5"))), "r=0.5 |");
    }

    #[test]
    fn displays_the_written_digits() {
        for text in ["0.29", "1", "0", "0.05", "0.000001", "0.999999999999999999"] {
            assert_eq!(ratio(text).to_string(), text);
        }
        assert_eq!(ratio(".5").to_string(), "0.5");
    }
}
