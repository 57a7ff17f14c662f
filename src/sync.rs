//! One way to take a `std::sync::Mutex`.
//!
//! What raygate keeps behind a mutex (the admission pass's cache, bookkeeping
//! of writes and causes, metric series, a cache of token reviews, static
//! filter verdicts) is written whole under the lock, so a panic in another
//! task cannot leave it half-written. A poisoned lock is therefore taken
//! anyway: skipping the work on poison would silently lose a cache or a
//! metric for the rest of the process, and `unwrap` would turn one panic into
//! one per later caller.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, poisoned or not (see the module doc).
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_still_taken_with_what_was_written() {
        let m = std::sync::Arc::new(Mutex::new(vec![1]));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let mut g = m2.lock().unwrap();
            g.push(2);
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), [1, 2]);
    }
}
