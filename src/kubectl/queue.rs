//! `queue`: the upgrades raygate is running and those waiting for capacity,
//! in the controller's admission order ([`QueueKey`]'s).

use std::collections::BTreeMap;

use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde::Serialize;
use serde_json::json;
use serde_with::skip_serializing_none;

use super::{Format, KubeArgs, connect, resources};
use crate::Result;
use crate::admission::ledger::QueueKey;
use crate::capacity::{ACCELERATORS, parse_status_map, sum_of};
use crate::cli;
use crate::quantity::Quantity;
use crate::upgradeplan::{Fingerprint, UpgradePlan, UpgradePlanStatus};

/// One upgrade in the queue view; `None` fields are left out.
#[skip_serializing_none]
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct QueueEntry {
    /// 1-based place in the admission queue, among the plans queued for
    /// capacity ([`UpgradePlanStatus::queued_for_capacity`]); none for
    /// admitted ones and for changes held otherwise (approval, a pause, a
    /// maintenance window, an overridden gate, an error: `phase` and
    /// `waitingFor` say which).
    pub position: Option<usize>,
    /// The change is admitted (its transition runs, or KubeRay has yet to
    /// start it).
    pub admitted: bool,
    pub namespace: String,
    pub name: String,
    pub ray_service: String,
    pub phase: String,
    /// The priority the controller ranks the plan by (`status.effectivePriority`:
    /// `spec.priority` under the namespace's `--max-priority`).
    pub priority: i32,
    /// `spec.priority`, when the ceiling lowered it.
    pub requested_priority: Option<i32>,
    /// Since when the change has waited (not admitted) or was admitted.
    pub since: Option<String>,
    pub fingerprint: Option<Fingerprint>,
    /// What the new cluster requests (an incremental upgrade's: its surge),
    /// as measured when it was last fitted.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub needs: BTreeMap<String, String>,
    pub waiting_for: Option<String>,
    /// An admitted upgrade's `needs`: the most the controller's ledger holds
    /// for it. The ledger holds only what of it is not bound yet, so this is
    /// an upper bound, which shrinks to nothing as KubeRay's pods are bound.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub reserved: BTreeMap<String, String>,
    /// Cluster changes gathered into the plan's batch (`status.batch`:
    /// `spec.batching`, or changes made during a transition, which wait for
    /// it to end as the next batch).
    pub batch_changes: Option<u32>,
    /// When the batch is released to the gate; none while it waits for a
    /// transition to end.
    pub batch_release: Option<String>,
    /// The plan's windows keep the change: when they next let it start
    /// (`status.windows.nextOpen`).
    pub windows_next_open: Option<String>,
}

/// The queue: admitted upgrades first (they hold reservations), then the
/// plans queued for capacity in the controller's admission order, then the
/// other pending changes (held for approval, by a pause, a maintenance
/// window, an overridden gate, an error), which have no place in the queue
/// until they wait for capacity alone.
pub fn queue_entries(plans: &[UpgradePlan]) -> Vec<QueueEntry> {
    let mut admitted = vec![];
    let (mut queued, mut held) = (vec![], vec![]);
    let mut by_key = BTreeMap::new();
    for p in plans {
        let Some(status) = &p.status else { continue };
        let key = p.key();
        let needs = status
            .capacity
            .as_ref()
            .map(|c| c.needed.clone())
            .unwrap_or_default();
        if let Some(a) = &status.admitted {
            admitted.push(QueueEntry {
                admitted: true,
                since: Some(a.admitted_time.to_string()),
                fingerprint: Some(a.fingerprint.clone()),
                reserved: needs.clone(),
                needs,
                ..entry(p, status)
            });
            continue;
        }
        let pending = status.pending_change.as_ref();
        if !status.queued_for_capacity() && pending.is_none() {
            continue;
        }
        // The controller counts a queued plan without a recorded change
        // (never written so) as waiting since now: behind every other.
        let candidate = QueueKey::of(
            p,
            effective_priority(p, status),
            Some(status),
            Timestamp::MAX,
        );
        if status.queued_for_capacity() {
            queued.push(candidate);
        } else {
            held.push(candidate);
        }
        by_key.insert(
            key,
            QueueEntry {
                since: pending.map(|c| c.detected_time.to_string()),
                fingerprint: pending.map(|c| c.fingerprint.clone()),
                needs,
                ..entry(p, status)
            },
        );
    }
    admitted
        .sort_by(|a, b| (&a.since, &a.namespace, &a.name).cmp(&(&b.since, &b.namespace, &b.name)));
    queued.sort();
    held.sort();
    let mut out = admitted;
    for (i, c) in queued.iter().enumerate() {
        if let Some(mut e) = by_key.remove(&c.plan()) {
            e.position = Some(i + 1);
            out.push(e);
        }
    }
    for c in &held {
        out.extend(by_key.remove(&c.plan()));
    }
    out
}

/// The priority the controller ranks `p` by: what it recorded, else (a
/// status written before raygate recorded it) `spec.priority`.
fn effective_priority(p: &UpgradePlan, status: &UpgradePlanStatus) -> i32 {
    status.effective_priority.unwrap_or(p.spec.priority)
}

/// When the windows next open, while they keep the plan's change.
fn closed_until(status: &UpgradePlanStatus) -> Option<String> {
    status
        .windows
        .as_ref()
        .filter(|w| !w.open && status.pending_change.is_some())
        .and_then(|w| w.next_open)
        .map(|t| t.to_string())
}

fn entry(p: &UpgradePlan, status: &UpgradePlanStatus) -> QueueEntry {
    QueueEntry {
        position: None,
        admitted: false,
        namespace: p.namespace().unwrap_or_default(),
        name: p.name_any(),
        ray_service: p.spec.ray_service_ref.name.clone(),
        phase: status.phase.as_str().to_string(),
        priority: effective_priority(p, status),
        requested_priority: Some(p.spec.priority)
            .filter(|&asked| asked != effective_priority(p, status)),
        since: None,
        fingerprint: None,
        needs: BTreeMap::new(),
        waiting_for: match (&status.waiting_for, closed_until(status)) {
            (Some(w), Some(t)) => Some(format!("{w} (opens {t})")),
            (w, _) => w.clone(),
        },
        reserved: BTreeMap::new(),
        windows_next_open: closed_until(status),
        batch_changes: status.batch.as_ref().map(|b| b.change_count),
        batch_release: status
            .batch
            .as_ref()
            .and_then(|b| b.release_time)
            .map(|t| t.to_string()),
    }
}

pub(super) async fn queue(kube: &KubeArgs, all: bool, output: Format) -> Result<String> {
    let (client, ns) = connect(kube).await?;
    let api: Api<UpgradePlan> = if all {
        Api::all(client)
    } else {
        Api::namespaced(client, &ns)
    };
    let plans = api.list(&ListParams::default()).await?.items;
    let entries = queue_entries(&plans);
    render_queue(&entries, all, output, Timestamp::now())
}

/// One column of quantities in one unit, as kubectl prints a column
/// (`18000m 64500m`, never `18 64500m`); `-` where there is none.
fn column_in_one_unit(cells: &[Option<Quantity>]) -> Vec<String> {
    let present: Vec<&Quantity> = cells.iter().flatten().collect();
    let mut printed = crate::quantity::in_one_unit(&present).into_iter();
    cells
        .iter()
        .map(|c| match c {
            Some(_) => printed.next().unwrap_or_else(|| "-".into()),
            None => "-".into(),
        })
        .collect()
}

fn age(since: Option<&str>, now: Timestamp) -> String {
    let Some(t) = since.and_then(|s| s.parse::<Timestamp>().ok()) else {
        return "-".into();
    };
    let secs = now.duration_since(t).as_secs().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        s => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

pub fn render_queue(
    entries: &[QueueEntry],
    all: bool,
    output: Format,
    now: Timestamp,
) -> Result<String> {
    let structured = match output {
        Format::Json => cli::Output::Json,
        Format::Yaml => cli::Output::Yaml,
        Format::Text | Format::Wide => cli::Output::Text,
    };
    if let Some(s) = structured.structured(&json!({"items": entries}))? {
        return Ok(s);
    }
    if entries.is_empty() {
        return Ok("No upgrades waiting or admitted.\n".into());
    }
    let wide = output == Format::Wide;
    let mut head = vec!["#"];
    if all {
        head.push("NAMESPACE");
    }
    head.extend(["NAME", "PHASE", "PRIORITY", "WAITING", "GPUS NEEDED"]);
    if wide {
        head.extend(["CPU NEEDED", "MEMORY NEEDED"]);
    }
    // What an admitted upgrade needs: the ledger holds at most that, and
    // only until its pods are bound (the status does not say how much is left).
    head.extend(["RESERVED UP TO", "WAITING FOR"]);
    // Only when some plan gathers a batch: the table is unchanged otherwise.
    let batches = entries.iter().any(|e| e.batch_changes.is_some());
    if batches {
        head.push("BATCH");
    }
    if wide {
        head.push("FINGERPRINT");
    }
    let mut rows: Vec<Vec<String>> = vec![head.iter().map(|s| s.to_string()).collect()];
    let column = |names: &[&str], of: fn(&QueueEntry) -> &BTreeMap<String, String>| {
        column_in_one_unit(
            &entries
                .iter()
                .map(|e| sum_of(&parse_status_map(of(e)), names))
                .collect::<Vec<_>>(),
        )
    };
    let gpus_needed = column(&ACCELERATORS, |e| &e.needs);
    let cpu_needed = column(&["cpu"], |e| &e.needs);
    let memory_needed = column(&["memory"], |e| &e.needs);
    let gpus_reserved = column(&ACCELERATORS, |e| &e.reserved);
    for (i, e) in entries.iter().enumerate() {
        let cell = |c: &[String]| c.get(i).cloned().unwrap_or_else(|| "-".into());
        let mut r = vec![match (e.position, e.admitted) {
            (Some(p), _) => p.to_string(),
            (None, true) => "admitted".into(),
            (None, false) => "-".into(),
        }];
        if all {
            r.push(e.namespace.clone());
        }
        r.push(e.name.clone());
        r.push(e.phase.clone());
        r.push(match e.requested_priority {
            Some(asked) => format!("{} (asked {asked})", e.priority),
            None => e.priority.to_string(),
        });
        r.push(if e.admitted {
            "-".into()
        } else {
            age(e.since.as_deref(), now)
        });
        r.push(cell(&gpus_needed));
        if wide {
            r.push(cell(&cpu_needed));
            r.push(cell(&memory_needed));
        }
        r.push(if wide {
            match resources(&e.reserved) {
                s if s.is_empty() => "-".into(),
                s => s,
            }
        } else {
            cell(&gpus_reserved)
        });
        r.push(e.waiting_for.clone().unwrap_or_else(|| "-".into()));
        if batches {
            r.push(match (e.batch_changes, &e.batch_release, e.admitted) {
                (None, ..) => "-".into(),
                (Some(n), _, true) => format!("{n} next"),
                (Some(n), Some(t), false) => format!("{n} until {t}"),
                (Some(n), None, false) => n.to_string(),
            });
        }
        if wide {
            r.push(e.fingerprint.as_deref().unwrap_or("-").to_string());
        }
        rows.push(r);
    }
    Ok(columns(&rows))
}

/// kubectl's table: left-aligned columns, three spaces apart.
fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            let w = widths.get(c).copied().unwrap_or(0);
            line.push_str(&format!("{cell:<w$}   "));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubectl::tests::{now, plan, waiting};
    use crate::upgradeplan::{Admission, CapacityStatus, Phase};
    use serde_json::Value;

    #[test]
    fn queue_ranks_by_the_priority_the_controller_uses() {
        // team-a asks for 1000, the ceiling (--max-priority=0) made it 0: the
        // older team-b plan stays ahead, and the view says why.
        let capped = |mut s: Option<UpgradePlanStatus>, p: i32| {
            if let Some(s) = s.as_mut() {
                s.effective_priority = Some(p);
            }
            s
        };
        let plans = vec![
            plan(
                "team-a",
                1000,
                capped(waiting("fp1", "2026-12-02T11:30:00Z", "8"), 0),
            ),
            plan(
                "team-b",
                0,
                capped(waiting("fp2", "2026-12-02T11:00:00Z", "8"), 0),
            ),
        ];
        let q = queue_entries(&plans);
        let names: Vec<_> = q.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["team-b", "team-a"]);
        assert_eq!((q[1].priority, q[1].requested_priority), (0, Some(1000)));
        assert_eq!((q[0].priority, q[0].requested_priority), (0, None));
        let text = render_queue(&q, false, Format::Text, now()).unwrap();
        assert!(text.contains("0 (asked 1000)"), "{text}");
        // A status from before raygate recorded it: spec.priority, as before.
        let plans = vec![
            plan("team-a", 1000, waiting("fp1", "2026-12-02T11:30:00Z", "8")),
            plan("team-b", 0, waiting("fp2", "2026-12-02T11:00:00Z", "8")),
        ];
        assert_eq!(queue_entries(&plans)[0].name, "team-a");
    }

    #[test]
    fn queue_lists_admitted_then_waiting_in_admission_order() {
        let admitted = Some(UpgradePlanStatus {
            phase: Phase::Admitted,
            admitted: Some(Admission {
                fingerprint: "aaa".into(),
                admitted_time: "2026-12-02T11:59:00Z".parse().unwrap(),
                ..Default::default()
            }),
            capacity: Some(CapacityStatus {
                needed: BTreeMap::from([("nvidia.com/gpu".into(), "8".into())]),
                ..Default::default()
            }),
            ..Default::default()
        });
        let plans = vec![
            plan("late", 0, waiting("fp1", "2026-12-02T11:30:00Z", "8")),
            plan("early", 0, waiting("fp2", "2026-12-02T11:00:00Z", "8")),
            plan("urgent", 5, waiting("fp3", "2026-12-02T11:50:00Z", "16")),
            plan("running", 0, admitted),
            plan("idle", 0, Some(UpgradePlanStatus::default())),
            plan("new", 0, None),
        ];
        let q = queue_entries(&plans);
        let names: Vec<_> = q.iter().map(|e| (e.position, e.name.as_str())).collect();
        assert_eq!(
            names,
            [
                (None, "running"),
                (Some(1), "urgent"),
                (Some(2), "early"),
                (Some(3), "late")
            ]
        );
        assert_eq!(q[0].reserved["nvidia.com/gpu"], "8");
        assert_eq!(q[1].needs["nvidia.com/gpu"], "16");
        let text = render_queue(&q, false, Format::Text, now()).unwrap();
        insta::assert_snapshot!("queue_text", text);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            [
                "#", "NAME", "PHASE", "PRIORITY", "WAITING", "GPUS", "NEEDED", "RESERVED", "UP",
                "TO", "WAITING", "FOR"
            ]
        );
        assert!(
            lines[1].starts_with("admitted   running   Admitted"),
            "{text}"
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            [
                "1",
                "urgent",
                "WaitingForCapacity",
                "5",
                "10m",
                "16",
                "-",
                "capacity:",
                "nvidia.com/gpu",
                "16"
            ]
        );
        assert!(lines[3].contains(" 60m "), "{text}");
        let wide = render_queue(&q, true, Format::Wide, now()).unwrap();
        insta::assert_snapshot!("queue_wide", wide);
        assert!(wide.lines().next().unwrap().contains("NAMESPACE"), "{wide}");
        assert!(wide.contains("nvidia.com/gpu 8"), "{wide}");
        let v: Value =
            serde_json::from_str(&render_queue(&q, false, Format::Json, now()).unwrap()).unwrap();
        assert_eq!(v["items"][1]["name"], "urgent");
        assert_eq!(v["items"][1]["position"], 1);
        assert_eq!(v["items"][0].get("position"), None);
        assert_eq!(v["items"][0]["admitted"], true);
        assert_eq!(v["items"][1]["admitted"], false);
    }

    /// A pending change held for approval, by a pause, a maintenance window
    /// or an error is not in the controller's queue: listed after it, with no
    /// place, and what it waits for.
    #[test]
    fn changes_held_otherwise_follow_the_queue_without_a_place() {
        let held = |phase: Phase, why: &str, fp: &str, since: &str| {
            let mut s = waiting(fp, since, "8");
            if let Some(s) = s.as_mut() {
                s.phase = phase;
                s.waiting_for = Some(why.into());
            }
            s
        };
        let plans = vec![
            plan(
                "paused",
                0,
                held(
                    Phase::Paused,
                    "policy Paused",
                    "fp1",
                    "2026-12-02T11:30:00Z",
                ),
            ),
            plan(
                "approve-me",
                9,
                held(
                    Phase::WaitingForApproval,
                    "approval",
                    "fp2",
                    "2026-12-02T11:40:00Z",
                ),
            ),
            plan("queued", 0, waiting("fp3", "2026-12-02T11:50:00Z", "8")),
            plan(
                "window",
                0,
                held(
                    Phase::Pending,
                    "maintenance window",
                    "fp4",
                    "2026-12-02T11:00:00Z",
                ),
            ),
        ];
        let q = queue_entries(&plans);
        let names: Vec<_> = q.iter().map(|e| (e.position, e.name.as_str())).collect();
        assert_eq!(
            names,
            [
                (Some(1), "queued"),
                (None, "approve-me"),
                (None, "window"),
                (None, "paused")
            ]
        );
        let text = render_queue(&q, false, Format::Text, now()).unwrap();
        let rows: Vec<Vec<&str>> = text
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows[0][..3],
            ["1", "queued", "WaitingForCapacity"],
            "{text}"
        );
        assert_eq!(
            rows[1][..5],
            ["-", "approve-me", "WaitingForApproval", "9", "20m"],
            "{text}"
        );
        assert_eq!(rows[1].last(), Some(&"approval"), "{text}");
        assert_eq!(rows[2][..3], ["-", "window", "Pending"], "{text}");
        assert!(text.lines().nth(3).unwrap().ends_with("maintenance window"));
        assert_eq!(rows[3][..3], ["-", "paused", "Paused"], "{text}");
        assert!(!text.contains("admitted"), "{text}");
        let v: Value =
            serde_json::from_str(&render_queue(&q, false, Format::Json, now()).unwrap()).unwrap();
        assert_eq!(v["items"][0]["position"], 1);
        for e in v["items"].as_array().unwrap().iter().skip(1) {
            assert_eq!(e.get("position"), None, "{e}");
            assert_eq!(e["admitted"], false, "{e}");
        }
        assert_eq!(v["items"][1]["phase"], "WaitingForApproval");
        assert_eq!(v["items"][1]["waitingFor"], "approval");
        assert_eq!(v["items"][1]["fingerprint"], "fp2");
    }

    /// CPU NEEDED of one plan at 500m and another at 8 reads `500m 8000m`.
    #[test]
    fn queue_columns_are_in_one_unit() {
        let mut half = waiting("fp1", "2026-12-02T11:30:00Z", "1");
        if let Some(c) = half.as_mut().and_then(|s| s.capacity.as_mut()) {
            c.needed.insert("cpu".into(), "500m".into());
            c.needed.insert("memory".into(), "1Gi".into());
        }
        let mut whole = waiting("fp2", "2026-12-02T11:00:00Z", "8");
        if let Some(c) = whole.as_mut().and_then(|s| s.capacity.as_mut()) {
            c.needed.insert("memory".into(), "512Mi".into());
        }
        let entries = queue_entries(&[plan("a", 0, half), plan("b", 0, whole)]);
        let wide = render_queue(&entries, false, Format::Wide, now()).unwrap();
        let cols: Vec<Vec<&str>> = wide
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect())
            .collect();
        // # NAME PHASE PRIORITY WAITING GPUS CPU MEMORY ...
        assert_eq!(cols[0][6..8], ["8000m", "512Mi"], "{wide}");
        assert_eq!(cols[1][6..8], ["500m", "1024Mi"], "{wide}");
    }

    #[test]
    fn an_empty_queue_says_so() {
        let text = render_queue(&[], false, Format::Text, now()).unwrap();
        assert_eq!(text, "No upgrades waiting or admitted.\n");
    }
}
