//! Time rules of an UpgradePlan: Go-style durations (`stallAfter`) and
//! cron-like maintenance windows, evaluated in UTC here and in the plan's
//! time zone, with deny windows and the next change, in `zoned`.
//!
//! Kept pure (the caller passes "now") so admission decisions can be tested
//! at any instant.

use jiff::Timestamp;
use jiff::tz::TimeZone;

use crate::{Error, Result};

mod zoned;
pub use zoned::{Calendar, Closed, State};

/// The longest duration raygate reads: no time rule needs more, and every
/// sum with a timestamp stays far from overflowing.
pub const MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(87_600 * 3600);

/// Parses a Go `time.ParseDuration` subset: `h`, `m`, `s`, `ms` units with
/// optional fractions, e.g. `1h30m`, `90s`, `1.5h`. Negative or empty is an error.
pub fn parse_duration(field: &str, s: &str) -> Result<std::time::Duration> {
    let bad = |reason: &str| Error::invalid(field, format!("invalid duration {s:?}: {reason}"));
    if s.is_empty() {
        return Err(bad("empty"));
    }
    let mut total_ms: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| bad("missing unit (h, m, s or ms)"))?;
        let (num, tail) = rest.split_at(num_len);
        let (unit_ms, unit_len): (u128, usize) = if tail.starts_with("ms") {
            (1, 2)
        } else if tail.starts_with('h') {
            (3_600_000, 1)
        } else if tail.starts_with('m') {
            (60_000, 1)
        } else if tail.starts_with('s') {
            (1_000, 1)
        } else {
            return Err(bad("unknown unit"));
        };
        let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
        if whole.is_empty() && frac.is_empty() {
            return Err(bad("missing number"));
        }
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| bad("bad number"))?
        };
        // Fractions are applied in millisecond precision, truncating like Go.
        let mut frac_ms: u128 = 0;
        let mut scale: u128 = 1;
        for d in frac.chars() {
            let digit = d.to_digit(10).ok_or_else(|| bad("bad fraction"))? as u128;
            if scale < 1_000_000_000 {
                frac_ms = frac_ms * 10 + digit;
                scale *= 10;
            }
        }
        total_ms = whole
            .checked_mul(unit_ms)
            .and_then(|w| w.checked_add(frac_ms * unit_ms / scale))
            .and_then(|x| total_ms.checked_add(x))
            .ok_or_else(|| bad("too large"))?;
        rest = &tail[unit_len..];
    }
    if total_ms > MAX_DURATION.as_millis() {
        return Err(bad("longer than 87600h (10 years)"));
    }
    let ms = u64::try_from(total_ms).map_err(|_| bad("too large"))?;
    Ok(std::time::Duration::from_millis(ms))
}

/// One field of a cron expression: the set of allowed values.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CronField {
    allowed: Vec<bool>,
    /// `*` in day fields matters for the day-of-month/day-of-week OR rule.
    any: bool,
}

impl CronField {
    fn parse(text: &str, min: u32, max: u32, name: &str) -> std::result::Result<Self, String> {
        let mut allowed = vec![false; (max + 1) as usize];
        let any = text == "*";
        for part in text.split(',') {
            let (range, step) = match part.split_once('/') {
                Some((r, s)) => {
                    let step: u32 = s.parse().map_err(|_| format!("{name}: bad step {s:?}"))?;
                    if step == 0 {
                        return Err(format!("{name}: step must be positive"));
                    }
                    (r, step)
                }
                None => (part, 1),
            };
            let (lo, hi) = if range == "*" {
                (min, max)
            } else if let Some((a, b)) = range.split_once('-') {
                (num(a, name)?, num(b, name)?)
            } else {
                let v = num(range, name)?;
                // `5/15` means from 5 to the end in steps of 15, as in Vixie cron.
                if part.contains('/') { (v, max) } else { (v, v) }
            };
            if lo < min || hi > max || lo > hi {
                return Err(format!("{name}: {part:?} is outside {min}-{max}"));
            }
            let mut v = lo;
            while v <= hi {
                allowed[v as usize] = true;
                v += step;
            }
        }
        Ok(CronField { allowed, any })
    }

    fn has(&self, v: u32) -> bool {
        self.allowed.get(v as usize).copied().unwrap_or(false)
    }

    /// The largest allowed value `<= v`.
    fn at_or_below(&self, v: u32) -> Option<u32> {
        (0..=v).rev().find(|&x| self.has(x))
    }
}

fn num(s: &str, name: &str) -> std::result::Result<u32, String> {
    s.parse()
        .map_err(|_| format!("{name}: {s:?} is not a number"))
}

/// A 5-field cron schedule: minute, hour, day of month, month, day of week
/// (0 or 7 = Sunday). Day-of-month and day-of-week are ORed when both are
/// restricted, as in standard cron.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    minute: CronField,
    hour: CronField,
    dom: CronField,
    month: CronField,
    dow: CronField,
}

impl Cron {
    pub fn parse(field: &str, s: &str) -> Result<Cron> {
        let parts: Vec<&str> = s.split_whitespace().collect();
        let bad =
            |reason: String| Error::invalid(field, format!("invalid schedule {s:?}: {reason}"));
        if parts.len() != 5 {
            return Err(bad(format!("expected 5 fields, found {}", parts.len())));
        }
        let mut dow = CronField::parse(parts[4], 0, 7, "day of week").map_err(bad)?;
        if dow.has(7) {
            dow.allowed[0] = true;
        }
        Ok(Cron {
            minute: CronField::parse(parts[0], 0, 59, "minute").map_err(bad)?,
            hour: CronField::parse(parts[1], 0, 23, "hour").map_err(bad)?,
            dom: CronField::parse(parts[2], 1, 31, "day of month").map_err(bad)?,
            month: CronField::parse(parts[3], 1, 12, "month").map_err(bad)?,
            dow,
        })
    }

    /// Does the schedule fire at this minute (UTC)?
    pub fn matches(&self, t: Timestamp) -> bool {
        let dt = t.to_zoned(TimeZone::UTC).datetime();
        self.day_matches(dt.date())
            && self.minute.has(dt.minute() as u32)
            && self.hour.has(dt.hour() as u32)
    }

    /// Does the schedule fire on some minute of this day?
    fn day_matches(&self, d: jiff::civil::Date) -> bool {
        let dom_ok = self.dom.has(d.day() as u32);
        let dow_ok = self.dow.has(d.weekday().to_sunday_zero_offset() as u32);
        let day_ok = match (self.dom.any, self.dow.any) {
            (true, true) => true,
            (false, true) => dom_ok,
            (true, false) => dow_ok,
            (false, false) => dom_ok || dow_ok,
        };
        day_ok && self.month.has(d.month() as u32)
    }

    /// The last minute at or before `t` at which the schedule fired, if it
    /// is no older than `horizon`. Computed from the fields, day by day
    /// backwards (at most `horizon` in days + 1, each a lookup of the
    /// latest hour and minute), not by testing every minute.
    pub fn last_fire(&self, t: Timestamp, horizon: std::time::Duration) -> Option<Timestamp> {
        const DAY: i64 = 86_400;
        let now = t.as_second();
        let earliest = now.saturating_sub(i64::try_from(horizon.as_secs()).unwrap_or(i64::MAX));
        let dt = t.to_zoned(TimeZone::UTC).datetime();
        let mut date = dt.date();
        let mut day_start = now - now.rem_euclid(DAY);
        let (mut max_hour, mut max_minute) = (dt.hour() as u32, dt.minute() as u32);
        // The last minute of the day (23:59) is still within the horizon.
        while day_start + DAY - 60 >= earliest {
            if self.day_matches(date) {
                let mut hour = self.hour.at_or_below(max_hour);
                while let Some(h) = hour {
                    let top = if h == max_hour { max_minute } else { 59 };
                    if let Some(m) = self.minute.at_or_below(top) {
                        let fired = day_start + i64::from(h) * 3600 + i64::from(m) * 60;
                        // Every earlier fire is older still.
                        return (fired >= earliest)
                            .then(|| Timestamp::from_second(fired).ok())
                            .flatten();
                    }
                    hour = h.checked_sub(1).and_then(|x| self.hour.at_or_below(x));
                }
            }
            date = date.yesterday().ok()?;
            day_start -= DAY;
            (max_hour, max_minute) = (23, 59);
        }
        None
    }
}

/// A parsed maintenance window: open for `duration` after each cron match.
#[derive(Debug, Clone)]
pub struct Window {
    pub cron: Cron,
    pub duration: std::time::Duration,
}

/// At most this many windows per plan (the CRD's `maxItems`, checked again
/// when a plan is read): what one plan costs each evaluation is bounded.
pub const MAX_WINDOWS: usize = 50;

/// Windows longer than this are refused: they would be always open in practice
/// and make the open-check scan unbounded.
const MAX_WINDOW: std::time::Duration = std::time::Duration::from_secs(31 * 24 * 3600);

impl Window {
    pub fn parse(field: &str, schedule: &str, duration: &str) -> Result<Window> {
        let cron = Cron::parse(&format!("{field}.schedule"), schedule)?;
        let duration = parse_duration(&format!("{field}.duration"), duration)?;
        if duration.is_zero() || duration > MAX_WINDOW {
            return Err(Error::invalid(
                format!("{field}.duration"),
                "must be between 1m and 31 days",
            ));
        }
        Ok(Window { cron, duration })
    }

    /// Is the window open at `now`: did the schedule fire within the last
    /// `duration`? The last fire is computed ([`Cron::last_fire`]): the cost
    /// does not grow with the duration (issue 26: walking 44,640 minutes of
    /// a 31-day window per evaluation let one tenant's plans slow every
    /// decision).
    pub fn is_open(&self, now: Timestamp) -> bool {
        let start_of_minute = now.as_second() - now.as_second().rem_euclid(60);
        let Some(fired) = self.cron.last_fire(now, self.duration) else {
            return false;
        };
        let since = now.as_second() - fired.as_second();
        debug_assert!(fired.as_second() <= start_of_minute);
        (since as u64) < self.duration.as_secs().max(1)
    }

    /// [`Window::is_open`] as it was computed before, testing the schedule
    /// at every minute of the duration: the baseline of `benches/windows`
    /// and the oracle of the tests.
    #[doc(hidden)]
    pub fn is_open_walking_minutes(&self, now: Timestamp) -> bool {
        let minutes = self.duration.as_secs().div_ceil(60) as i64;
        let start_of_minute = now.as_second() - now.as_second().rem_euclid(60);
        let elapsed_in_minute = now.as_second() - start_of_minute;
        (0..minutes).any(|back| {
            let fired = start_of_minute - back * 60;
            // A window that fired `back` minutes ago is open while less than
            // `duration` has passed since it fired.
            let since = back * 60 + elapsed_in_minute;
            (since as u64) < self.duration.as_secs().max(1)
                && Timestamp::from_second(fired).is_ok_and(|t| self.cron.matches(t))
        })
    }
}

/// True when there are no windows (always allowed) or one is open now.
pub fn any_open(windows: &[Window], now: Timestamp) -> bool {
    windows.is_empty() || windows.iter().any(|w| w.is_open(now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn durations_parse_like_go() {
        let d = |s| parse_duration("stallAfter", s).unwrap();
        assert_eq!(d("30m"), Duration::from_secs(1800));
        assert_eq!(d("1h30m"), Duration::from_secs(5400));
        assert_eq!(d("90s"), Duration::from_secs(90));
        assert_eq!(d("1.5h"), Duration::from_secs(5400));
        assert_eq!(d("250ms"), Duration::from_millis(250));
        assert_eq!(d("1m1h"), Duration::from_secs(3660));
        assert_eq!(d("87600h"), MAX_DURATION);
        for bad in [
            "",
            "30",
            "1d",
            "m",
            "1h 30m",
            "-5m",
            ".h",
            "87601h",
            "99999999999999999999h",
        ] {
            let err = parse_duration("spec.stallAfter", bad)
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("spec.stallAfter: invalid duration"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn cron_fields_and_errors() {
        let c = Cron::parse("s", "*/15 2-4 * * 1-5").unwrap();
        // 2026-12-02 is a Wednesday.
        assert!(c.matches(ts("2026-12-02T02:30:00Z")));
        assert!(!c.matches(ts("2026-12-02T02:31:00Z")));
        assert!(!c.matches(ts("2026-12-02T05:00:00Z")));
        assert!(!c.matches(ts("2026-12-06T03:00:00Z")), "Sunday excluded");
        let sunday = Cron::parse("s", "0 0 * * 7").unwrap();
        assert!(sunday.matches(ts("2026-12-06T00:00:00Z")));
        for bad in [
            "* * * *",
            "60 * * * *",
            "* 24 * * *",
            "*/0 * * * *",
            "a * * * *",
            "5-1 * * * *",
        ] {
            assert!(Cron::parse("w", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn day_of_month_and_week_are_ored_when_both_set() {
        let c = Cron::parse("s", "0 0 1 * 0").unwrap();
        assert!(c.matches(ts("2026-12-01T00:00:00Z")), "1st of month");
        assert!(c.matches(ts("2026-12-06T00:00:00Z")), "a Sunday");
        assert!(!c.matches(ts("2026-12-02T00:00:00Z")));
    }

    #[test]
    fn window_is_open_for_its_duration_after_each_start() {
        let w = Window::parse("w", "0 2 * * *", "2h").unwrap();
        assert!(!w.is_open(ts("2026-12-02T01:59:59Z")));
        assert!(w.is_open(ts("2026-12-02T02:00:00Z")));
        assert!(w.is_open(ts("2026-12-02T03:59:59Z")));
        assert!(!w.is_open(ts("2026-12-02T04:00:00Z")));
        assert!(
            any_open(&[], ts("2026-12-02T12:00:00Z")),
            "no windows = always"
        );
        assert!(!any_open(&[w], ts("2026-12-02T12:00:00Z")));
    }

    #[test]
    fn window_spanning_midnight() {
        let w = Window::parse("w", "30 23 * * 5", "1h").unwrap();
        // Friday 2026-12-04 23:30 → Saturday 00:30.
        assert!(w.is_open(ts("2026-12-05T00:15:00Z")));
        assert!(!w.is_open(ts("2026-12-05T00:30:00Z")));
    }

    #[test]
    fn the_last_fire_is_found_without_walking_minutes() {
        let c = Cron::parse("s", "15 3 * * 1").unwrap();
        // Friday 2026-12-04 12:00: last Monday 03:15 was 2026-11-30.
        let week = Duration::from_secs(7 * 24 * 3600);
        assert_eq!(
            c.last_fire(ts("2026-12-04T12:00:30Z"), week),
            Some(ts("2026-11-30T03:15:00Z"))
        );
        assert_eq!(
            c.last_fire(ts("2026-11-30T03:15:00Z"), week),
            Some(ts("2026-11-30T03:15:00Z"))
        );
        assert_eq!(
            c.last_fire(ts("2026-12-04T12:00:30Z"), Duration::from_secs(3600)),
            None
        );
        // Never fires (31 February): no answer, looked for at most 32 days back.
        let never = Cron::parse("s", "0 0 31 2 *").unwrap();
        assert_eq!(
            never.last_fire(ts("2026-03-05T00:00:00Z"), MAX_WINDOW),
            None
        );
        let w = Window::parse("w", "0 0 31 2 *", "744h").unwrap();
        assert!(!w.is_open(ts("2026-03-05T00:00:00Z")));
    }

    proptest::proptest! {
        /// The computed last fire opens exactly the windows the minute walk opened.
        #[test]
        fn is_open_equals_the_minute_walk(
            schedule in proptest::sample::select(vec![
                "* * * * *", "0 2 * * *", "*/15 2-4 * * 1-5", "30 23 * * 5", "0 0 1 * 0",
                "59 23 31 12 *", "0 0 29 2 *", "5/20 */7 1,15 * *", "0 12 * 6-8 6,7",
                "0 0 31 2 *", "45 1 * * 0",
            ]),
            seconds in 1_700_000_000i64..1_900_000_000,
            minutes in 1u64..3000,
            extra_seconds in 0u64..60,
        ) {
            let duration = format!("{minutes}m{extra_seconds}s");
            let w = Window::parse("w", schedule, &duration).unwrap();
            let now = Timestamp::from_second(seconds).unwrap();
            proptest::prop_assert_eq!(w.is_open(now), w.is_open_walking_minutes(now));
        }
    }

    #[test]
    fn window_duration_bounds() {
        assert!(Window::parse("w", "0 2 * * *", "0s").is_err());
        assert!(Window::parse("w", "0 2 * * *", "800h").is_err());
    }
}
