//! The sentences a person reads about capacity (status message, Events, the
//! WAITING FOR column): numbers that add up (what is free *for the new
//! cluster*, with the headroom and the reservations it is after named), one
//! readable unit per resource in a sentence ([`crate::quantity::readable`]),
//! and "no node offers `gpu`" rather than a shortfall a typo can never close.
//! The exact values stay in `status.capacity`'s maps.

use std::collections::BTreeSet;

use crate::capacity::{self, FitReport, ResourceList};
use crate::quantity::{Quantity, readable};

/// `maps` as `name value, ...` texts, each resource in one unit across all of
/// them (one sentence).
pub fn in_one_sentence(maps: &[&ResourceList]) -> Vec<String> {
    let names: BTreeSet<&String> = maps.iter().flat_map(|m| m.keys()).collect();
    let mut texts: Vec<Vec<String>> = vec![vec![]; maps.len()];
    for name in names {
        let present: Vec<&Quantity> = maps.iter().filter_map(|m| m.get(name)).collect();
        let mut printed = readable(name, &present).into_iter();
        for (i, m) in maps.iter().enumerate() {
            if m.contains_key(name) {
                texts[i].push(format!("{name} {}", printed.next().unwrap_or_default()));
            }
        }
    }
    texts.into_iter().map(|t| t.join(", ")).collect()
}

/// One map as `name value, ...`, each value readable.
pub fn resources_text(m: &ResourceList) -> String {
    in_one_sentence(&[m]).pop().unwrap_or_default()
}

/// Resources of the shortfall no schedulable node offers (allocatable absent
/// or zero): no amount of waiting frees them.
pub fn not_offered(r: &FitReport) -> Vec<&str> {
    r.shortfall
        .keys()
        .map(String::as_str)
        .filter(|k| r.allocatable.get(*k).is_none_or(Quantity::is_zero))
        .collect()
}

/// The names as `` `gpu`, `foo` ``.
fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// (`short for the column`, `long for message and events`).
pub fn shortfall_text(r: &FitReport) -> (String, String) {
    if r.shortfall.is_empty() {
        let reason = r
            .unplaced
            .first()
            .map(|u| u.reason.clone())
            .unwrap_or_default();
        return (
            "capacity (fragmented)".to_string(),
            format!(
                "enough free capacity in total but {} pods cannot be placed on any single node: {reason}",
                r.unplaced.len()
            ),
        );
    }
    let only_needed = |m: &ResourceList| -> ResourceList {
        m.iter()
            .filter(|(k, _)| r.new_requests.contains_key(*k) || r.shortfall.contains_key(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let free = only_needed(&r.free);
    let headroom = only_needed(&r.headroom);
    // What the new cluster may use: the FREE column, `free − reserved − headroom`.
    let available = only_needed(&capacity::sub_floor0(
        &r.free,
        &capacity::sum(&r.reserved, &r.headroom),
    ));
    let missing = not_offered(r);
    let offered_short: ResourceList = r
        .shortfall
        .iter()
        .filter(|(k, _)| !missing.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let [
        needs,
        avail,
        free_t,
        reserved_t,
        headroom_t,
        short_t,
        offered_t,
    ] = &in_one_sentence(&[
        &r.new_requests,
        &available,
        &free,
        &r.reserved,
        &headroom,
        &r.shortfall,
        &offered_short,
    ])[..]
    else {
        return (String::new(), String::new());
    };
    let reserved_t = if r.reserved.is_empty() {
        "none"
    } else {
        reserved_t.as_str()
    };
    let (free_word, after) = if headroom.is_empty() && r.reserved.is_empty() {
        (
            "is free",
            format!("reserved by other upgrades: {reserved_t}"),
        )
    } else {
        let mut after =
            format!("free on the nodes: {free_t}; reserved by other upgrades: {reserved_t}");
        if !headroom.is_empty() {
            after.push_str(&format!("; kept free by spec.headroom: {headroom_t}"));
        }
        ("is free for it", after)
    };
    let needs_sentence = format!(
        "new cluster needs {needs} but only {avail} {free_word} ({after}); short by {short_t}"
    );
    // A pool being republished counts nothing until its new generation is
    // complete: say so, rather than suggest a misspelt name.
    let updating = (!r.dra_pools_updating.is_empty()).then(|| {
        format!(
            "the DRA driver is republishing its pool on node {} (its newest generation's \
             ResourceSlices are not all published yet, and the scheduler allocates none of that \
             pool's devices until they are)",
            r.dra_pools_updating.join(", node ")
        )
    });
    if missing.is_empty() {
        let long = match &updating {
            Some(u) => format!("{needs_sentence}; not counted while {u}"),
            None => needs_sentence,
        };
        return (format!("capacity: {short_t}"), long);
    }
    if let Some(u) = updating {
        let short = format!(
            "no node offers {} while DRA pools are republished",
            quoted(&missing)
        );
        let long = format!(
            "no schedulable node offers {} now: {u}; raygate holds until the pool is complete; \
             {needs_sentence}",
            quoted(&missing)
        );
        return (short, long);
    }
    let mut short = format!("no node offers {}", quoted(&missing));
    if !offered_short.is_empty() {
        short.push_str(&format!("; capacity: {offered_t}"));
    }
    let long = format!(
        "no schedulable node offers {}: check the name in spec.headroom and in the pods' requests \
         (condition ResourcesOffered); {needs_sentence}",
        quoted(&missing)
    );
    (short, long)
}

/// What the new cluster needs and whether it fits now, for a change held
/// by policy: the numbers an approver decides on.
pub fn needs_text(r: &FitReport) -> String {
    if r.fits {
        format!(
            "new cluster needs {} and fits now",
            resources_text(&r.new_requests)
        )
    } else {
        shortfall_text(r).1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::tests::rl;

    fn report() -> FitReport {
        FitReport {
            fits: false,
            required: ResourceList::new(),
            new_requests: rl(&[("nvidia.com/gpu", "24"), ("cpu", "18"), ("memory", "136Gi")]),
            old_requests: ResourceList::new(),
            reserved: ResourceList::new(),
            headroom: rl(&[("nvidia.com/gpu", "2")]),
            allocatable: rl(&[("nvidia.com/gpu", "32"), ("cpu", "64"), ("memory", "512Gi")]),
            free: rl(&[
                ("nvidia.com/gpu", "16"),
                ("cpu", "21900m"),
                ("memory", "188406Mi"),
            ]),
            shortfall: rl(&[("nvidia.com/gpu", "10")]),
            unplaced: vec![],
            placements: Default::default(),
            skipped_nodes: vec![],
            dra_pools_updating: vec![],
        }
    }

    /// Issue 32, items 2 and 3: the headroom is named, what is free for the
    /// new cluster is the FREE column (16 − 2 = 14), 24 − 14 = 10 adds up, and
    /// each resource reads in one unit.
    #[test]
    fn the_message_names_the_headroom_and_its_numbers_add_up() {
        let (short, long) = shortfall_text(&report());
        assert_eq!(short, "capacity: nvidia.com/gpu 10");
        assert_eq!(
            long,
            "new cluster needs cpu 18, memory 136Gi, nvidia.com/gpu 24 but only cpu 21.9, \
             memory 183.99Gi, nvidia.com/gpu 14 is free for it (free on the nodes: cpu 21.9, \
             memory 183.99Gi, nvidia.com/gpu 16; reserved by other upgrades: none; kept free by \
             spec.headroom: nvidia.com/gpu 2); short by nvidia.com/gpu 10"
        );
    }

    /// Issue 32, item 4: a resource no node offers is said so in the column
    /// and first in the message.
    #[test]
    fn a_resource_no_node_offers_is_named_not_counted_short() {
        let r = FitReport {
            headroom: rl(&[("gpu", "2")]),
            free: rl(&[("nvidia.com/gpu", "32"), ("cpu", "64"), ("memory", "512Gi")]),
            shortfall: rl(&[("gpu", "2")]),
            ..report()
        };
        let (short, long) = shortfall_text(&r);
        assert_eq!(short, "no node offers `gpu`");
        assert!(
            long.starts_with("no schedulable node offers `gpu`: check the name in spec.headroom"),
            "{long}"
        );
        let both = FitReport {
            shortfall: rl(&[("gpu", "2"), ("nvidia.com/gpu", "8")]),
            ..r
        };
        assert_eq!(
            shortfall_text(&both).0,
            "no node offers `gpu`; capacity: nvidia.com/gpu 8"
        );
    }

    #[test]
    fn without_headroom_or_reservations_free_is_what_the_nodes_have() {
        let r = FitReport {
            headroom: ResourceList::new(),
            shortfall: rl(&[("nvidia.com/gpu", "8")]),
            ..report()
        };
        assert_eq!(
            shortfall_text(&r).1,
            "new cluster needs cpu 18, memory 136Gi, nvidia.com/gpu 24 but only cpu 21.9, \
             memory 183.99Gi, nvidia.com/gpu 16 is free (reserved by other upgrades: none); \
             short by nvidia.com/gpu 8"
        );
    }
}
