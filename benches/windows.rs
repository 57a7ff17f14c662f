//! Maintenance windows: is one open now? (issue 26)
//!
//! 1,100 windows (22 plans × 50, the per-plan cap) that never fire (`0 0 31 2
//! *`, 744 h: the worst case, every evaluation looks the whole duration back),
//! plus the same count of ordinary ones (`0 2 * * 1-5`, 3 h). The computed
//! last fire (`Window::is_open`) beside the minute walk it replaced
//! (`Window::is_open_walking_minutes`, up to 44,640 cron checks per window),
//! both in this process, with the ratio. Target: ≤ 10 ms per evaluation of
//! all 1,100.
//!
//! Run by hand: `cargo bench --bench windows`.

mod common;

use std::hint::black_box;

use jiff::Timestamp;
use raygate::schedule::{Calendar, MAX_WINDOWS, Window};

const WINDOWS: usize = 1_100;

fn windows(schedule: &str, duration: &str) -> Vec<Vec<Window>> {
    let plans = WINDOWS / MAX_WINDOWS;
    (0..plans)
        .map(|p| {
            (0..MAX_WINDOWS)
                .map(|i| Window::parse(&format!("plan {p} window {i}"), schedule, duration))
                .collect::<Result<Vec<_>, _>>()
                .unwrap_or_default()
        })
        .collect()
}

fn main() {
    let now: Timestamp = "2026-12-04T12:34:56Z".parse().unwrap_or_default();
    for (what, schedule, duration) in [
        ("never firing, 744h", "0 0 31 2 *", "744h"),
        ("weekdays 02:00, 3h", "0 2 * * 1-5", "3h"),
    ] {
        let plans = windows(schedule, duration);
        let count: usize = plans.iter().map(Vec::len).sum();
        assert_eq!(count, WINDOWS);
        let open = |walk: bool| {
            plans
                .iter()
                .filter(|ws| {
                    ws.iter().any(|w| {
                        if walk {
                            w.is_open_walking_minutes(now)
                        } else {
                            w.is_open(now)
                        }
                    })
                })
                .count()
        };
        assert_eq!(open(false), open(true), "{what}: both say the same");
        let walk_ms = common::median_ms(3, || {
            black_box(open(true));
        });
        let walk_cpu = common::mean_cpu_ms(3, || {
            black_box(open(true));
        });
        let now_ms = common::median_ms(51, || {
            black_box(open(false));
        });
        let now_cpu = common::mean_cpu_ms(51, || {
            black_box(open(false));
        });
        let cpu = |c: Option<f64>| c.map_or("-".to_string(), |c| format!("{c:.3} ms on-CPU"));
        println!(
            "{what}: {count} windows in {} plans: minute walk {walk_ms:.3} ms ({}), computed last fire {now_ms:.3} ms ({}), {:.0}x; target <= 10 ms: {}",
            plans.len(),
            cpu(walk_cpu),
            cpu(now_cpu),
            walk_ms / now_ms.max(1e-9),
            if now_ms <= 10.0 { "met" } else { "NOT met" }
        );
    }
    zoned(now);
}

/// Issue 33: the same count read in a time zone, half of each plan's
/// windows deny windows, and `nextOpen`/`nextClose` found (`Calendar::state`,
/// what the controller writes to `status.windows`) beside the walk of every
/// window it replaced (`Calendar::state_walking_each_window`) and the UTC
/// open check, all in this process. The pathological plans: deny windows
/// identical to the allow ones (the verdict never changes, so the walk runs
/// to its bound), and 25 distinct schedules that all start together every 15
/// minutes (bounded by `MAX_SEARCHES`). Target: ≤ 10 ms for all 22 plans
/// (issue 33: "bounded evaluation cost as today").
fn zoned(now: Timestamp) {
    let (_, tz) =
        Calendar::zone("timeZone", Some("Europe/Berlin")).unwrap_or_else(|e| panic!("{e}"));
    let calendar = |ws: Vec<Window>| {
        let (allow, deny) = ws.split_at(ws.len() / 2);
        Calendar {
            time_zone: "Europe/Berlin".into(),
            tz: tz.clone(),
            allow: allow.to_vec(),
            deny: deny.to_vec(),
        }
    };
    let distinct: Vec<Calendar> = (0..WINDOWS / MAX_WINDOWS)
        .map(|_| {
            let half: Vec<Window> = (0..MAX_WINDOWS / 2)
                .filter_map(|i| Window::parse("w", &format!("*/15 * 1-{} * *", 31 - i), "5m").ok())
                .collect();
            calendar([half.clone(), half].concat())
        })
        .collect();
    let mut cases: Vec<(&str, Vec<Calendar>)> = [
        ("never firing, 744h", "0 0 31 2 *", "744h"),
        ("weekdays 02:00, 3h", "0 2 * * 1-5", "3h"),
        ("every 15 minutes, 5m", "*/15 * * * *", "5m"),
    ]
    .into_iter()
    .map(|(what, schedule, duration)| {
        (
            what,
            windows(schedule, duration)
                .into_iter()
                .map(&calendar)
                .collect(),
        )
    })
    .collect();
    cases.push(("25 distinct schedules every 15 minutes, 5m", distinct));
    for (what, plans) in cases {
        for c in &plans {
            assert_eq!(
                c.state(now).verdict,
                c.state_walking_each_window(now).verdict
            );
        }
        let utc_ms = common::median_ms(21, || {
            for c in &plans {
                black_box(c.allow.iter().any(|w| w.is_open(now)));
            }
        });
        let walk_ms = common::median_ms(3, || {
            for c in &plans {
                black_box(c.state_walking_each_window(now));
            }
        });
        let state_ms = common::median_ms(11, || {
            for c in &plans {
                black_box(c.state(now));
            }
        });
        let per_plan = state_ms / plans.len() as f64;
        println!(
            "{what}: {} plans x {} windows (half deny) in Europe/Berlin: state with nextOpen/nextClose \
             {state_ms:.3} ms ({per_plan:.3} ms a plan), walking every window {walk_ms:.3} ms ({:.0}x), \
             UTC open check {utc_ms:.3} ms ({:.0}x); target <= 10 ms: {}",
            plans.len(),
            MAX_WINDOWS,
            walk_ms / state_ms.max(1e-9),
            state_ms / utc_ms.max(1e-9),
            if state_ms <= 10.0 { "met" } else { "NOT met" }
        );
    }
}
