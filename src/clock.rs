//! UTC timestamps without a calendar crate: run folder names, `run.json`, the trace; and the
//! times providers announce (RFC 3339 instants, Go-style durations), read as waits.

use std::time::{Duration, SystemTime};

/// `20261130T054041Z` (or `2026-11-30T05:40:41Z` when `readable`), in UTC.
pub(crate) fn utc_timestamp(at: SystemTime, readable: bool) -> String {
    let seconds = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let [year, month, day, hour, minute, second] = civil(seconds);
    if readable {
        format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
    } else {
        format!("{year:04}{month:02}{day:02}T{hour:02}{minute:02}{second:02}Z")
    }
}

/// `2026-11-30T08:19:43.084854Z`: UTC with microseconds, as the JSON layer stamps events.
pub(crate) fn utc_timestamp_micros(at: SystemTime) -> String {
    let since = at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let [year, month, day, hour, minute, second] = civil(since.as_secs());
    format!(
        "{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{:06}Z",
        since.subsec_micros()
    )
}

/// Year, month, day, hour, minute and second (UTC) of a Unix time in seconds.
fn civil(seconds: u64) -> [i64; 6] {
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    let (hour, minute, second) = (rest / 3600, rest % 3600 / 60, rest % 60);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    [year, month, day, hour as i64, minute as i64, second as i64]
}

/// A duration as a person reads it: `45 s`, `12 min`, `3.2 h`.
pub(crate) fn human_duration(seconds: f64) -> String {
    match seconds {
        s if s < 90.0 => format!("{:.0} s", s.max(1.0)),
        s if s < 5400.0 => format!("{:.0} min", s / 60.0),
        s => format!("{:.1} h", s / 3600.0),
    }
}

/// The time from now until an RFC 3339 instant (`2026-12-01T20:44:34Z`, offsets and fractions
/// allowed); zero for one past, none for text that is not one or more than an hour away.
pub(crate) fn until_rfc3339(text: &str) -> Option<Duration> {
    let (date, time) = text.split_once(['T', 't', ' '])?;
    let mut parts = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (year, month, day) = (parts.next()??, parts.next()??, parts.next()??);
    let (clock, offset) = match time.find(['Z', 'z', '+', '-']) {
        Some(at) => time.split_at(at),
        None => return None,
    };
    let offset_seconds = match offset.chars().next() {
        Some('Z' | 'z') => 0,
        Some(sign) => {
            let (hours, minutes) = offset[1..].split_once(':')?;
            let (hours, minutes) = (hours.parse::<i64>().ok()?, minutes.parse::<i64>().ok()?);
            if !(0..24).contains(&hours) || !(0..60).contains(&minutes) {
                return None;
            }
            let magnitude = hours * 3600 + minutes * 60;
            if sign == '-' { -magnitude } else { magnitude }
        }
        None => return None,
    };
    let mut fields = clock.splitn(3, ':');
    let (hours, minutes) = (
        fields.next()?.parse::<i64>().ok()?,
        fields.next()?.parse::<i64>().ok()?,
    );
    let seconds = fields.next()?.parse::<f64>().ok()?;
    // Fields out of their ranges are not a time (and would overflow the arithmetic below).
    let offset_in_range = offset_seconds.abs() < 24 * 3600;
    if !(0..=9999).contains(&year)
        || !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || !(0..=23).contains(&hours)
        || !(0..=59).contains(&minutes)
        || !(0.0..61.0).contains(&seconds)
        || !offset_in_range
    {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let at = (days * 86_400 + hours * 3600 + minutes * 60 - offset_seconds) as f64 + seconds;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs_f64();
    let ahead = at - now;
    (ahead <= 3600.0).then(|| Duration::from_secs_f64(ahead.max(0.0)))
}

/// A Go-style duration: `1s`, `6m0s`, `1h2m3.5s`, `20ms`.
pub(crate) fn go_duration(text: &str) -> Option<Duration> {
    let mut total = 0.0;
    let mut number = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let value: f64 = number.parse().ok()?;
        number.clear();
        let unit = match (c, chars.peek()) {
            ('m', Some('s')) => {
                chars.next();
                0.001
            }
            ('h', _) => 3600.0,
            ('m', _) => 60.0,
            ('s', _) => 1.0,
            _ => return None,
        };
        total += value * unit;
    }
    (number.is_empty() && total <= 3600.0).then(|| Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_017_241);
        assert_eq!(utc_timestamp(at, true), "2026-11-30T05:40:41Z");
        assert_eq!(utc_timestamp(at, false), "20261130T054041Z");
        assert_eq!(
            utc_timestamp(SystemTime::UNIX_EPOCH, true),
            "1970-01-01T00:00:00Z"
        );
        let micros = SystemTime::UNIX_EPOCH + Duration::from_micros(1_796_017_241_084_854);
        assert_eq!(utc_timestamp_micros(micros), "2026-11-30T05:40:41.084854Z");
        // 2000-02-29 and 2100-03-01: leap-year rules of the Gregorian calendar.
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(utc_timestamp(leap, true), "2000-02-29T00:00:00Z");
        let century = SystemTime::UNIX_EPOCH + Duration::from_secs(4_107_542_400);
        assert_eq!(utc_timestamp(century, true), "2100-03-01T00:00:00Z");
    }
}
