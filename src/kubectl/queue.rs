//! `queue`: the upgrades raygate is running and those waiting for capacity,
//! in the controller's admission order ([`crate::admission::ledger::order`]).

use std::collections::BTreeMap;

use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde::Serialize;
use serde_json::json;
use serde_with::skip_serializing_none;

use super::{Format, KubeArgs, connect, resources};
use crate::Result;
use crate::admission::ledger::{self, Candidate};
use crate::capacity::{ACCELERATORS, ResourceList, parse_status_map, sum_of};
use crate::cli;
use crate::quantity::Quantity;
use crate::upgradeplan::{UpgradePlan, UpgradePlanStatus};

/// One upgrade in the queue view; `None` fields are left out.
#[skip_serializing_none]
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct QueueEntry {
    /// 1-based place among the waiting upgrades; none for admitted ones.
    pub position: Option<usize>,
    pub namespace: String,
    pub name: String,
    pub ray_service: String,
    pub phase: String,
    /// The priority the controller ranks the plan by (`status.effectivePriority`:
    /// `spec.priority` under the namespace's `--max-priority`).
    pub priority: i32,
    /// `spec.priority`, when the ceiling lowered it.
    pub requested_priority: Option<i32>,
    /// Since when the change has waited (waiting) or was admitted (admitted).
    pub since: Option<String>,
    pub fingerprint: Option<String>,
    /// What the new cluster requests.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub needs: BTreeMap<String, String>,
    pub waiting_for: Option<String>,
    /// Held in the ledger for an admitted upgrade until its pods are bound.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub reserved: BTreeMap<String, String>,
}

/// The queue: admitted upgrades first (they hold reservations), then the
/// waiting ones in the controller's admission order.
pub fn queue_entries(plans: &[UpgradePlan]) -> Vec<QueueEntry> {
    let mut admitted = vec![];
    let mut waiting = vec![];
    let mut by_key = BTreeMap::new();
    for p in plans {
        let Some(status) = &p.status else { continue };
        let key = (p.namespace().unwrap_or_default(), p.name_any());
        if let Some(a) = &status.admitted {
            admitted.push(QueueEntry {
                position: None,
                since: Some(a.admitted_time.to_string()),
                fingerprint: Some(a.fingerprint.clone()),
                needs: status
                    .capacity
                    .as_ref()
                    .map(|c| c.needed.clone())
                    .unwrap_or_default(),
                reserved: status
                    .capacity
                    .as_ref()
                    .map(|c| c.needed.clone())
                    .unwrap_or_default(),
                ..entry(p, status)
            });
        } else if let Some(c) = &status.pending_change {
            waiting.push(Candidate {
                namespace: key.0.clone(),
                name: key.1.clone(),
                priority: effective_priority(p, status),
                waiting_since: c.detected_time,
                pods: vec![],
                headroom: ResourceList::new(),
            });
            by_key.insert(
                key,
                QueueEntry {
                    since: Some(c.detected_time.to_string()),
                    fingerprint: Some(c.fingerprint.clone()),
                    needs: status
                        .capacity
                        .as_ref()
                        .map(|c| c.needed.clone())
                        .unwrap_or_default(),
                    ..entry(p, status)
                },
            );
        }
    }
    admitted
        .sort_by(|a, b| (&a.since, &a.namespace, &a.name).cmp(&(&b.since, &b.namespace, &b.name)));
    ledger::order(&mut waiting);
    let mut out = admitted;
    for (i, c) in waiting.iter().enumerate() {
        if let Some(mut e) = by_key.remove(&(c.namespace.clone(), c.name.clone())) {
            e.position = Some(i + 1);
            out.push(e);
        }
    }
    out
}

/// The priority the controller ranks `p` by: what it recorded, else (a
/// status written before raygate recorded it) `spec.priority`.
fn effective_priority(p: &UpgradePlan, status: &UpgradePlanStatus) -> i32 {
    status.effective_priority.unwrap_or(p.spec.priority)
}

fn entry(p: &UpgradePlan, status: &UpgradePlanStatus) -> QueueEntry {
    QueueEntry {
        position: None,
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
        waiting_for: status.waiting_for.clone(),
        reserved: BTreeMap::new(),
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
    head.extend(["RESERVED", "WAITING FOR"]);
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
        let mut r = vec![
            e.position
                .map_or_else(|| "admitted".into(), |p| p.to_string()),
        ];
        if all {
            r.push(e.namespace.clone());
        }
        r.push(e.name.clone());
        r.push(e.phase.clone());
        r.push(match e.requested_priority {
            Some(asked) => format!("{} (asked {asked})", e.priority),
            None => e.priority.to_string(),
        });
        r.push(if e.position.is_some() {
            age(e.since.as_deref(), now)
        } else {
            "-".into()
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
        if wide {
            r.push(e.fingerprint.clone().unwrap_or_else(|| "-".into()));
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
                "#", "NAME", "PHASE", "PRIORITY", "WAITING", "GPUS", "NEEDED", "RESERVED",
                "WAITING", "FOR"
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
