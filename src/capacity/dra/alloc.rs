//! The scheduler's allocator on one node (`structured/internal/stable/allocator_stable.go`,
//! `allocateOne`): the pod's requests in order, each request's alternatives in order
//! (`firstAvailable`), its devices first fit in the node's device order, backtracking when a
//! later request cannot be satisfied. `All` takes every device that matches and fails if one
//! of them is in use, if none matches, or if a pool on the node is incomplete.

use super::{Mode, Undecided};

/// One request of a pod on one node: per alternative, how many and which devices may serve it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeRequest {
    /// Candidates shared with the view's cache ([`super::DraView::candidates`]).
    pub alternatives: Vec<(Mode, std::sync::Arc<[usize]>)>,
}

/// Search steps before raygate gives up deciding (the scheduler has no such bound but stops
/// at its own timeout); real requests take a handful.
pub const MAX_STEPS: usize = 200_000;

struct Search<'a> {
    reqs: &'a [NodeRequest],
    busy: Vec<bool>,
    incomplete: bool,
    out: Vec<usize>,
    steps: usize,
}

impl Search<'_> {
    fn request(&mut self, i: usize) -> Result<bool, Undecided> {
        let Some(r) = self.reqs.get(i) else {
            return Ok(true);
        };
        for (mode, cands) in &r.alternatives {
            match *mode {
                Mode::All => {
                    if self.incomplete || cands.is_empty() || cands.iter().any(|&c| self.busy[c]) {
                        continue;
                    }
                    for &c in cands.iter() {
                        self.busy[c] = true;
                        self.out.push(c);
                    }
                    if self.request(i + 1)? {
                        return Ok(true);
                    }
                    for &c in cands.iter() {
                        self.busy[c] = false;
                        self.out.pop();
                    }
                }
                Mode::Count(k) => {
                    let k = k as usize;
                    if cands.iter().filter(|&&c| !self.busy[c]).count() < k {
                        continue;
                    }
                    if self.pick(i, cands, 0, k)? {
                        return Ok(true);
                    }
                }
            }
        }
        Ok(false)
    }

    fn pick(
        &mut self,
        i: usize,
        cands: &[usize],
        from: usize,
        k: usize,
    ) -> Result<bool, Undecided> {
        if k == 0 {
            return self.request(i + 1);
        }
        for j in from..cands.len() {
            if cands.len() - j < k {
                break;
            }
            self.steps += 1;
            if self.steps > MAX_STEPS {
                return Err(Undecided(format!(
                    "more than {MAX_STEPS} device combinations to try on one node"
                )));
            }
            let c = cands[j];
            if self.busy[c] {
                continue;
            }
            self.busy[c] = true;
            self.out.push(c);
            if self.pick(i, cands, j + 1, k - 1)? {
                return Ok(true);
            }
            self.busy[c] = false;
            self.out.pop();
        }
        Ok(false)
    }
}

/// The devices the scheduler would allocate to `reqs` on a node with `used` devices busy
/// (`None` when it cannot), in the order taken.
pub fn allocate(
    used: &[bool],
    incomplete: bool,
    reqs: &[NodeRequest],
) -> Result<Option<Vec<usize>>, Undecided> {
    if reqs.is_empty() {
        return Ok(Some(vec![]));
    }
    let mut s = Search {
        reqs,
        busy: used.to_vec(),
        incomplete,
        out: Vec::new(),
        steps: 0,
    };
    Ok(s.request(0)?.then_some(s.out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn count(k: u32, cands: &[usize]) -> NodeRequest {
        NodeRequest {
            alternatives: vec![(Mode::Count(k), cands.into())],
        }
    }

    #[test]
    fn first_fit_with_backtracking() {
        let free = [false; 4];
        // The first request could take 0 and 1, but then the second (only 0 or 1) fails.
        let reqs = [count(2, &[0, 1, 2]), count(1, &[0, 1])];
        assert_eq!(allocate(&free, false, &reqs).unwrap(), Some(vec![0, 2, 1]));
        let used = [true, false, false, false];
        assert_eq!(
            allocate(&used, false, &[count(3, &[0, 1, 2])]).unwrap(),
            None
        );
        assert_eq!(allocate(&used, false, &[]).unwrap(), Some(vec![]));
    }

    #[test]
    fn all_and_first_available() {
        let used = [false, true, false];
        let all = NodeRequest {
            alternatives: vec![(Mode::All, vec![0, 2].into())],
        };
        assert_eq!(
            allocate(&used, false, std::slice::from_ref(&all)).unwrap(),
            Some(vec![0, 2])
        );
        assert_eq!(
            allocate(&used, true, &[all]).unwrap(),
            None,
            "incomplete pool"
        );
        let busy_all = NodeRequest {
            alternatives: vec![(Mode::All, vec![0, 1].into())],
        };
        assert_eq!(allocate(&used, false, &[busy_all]).unwrap(), None);
        let none = NodeRequest {
            alternatives: vec![(Mode::All, vec![].into())],
        };
        assert_eq!(allocate(&used, false, &[none]).unwrap(), None);
        let fa = NodeRequest {
            alternatives: vec![
                (Mode::Count(4), vec![0, 1, 2].into()),
                (Mode::Count(1), vec![1, 2].into()),
            ],
        };
        assert_eq!(allocate(&used, false, &[fa]).unwrap(), Some(vec![2]));
    }

    /// Exhaustive: some choice of an alternative per request and of devices for each, all
    /// distinct and free, that satisfies every request.
    fn oracle(used: &[bool], incomplete: bool, reqs: &[NodeRequest]) -> bool {
        fn go(i: usize, busy: &mut Vec<bool>, incomplete: bool, reqs: &[NodeRequest]) -> bool {
            let Some(r) = reqs.get(i) else { return true };
            r.alternatives.iter().any(|(mode, cands)| {
                let free: Vec<usize> = cands.iter().copied().filter(|&c| !busy[c]).collect();
                match *mode {
                    Mode::All => {
                        if incomplete || cands.is_empty() || free.len() != cands.len() {
                            return false;
                        }
                        cands.iter().for_each(|&c| busy[c] = true);
                        let ok = go(i + 1, busy, incomplete, reqs);
                        cands.iter().for_each(|&c| busy[c] = false);
                        ok
                    }
                    Mode::Count(k) => (0u32..(1 << free.len())).any(|mask| {
                        if mask.count_ones() != k {
                            return false;
                        }
                        let chosen: Vec<usize> = (0..free.len())
                            .filter(|b| mask & (1 << b) != 0)
                            .map(|b| free[b])
                            .collect();
                        chosen.iter().for_each(|&c| busy[c] = true);
                        let ok = go(i + 1, busy, incomplete, reqs);
                        chosen.iter().for_each(|&c| busy[c] = false);
                        ok
                    }),
                }
            })
        }
        go(0, &mut used.to_vec(), incomplete, reqs)
    }

    fn request(devices: usize) -> impl Strategy<Value = NodeRequest> {
        let alt = (
            prop_oneof![4 => (1u32..4).prop_map(Mode::Count), 1 => Just(Mode::All)],
            proptest::collection::btree_set(0..devices, 0..=devices),
        )
            .prop_map(|(m, s)| (m, s.into_iter().collect::<std::sync::Arc<[usize]>>()));
        proptest::collection::vec(alt, 1..3).prop_map(|alternatives| NodeRequest { alternatives })
    }

    proptest! {
        /// The allocator finds a solution exactly when one exists, and what it returns is one.
        #[test]
        fn the_allocator_agrees_with_exhaustive_search(
            used in proptest::collection::vec(any::<bool>(), 6),
            incomplete in proptest::bool::weighted(0.1),
            reqs in proptest::collection::vec(request(6), 1..4),
        ) {
            let got = allocate(&used, incomplete, &reqs).unwrap();
            prop_assert_eq!(got.is_some(), oracle(&used, incomplete, &reqs));
            if let Some(devs) = got {
                let mut seen = used.clone();
                for d in devs {
                    prop_assert!(!seen[d], "device {} taken twice or in use", d);
                    seen[d] = true;
                }
            }
        }
    }
}
