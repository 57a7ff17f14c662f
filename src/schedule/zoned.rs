//! Windows in a time zone, allow and deny, and when the verdict next changes.
//!
//! A cron schedule is read in the plan's `timeZone` (IANA, bundled tz data:
//! the answer does not depend on the image's `/usr/share/zoneinfo`). Local
//! times become instants as RFC 5545 and JavaScript's Temporal do
//! (jiff's `compatible` disambiguation):
//!
//! - a start that does not exist that night (spring forward, `30 2 * * *` in
//!   `America/New_York` on the second Sunday of March) starts when the clocks
//!   have jumped, shifted by the gap: 03:30 EDT; the window still lasts its
//!   `duration`;
//! - a start that happens twice (fall back, 01:30) starts once, at the first
//!   one (EDT).
//!
//! Deny windows win over allow windows: the gate is open when no deny window
//! is open and (there is no allow window, or one is open).
//!
//! Cost: a fire is found from the fields day by day (as [`Cron::last_fire`]),
//! testing at most the matching minutes of about an hour around a DST shift;
//! [`Calendar::state`] walks the windows' starts and ends, at most
//! [`MAX_STEPS`] of them, within [`HORIZON`].

use std::time::Duration;

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};

use super::{Cron, Window};

/// How far ahead `nextOpen` and `nextClose` are looked for: a yearly freeze
/// (Black Friday week) is still found.
pub const HORIZON: Duration = Duration::from_secs(400 * 24 * 3600);

/// At most this many window starts and ends are walked to find `nextOpen`
/// and `nextClose`; beyond, they are not shown. `benches/windows` measured
/// 27 ms per plan with 2,000 (50 windows every 15 minutes, half of them deny
/// windows that always win: the verdict never changes): 200 bounds that to
/// about a tenth.
pub const MAX_STEPS: usize = 200;

/// At most this many next-start searches (one per distinct schedule, then
/// one per start passed) in one [`Calendar::state`]: with [`MAX_STEPS`],
/// what bounds its cost when many distinct schedules start together at every
/// step. Past it, `nextOpen` and `nextClose` are not shown.
pub const MAX_SEARCHES: usize = 400;

/// The most a DST shift moves a local time (no zone shifts more than an hour
/// today; two for the historical double summer time).
const SHIFT: SignedDuration = SignedDuration::from_hours(2);

/// `date` at `h:m` in `tz`, the first instant when it happens twice and
/// shifted by the gap when it does not happen.
fn instant(tz: &TimeZone, date: Date, h: u32, m: u32) -> Option<Timestamp> {
    let dt = date.at(i8::try_from(h).ok()?, i8::try_from(m).ok()?, 0, 0);
    tz.to_ambiguous_timestamp(dt).compatible().ok()
}

impl Cron {
    /// The fire times of one local day, latest first, starting at or below
    /// `top` (hour, minute).
    fn descending(&self, top: (u32, u32)) -> impl Iterator<Item = (u32, u32)> + '_ {
        let mut next = self
            .hour
            .at_or_below(top.0)
            .map(|h| (h, if h == top.0 { top.1.min(59) + 1 } else { 60 }));
        std::iter::from_fn(move || {
            loop {
                let (h, above) = next?;
                let m = above
                    .checked_sub(1)
                    .and_then(|x| self.minute.at_or_below(x));
                match m {
                    Some(m) => {
                        next = Some((h, m));
                        return Some((h, m));
                    }
                    None => {
                        next = h
                            .checked_sub(1)
                            .and_then(|x| self.hour.at_or_below(x))
                            .map(|h| (h, 60));
                    }
                }
            }
        })
    }

    /// The fire times of one local day, earliest first, from `bottom` on.
    fn ascending(&self, bottom: (u32, u32)) -> impl Iterator<Item = (u32, u32)> + '_ {
        let first_hour = (bottom.0..24).find(|&h| self.hour.has(h));
        let mut next = first_hour.map(|h| {
            let from = if h == bottom.0 { bottom.1 } else { 0 };
            (h, from)
        });
        std::iter::from_fn(move || {
            loop {
                let (h, from) = next?;
                match (from..60).find(|&m| self.minute.has(m)) {
                    Some(m) => {
                        next = Some((h, m + 1));
                        return Some((h, m));
                    }
                    None => {
                        next = (h + 1..24).find(|&x| self.hour.has(x)).map(|x| (x, 0));
                    }
                }
            }
        })
    }

    /// The latest fire at or before `t` in `tz`, no older than `horizon`.
    pub fn last_fire_in(
        &self,
        tz: &TimeZone,
        t: Timestamp,
        horizon: Duration,
    ) -> Option<Timestamp> {
        self.fire_in(tz, t, horizon, Toward::Past)
    }

    /// The earliest fire strictly after `t` in `tz`, within `horizon`.
    pub fn next_fire_in(
        &self,
        tz: &TimeZone,
        t: Timestamp,
        horizon: Duration,
    ) -> Option<Timestamp> {
        self.fire_in(tz, t, horizon, Toward::Future)
    }

    /// The fire nearest `t` on one side of it, walking local days from `t`
    /// toward `dir`. One walk for both directions, so the handling of
    /// daylight-saving shifts cannot drift between them.
    fn fire_in(
        &self,
        tz: &TimeZone,
        t: Timestamp,
        horizon: Duration,
        dir: Toward,
    ) -> Option<Timestamp> {
        let past = dir == Toward::Past;
        let span = SignedDuration::try_from(horizon).ok()?;
        let limit = if past {
            t.checked_sub(span).unwrap_or(Timestamp::MIN)
        } else {
            t.checked_add(span).unwrap_or(Timestamp::MAX)
        };
        // Local times up to a shift beyond `t` can be instants on the near
        // side of it (fall back): start a shift further out.
        let local = t.to_zoned(tz.clone()).datetime();
        let start = if past {
            local.checked_add(SHIFT)
        } else {
            local.checked_sub(SHIFT)
        }
        .ok()?;
        let limit_date = limit.to_zoned(tz.clone()).date();
        let two_days = SignedDuration::from_hours(48);
        let last_day = if past {
            limit_date.checked_sub(two_days)
        } else {
            limit_date.checked_add(two_days)
        }
        .ok()?;
        let mut date = start.date();
        let mut edge = (start.hour() as u32, start.minute() as u32);
        while (past && date >= last_day) || (!past && date <= last_day) {
            if self.day_matches(date) {
                let best = if past {
                    nearest(tz, date, self.descending(edge), t, dir)
                } else {
                    nearest(tz, date, self.ascending(edge), t, dir)
                };
                if let Some(b) = best {
                    let within = if past { b >= limit } else { b <= limit };
                    return within.then_some(b);
                }
            }
            (date, edge) = if past {
                (date.yesterday().ok()?, (23, 59))
            } else {
                (date.tomorrow().ok()?, (0, 0))
            };
        }
        None
    }
}

/// Which side of an instant a fire is looked for on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Toward {
    Past,
    Future,
}

/// The fire of one local day nearest `t` on `dir`'s side (at or before `t`
/// for the past, strictly after it for the future), from `times` ordered
/// away from `t`.
fn nearest(
    tz: &TimeZone,
    date: Date,
    times: impl Iterator<Item = (u32, u32)>,
    t: Timestamp,
    dir: Toward,
) -> Option<Timestamp> {
    let past = dir == Toward::Past;
    let mut best: Option<Timestamp> = None;
    for (h, m) in times {
        let Some(at) = instant(tz, date, h, m) else {
            continue;
        };
        if (past && at <= t) || (!past && at > t) {
            best = Some(best.map_or(at, |b| if past { b.max(at) } else { b.min(at) }));
        }
        // Local times further from `t` can only be nearer instants across a
        // shift: look a shift further, then stop.
        if let Some(b) = best {
            let gap = if past {
                b.as_second() - at.as_second()
            } else {
                at.as_second() - b.as_second()
            };
            if SignedDuration::from_secs(gap.max(0)) > SHIFT {
                break;
            }
        }
    }
    best
}

impl Window {
    /// When the window opened, if it is open at `now` in `tz`.
    pub fn opened_in(&self, tz: &TimeZone, now: Timestamp) -> Option<Timestamp> {
        let fired = self.cron.last_fire_in(tz, now, self.duration)?;
        let since = now.as_second() - fired.as_second();
        ((since as u64) < self.duration.as_secs().max(1)).then_some(fired)
    }

    pub fn is_open_in(&self, tz: &TimeZone, now: Timestamp) -> bool {
        self.opened_in(tz, now).is_some()
    }

    fn end(&self, opened: Timestamp) -> Timestamp {
        crate::admission::batch::after(opened, self.duration)
    }
}

/// A plan's time rules: its time zone, allow windows and deny windows.
#[derive(Debug, Clone)]
pub struct Calendar {
    /// The IANA name (`UTC` when unset).
    pub time_zone: String,
    pub tz: TimeZone,
    /// `spec.maintenanceWindows`: empty means always allowed.
    pub allow: Vec<Window>,
    /// `spec.denyWindows`: freezes, which win over allow windows.
    pub deny: Vec<Window>,
}

impl Default for Calendar {
    fn default() -> Self {
        Calendar {
            time_zone: "UTC".into(),
            tz: TimeZone::UTC,
            allow: vec![],
            deny: vec![],
        }
    }
}

/// Why the windows do not let an upgrade start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closed {
    /// Allow windows are set and none is open.
    NoWindowOpen,
    /// `spec.denyWindows[i]` is open (the first one, if several).
    Denied(usize),
}

/// What the windows say at an instant, and when that next changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// `Ok` when an upgrade may start now.
    pub verdict: Result<(), Closed>,
    /// When the windows next let an upgrade start (none within `HORIZON`).
    pub next_open: Option<Timestamp>,
    /// When they next stop letting one start.
    pub next_close: Option<Timestamp>,
}

impl Calendar {
    /// Parses the time zone; the error names the field.
    pub fn zone(field: &str, name: Option<&str>) -> crate::Result<(String, TimeZone)> {
        match name {
            None | Some("UTC") => Ok(("UTC".into(), TimeZone::UTC)),
            Some(n) => jiff::tz::db()
                .get(n)
                .map(|tz| (n.to_string(), tz))
                .map_err(|_| {
                    crate::Error::invalid(
                        field,
                        format!(
                            "unknown time zone {n:?}: expected an IANA name such as Europe/Berlin"
                        ),
                    )
                }),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// The verdict at `now` from which windows are open.
    fn verdict(
        &self,
        allow_open: impl Fn(usize) -> bool,
        deny_open: impl Fn(usize) -> bool,
    ) -> Result<(), Closed> {
        if let Some(i) = (0..self.deny.len()).find(|&i| deny_open(i)) {
            return Err(Closed::Denied(i));
        }
        if self.allow.is_empty() || (0..self.allow.len()).any(allow_open) {
            Ok(())
        } else {
            Err(Closed::NoWindowOpen)
        }
    }

    /// May an upgrade start at `now`?
    pub fn open_now(&self, now: Timestamp) -> Result<(), Closed> {
        self.verdict(
            |i| self.allow[i].is_open_in(&self.tz, now),
            |i| self.deny[i].is_open_in(&self.tz, now),
        )
    }

    /// The verdict at `now` and when it next changes: the windows' starts
    /// and ends are walked in time order, at most `MAX_STEPS` of them and
    /// at most `MAX_SEARCHES` next-start searches.
    ///
    /// Only whether the gate is open matters after `now`, so the walk keeps,
    /// per list (allow, deny) and per distinct schedule, the longest window
    /// (same starts: it covers the shorter ones), and searches each distinct
    /// schedule's next start once per start passed, whichever lists use it.
    /// 50 windows on one schedule cost what one does.
    pub fn state(&self, now: Timestamp) -> State {
        let verdict = self.open_now(now);
        let tz = &self.tz;
        // Distinct schedules, and per list the longest duration on each.
        let mut crons: Vec<&Cron> = Vec::new();
        // (schedule, is a deny window, duration).
        let mut walked: Vec<(usize, bool, Duration)> = Vec::new();
        let lists = [(false, &self.allow), (true, &self.deny)];
        for (deny, list) in lists {
            for w in list.iter() {
                let c = match crons.iter().position(|&c| *c == w.cron) {
                    Some(c) => c,
                    None => {
                        crons.push(&w.cron);
                        crons.len() - 1
                    }
                };
                match walked.iter_mut().find(|(x, d, _)| *x == c && *d == deny) {
                    Some(e) => e.2 = e.2.max(w.duration),
                    None => walked.push((c, deny, w.duration)),
                }
            }
        }
        let window = |&(c, _, duration): &(usize, bool, Duration)| Window {
            cron: crons[c].clone(),
            duration,
        };
        let walked_windows: Vec<Window> = walked.iter().map(window).collect();
        let mut open_until: Vec<Option<Timestamp>> = walked_windows
            .iter()
            .map(|w| w.opened_in(tz, now).map(|o| w.end(o)))
            .collect();
        let mut searches = crons.len();
        let mut next_start: Vec<Option<Timestamp>> = crons
            .iter()
            .map(|c| c.next_fire_in(tz, now, HORIZON))
            .collect();
        let allow_set = !self.allow.is_empty();
        let ok_at = |open_until: &[Option<Timestamp>], t: Timestamp| {
            let open = |i: usize| open_until[i].is_some_and(|u| u > t);
            let denied = (0..walked.len()).any(|i| walked[i].1 && open(i));
            let allowed = !allow_set || (0..walked.len()).any(|i| !walked[i].1 && open(i));
            !denied && allowed
        };
        let (mut next_open, mut next_close) = (None, None);
        let end = crate::admission::batch::after(now, HORIZON);
        let mut state_ok = verdict.is_ok();
        for _ in 0..MAX_STEPS {
            let Some(t) = next_event(&open_until, &next_start, now, end) else {
                break;
            };
            for u in open_until.iter_mut() {
                if *u == Some(t) {
                    *u = None;
                }
            }
            for c in 0..crons.len() {
                if next_start[c] != Some(t) {
                    continue;
                }
                for (i, w) in walked_windows.iter().enumerate() {
                    if walked[i].0 == c {
                        let until = w.end(t);
                        open_until[i] = Some(open_until[i].map_or(until, |u| u.max(until)));
                    }
                }
                searches += 1;
                next_start[c] = if searches > MAX_SEARCHES {
                    None
                } else {
                    crons[c].next_fire_in(tz, t, HORIZON)
                };
            }
            let ok = ok_at(&open_until, t);
            if ok != state_ok {
                if ok {
                    next_open.get_or_insert(t);
                } else {
                    next_close.get_or_insert(t);
                }
                state_ok = ok;
            }
            if (next_open.is_some() && next_close.is_some()) || searches > MAX_SEARCHES {
                break;
            }
        }
        State {
            verdict,
            next_open,
            next_close,
        }
    }

    /// [`Calendar::state`] as it was computed before: every window walked
    /// on its own, its next start searched once per start passed (50
    /// windows firing together cost 50 searches a step). The baseline of
    /// `benches/windows` and the oracle of the tests.
    #[doc(hidden)]
    pub fn state_walking_each_window(&self, now: Timestamp) -> State {
        let windows: Vec<&Window> = self.allow.iter().chain(&self.deny).collect();
        let n_allow = self.allow.len();
        let tz = &self.tz;
        // Per window: until when it is open, and its next start.
        let mut open_until: Vec<Option<Timestamp>> = windows
            .iter()
            .map(|w| w.opened_in(tz, now).map(|o| w.end(o)))
            .collect();
        let mut next_start: Vec<Option<Timestamp>> = windows
            .iter()
            .map(|w| w.cron.next_fire_in(tz, now, HORIZON))
            .collect();
        let at = |open_until: &[Option<Timestamp>], t: Timestamp| {
            let open = |i: usize| open_until[i].is_some_and(|u| u > t);
            self.verdict(open, |i| open(n_allow + i))
        };
        let verdict = at(&open_until, now);
        let (mut next_open, mut next_close) = (None, None);
        let end = crate::admission::batch::after(now, HORIZON);
        let mut state_ok = verdict.is_ok();
        for _ in 0..MAX_STEPS {
            let Some(t) = next_event(&open_until, &next_start, now, end) else {
                break;
            };
            for i in 0..windows.len() {
                if open_until[i] == Some(t) {
                    open_until[i] = None;
                }
                if next_start[i] == Some(t) {
                    let until = windows[i].end(t);
                    open_until[i] = Some(open_until[i].map_or(until, |u| u.max(until)));
                    next_start[i] = windows[i].cron.next_fire_in(tz, t, HORIZON);
                }
            }
            let ok = at(&open_until, t).is_ok();
            if ok != state_ok {
                if ok {
                    next_open.get_or_insert(t);
                } else {
                    next_close.get_or_insert(t);
                }
                state_ok = ok;
            }
            if next_open.is_some() && next_close.is_some() {
                break;
            }
        }
        State {
            verdict,
            next_open,
            next_close,
        }
    }

    /// What the windows say, for `status.message` and `kubectl raygate fit`.
    pub fn explain(&self, s: &State) -> String {
        let tz = &self.time_zone;
        let next = |what: &str, t: Option<Timestamp>| match t {
            Some(t) => format!(
                "; {what} at {t} ({})",
                t.to_zoned(self.tz.clone()).strftime("%Y-%m-%d %H:%M %Z")
            ),
            None => String::new(),
        };
        match &s.verdict {
            Ok(()) => format!(
                "windows ({tz}) allow upgrades now{}",
                next("they close", s.next_close)
            ),
            Err(Closed::NoWindowOpen) => format!(
                "no maintenance window is open now ({tz}){}",
                next("the next opens", s.next_open)
            ),
            Err(Closed::Denied(i)) => format!(
                "deny window spec.denyWindows[{i}] is open now ({tz}): no upgrade starts during it{}",
                next("upgrades may start again", s.next_open)
            ),
        }
    }
}

/// The walk's next instant after `now` and up to `end` at which a window
/// opens or closes.
fn next_event(
    open_until: &[Option<Timestamp>],
    next_start: &[Option<Timestamp>],
    now: Timestamp,
    end: Timestamp,
) -> Option<Timestamp> {
    open_until
        .iter()
        .chain(next_start)
        .flatten()
        .copied()
        .filter(|&x| x > now)
        .min()
        .filter(|&t| t <= end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn cal(tz: &str, allow: &[(&str, &str)], deny: &[(&str, &str)]) -> Calendar {
        let (time_zone, tz) = Calendar::zone("spec.timeZone", Some(tz)).unwrap();
        let w = |l: &[(&str, &str)]| {
            l.iter()
                .map(|(s, d)| Window::parse("w", s, d).unwrap())
                .collect()
        };
        Calendar {
            time_zone,
            tz,
            allow: w(allow),
            deny: w(deny),
        }
    }

    #[test]
    fn a_window_is_read_in_its_time_zone() {
        // 02:00-04:00 Berlin time (CET = UTC+1 in December).
        let c = cal("Europe/Berlin", &[("0 2 * * *", "2h")], &[]);
        assert!(c.open_now(ts("2026-12-02T01:00:00Z")).is_ok());
        assert!(c.open_now(ts("2026-12-02T02:59:59Z")).is_ok());
        assert_eq!(
            c.open_now(ts("2026-12-02T03:00:00Z")),
            Err(Closed::NoWindowOpen)
        );
        let s = c.state(ts("2026-12-02T12:00:00Z"));
        assert_eq!(s.next_open, Some(ts("2026-12-03T01:00:00Z")));
        assert_eq!(s.next_close, Some(ts("2026-12-03T03:00:00Z")));
        assert!(
            c.explain(&s)
                .contains("the next opens at 2026-12-03T01:00:00Z (2026-12-03 02:00 CET)"),
            "{}",
            c.explain(&s)
        );
        // In summer (CEST = UTC+2).
        assert!(c.open_now(ts("2026-07-02T00:30:00Z")).is_ok());
        assert!(
            Calendar::zone("spec.timeZone", Some("Mars/Olympus"))
                .unwrap_err()
                .to_string()
                .starts_with("spec.timeZone: unknown time zone")
        );
    }

    #[test]
    fn deny_wins_over_allow() {
        // Allowed every night 02:00-06:00 UTC; frozen from Thursday 2026-11-26
        // 00:00 for 5 days (the Black Friday week).
        let c = cal("UTC", &[("0 2 * * *", "4h")], &[("0 0 26 11 *", "120h")]);
        let night = ts("2026-11-27T03:00:00Z");
        assert_eq!(c.open_now(night), Err(Closed::Denied(0)));
        let s = c.state(night);
        assert_eq!(
            s.next_open,
            Some(ts("2026-12-01T02:00:00Z")),
            "first allowed night after the freeze"
        );
        assert_eq!(s.next_close, Some(ts("2026-12-01T06:00:00Z")));
        assert!(
            c.explain(&s)
                .starts_with("deny window spec.denyWindows[0] is open now (UTC)"),
            "{}",
            c.explain(&s)
        );
        // Deny windows alone: allowed whenever none is open.
        let freeze_only = cal("UTC", &[], &[("0 0 26 11 *", "120h")]);
        let before = freeze_only.state(ts("2026-11-20T00:00:00Z"));
        assert_eq!(before.verdict, Ok(()));
        assert_eq!(before.next_close, Some(ts("2026-11-26T00:00:00Z")));
        assert_eq!(before.next_open, Some(ts("2026-12-01T00:00:00Z")));
        // A freeze that starts inside an allow window closes it early.
        let c = cal("UTC", &[("0 0 * * *", "24h")], &[("0 12 7 12 *", "1h")]);
        let s = c.state(ts("2026-12-07T10:00:00Z"));
        assert_eq!(
            (s.verdict.clone(), s.next_close, s.next_open),
            (
                Ok(()),
                Some(ts("2026-12-07T12:00:00Z")),
                Some(ts("2026-12-07T13:00:00Z"))
            )
        );
    }

    #[test]
    fn a_start_that_does_not_exist_on_a_spring_forward_night_is_shifted_by_the_gap() {
        // America/New_York springs forward on 2027-03-14 at 02:00 EST to 03:00 EDT.
        let c = cal("America/New_York", &[("30 2 * * *", "1h")], &[]);
        // The night before: 02:30 EST = 07:30Z.
        assert!(c.open_now(ts("2027-03-13T07:30:00Z")).is_ok());
        // That night 02:30 does not exist: the window starts at 03:30 EDT (07:30Z), for 1h.
        assert_eq!(
            c.open_now(ts("2027-03-14T07:29:59Z")),
            Err(Closed::NoWindowOpen)
        );
        assert!(c.open_now(ts("2027-03-14T07:30:00Z")).is_ok());
        assert!(c.open_now(ts("2027-03-14T08:29:59Z")).is_ok());
        assert_eq!(
            c.open_now(ts("2027-03-14T08:30:00Z")),
            Err(Closed::NoWindowOpen)
        );
        let s = c.state(ts("2027-03-13T12:00:00Z"));
        assert_eq!(s.next_open, Some(ts("2027-03-14T07:30:00Z")));
        // The night after: 02:30 EDT = 06:30Z.
        let s = c.state(ts("2027-03-14T12:00:00Z"));
        assert_eq!(s.next_open, Some(ts("2027-03-15T06:30:00Z")));
    }

    #[test]
    fn a_start_that_happens_twice_on_a_fall_back_night_starts_once_at_the_first() {
        // America/New_York falls back on 2026-11-01 at 02:00 EDT to 01:00 EST.
        let c = cal("America/New_York", &[("30 1 * * *", "45m")], &[]);
        // 01:30 EDT = 05:30Z; the second 01:30 (EST, 06:30Z) starts nothing.
        assert!(c.open_now(ts("2026-11-01T05:30:00Z")).is_ok());
        assert!(c.open_now(ts("2026-11-01T06:14:59Z")).is_ok());
        assert_eq!(
            c.open_now(ts("2026-11-01T06:15:00Z")),
            Err(Closed::NoWindowOpen)
        );
        assert_eq!(
            c.open_now(ts("2026-11-01T06:45:00Z")),
            Err(Closed::NoWindowOpen)
        );
        let s = c.state(ts("2026-11-01T05:00:00Z"));
        assert_eq!(
            (s.next_open, s.next_close),
            (
                Some(ts("2026-11-01T05:30:00Z")),
                Some(ts("2026-11-01T06:15:00Z"))
            )
        );
        let s = c.state(ts("2026-11-01T05:40:00Z"));
        assert_eq!(s.next_close, Some(ts("2026-11-01T06:15:00Z")));
        assert_eq!(s.next_open, Some(ts("2026-11-02T06:30:00Z")));
    }

    #[test]
    fn a_window_that_never_fires_has_no_next_open_and_costs_a_bounded_walk() {
        let c = cal("Europe/Berlin", &[("0 0 31 2 *", "744h")], &[]);
        let s = c.state(ts("2026-12-02T12:00:00Z"));
        assert_eq!(
            (s.verdict, s.next_open, s.next_close),
            (Err(Closed::NoWindowOpen), None, None)
        );
        // Every minute: the walk stops at the first change.
        let c = cal("UTC", &[("* * * * *", "30s")], &[]);
        let s = c.state(ts("2026-12-02T12:00:10Z"));
        assert_eq!(
            (s.next_close, s.next_open),
            (
                Some(ts("2026-12-02T12:00:30Z")),
                Some(ts("2026-12-02T12:01:00Z"))
            )
        );
    }

    #[test]
    fn many_windows_on_one_schedule_cost_one_search_a_start() {
        // benches/windows' pathological plan: 25 allow windows and 25 deny
        // windows, all `*/15` for 5 minutes: the deny windows always win, the
        // verdict never changes, the walk runs to its bound.
        let allow: Vec<(&str, &str)> = vec![("*/15 * * * *", "5m"); 25];
        let c = cal("Europe/Berlin", &allow, &allow);
        let now = ts("2026-12-04T12:34:56Z");
        let s = c.state(now);
        // 13:34:56 in Berlin: the 13:30 windows are open, the deny ones win.
        assert_eq!(
            (s.verdict.clone(), s.next_open, s.next_close),
            (Err(Closed::Denied(0)), None, None)
        );
        assert_eq!(s, c.state_walking_each_window(now));
        // A shorter window on the same schedule changes nothing; a deny
        // window on another schedule still counts.
        let c = cal(
            "UTC",
            &[("0 2 * * *", "4h"), ("0 2 * * *", "1h")],
            &[("0 2 * * *", "30m"), ("0 5 * * *", "30m")],
        );
        let s = c.state(ts("2026-12-04T01:00:00Z"));
        assert_eq!(
            (s.next_open, s.next_close),
            (
                Some(ts("2026-12-04T02:30:00Z")),
                Some(ts("2026-12-04T05:00:00Z"))
            )
        );
    }

    proptest::proptest! {
        /// The walk over distinct schedules says what walking every window
        /// did, wherever that found an answer within its steps.
        #[test]
        fn the_merged_walk_is_the_walk_of_every_window(
            allow in proptest::collection::vec((0usize..6, 1u64..600), 0..4),
            deny in proptest::collection::vec((0usize..6, 1u64..600), 0..3),
            zone in proptest::sample::select(vec!["UTC", "Europe/Berlin", "America/New_York"]),
            seconds in 1_700_000_000i64..1_900_000_000,
        ) {
            const SCHEDULES: [&str; 6] = [
                "0 2 * * *", "*/15 * * * *", "30 1 * * 0", "0 0 26 11 *", "15 2-4 * * 1-5", "0 0 31 2 *",
            ];
            let w = |l: &[(usize, u64)]| -> Vec<(String, String)> {
                l.iter().map(|&(s, m)| (SCHEDULES[s].to_string(), format!("{m}m"))).collect()
            };
            let (a, d) = (w(&allow), w(&deny));
            fn r(l: &[(String, String)]) -> Vec<(&str, &str)> {
                l.iter().map(|(s, d)| (s.as_str(), d.as_str())).collect()
            }
            let c = cal(zone, &r(&a), &r(&d));
            let now = Timestamp::from_second(seconds).unwrap();
            let (new, old) = (c.state(now), c.state_walking_each_window(now));
            proptest::prop_assert_eq!(&new.verdict, &old.verdict);
            if old.next_open.is_some() {
                proptest::prop_assert_eq!(new.next_open, old.next_open);
            }
            if old.next_close.is_some() {
                proptest::prop_assert_eq!(new.next_close, old.next_close);
            }
        }

        /// In UTC the zoned search says what the UTC one says.
        #[test]
        fn in_utc_the_zoned_window_is_the_utc_window(
            schedule in proptest::sample::select(vec![
                "* * * * *", "0 2 * * *", "*/15 2-4 * * 1-5", "30 23 * * 5", "0 0 1 * 0",
                "59 23 31 12 *", "0 0 29 2 *", "5/20 */7 1,15 * *", "0 12 * 6-8 6,7",
                "0 0 31 2 *", "45 1 * * 0",
            ]),
            seconds in 1_700_000_000i64..1_900_000_000,
            minutes in 1u64..3000,
        ) {
            let w = Window::parse("w", schedule, &format!("{minutes}m")).unwrap();
            let now = Timestamp::from_second(seconds).unwrap();
            proptest::prop_assert_eq!(w.is_open_in(&TimeZone::UTC, now), w.is_open(now));
            // The next fire is a fire, and none is between now and it.
            if let Some(next) = w.cron.next_fire_in(&TimeZone::UTC, now, Duration::from_secs(40 * 86400)) {
                proptest::prop_assert!(next > now && w.cron.matches(next));
                proptest::prop_assert_eq!(w.cron.last_fire(next - SignedDuration::from_secs(1), Duration::from_secs(40 * 86400)).filter(|&l| l > now), None);
            }
        }
    }
}
