//! The kept result of `assume::unseen`, apart from the code that computes it so the fit's
//! `Capacity` can carry it without importing that code (which reads `Capacity`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::capacity::ids::NodeId;

/// Per node (by index in `Capacity::nodes`), (class, devices) the node's bound pods hold
/// that no allocated claim seen yet accounts for.
pub(crate) type Unseen = HashMap<NodeId, Vec<(String, u32)>>;

/// (cluster generation, claims version, slices version when read).
type Key = (u64, u64, Option<u64>);

/// `assume::unseen` kept with the versions of what it read (`assume::kept`).
#[derive(Debug, Default)]
pub(crate) struct UnseenCache(Mutex<Option<(Key, Arc<Unseen>)>>);

impl UnseenCache {
    /// The kept result when `cluster` and `claims` are those it was computed on (and
    /// `slices`, if it read them); else `compute`'s, kept. `compute` sets its flag when it
    /// read the slices.
    pub(crate) fn get_or(
        &self,
        cluster: u64,
        claims: u64,
        slices: u64,
        compute: impl FnOnce(&mut bool) -> Unseen,
    ) -> Arc<Unseen> {
        if let Some(((c, k, s), u)) = &*crate::sync::lock(&self.0)
            && (*c, *k) == (cluster, claims)
            && s.is_none_or(|s| s == slices)
        {
            return u.clone();
        }
        let mut read_slices = false;
        let u = Arc::new(compute(&mut read_slices));
        *crate::sync::lock(&self.0) =
            Some(((cluster, claims, read_slices.then_some(slices)), u.clone()));
        u
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_until_what_it_read_changes() {
        let c = UnseenCache::default();
        let mut runs = 0;
        let mut get = |cluster, claims, slices, reads_slices: bool| {
            c.get_or(cluster, claims, slices, |r| {
                runs += 1;
                *r = reads_slices;
                Unseen::new()
            });
        };
        get(1, 1, 1, false);
        get(1, 1, 2, false); // a slice change, not read: kept
        get(2, 1, 2, false); // a pod change
        get(2, 2, 2, true); // a claim change; this time the slices were read
        get(2, 2, 3, true); // so a slice change now counts
        get(2, 2, 3, true);
        assert_eq!(runs, 4);
    }
}
