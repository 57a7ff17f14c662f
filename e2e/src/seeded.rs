//! What the seeded soaks share: their random numbers, their seed and their time budget, so a
//! seed printed by any of them replays the same steps.

use std::time::Duration;

/// splitmix64: tiny, seedable, the same sequence on every machine.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (0 when n is 0).
    pub fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next_u64() % u64::try_from(n.max(1)).unwrap_or(1)).unwrap_or(0)
    }
}

/// A whole number from the environment, if set and valid.
pub fn env_num(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// `RAYGATE_SOAK_SEED`, else one from the clock (printed by the caller, to replay the run).
pub fn seed() -> u64 {
    env_num("RAYGATE_SOAK_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    })
}

/// How long a soak takes random steps: `RAYGATE_SOAK_MINUTES` (the long mode of `e2e/soak`),
/// else `RAYGATE_SOAK_SECONDS`, else `default_secs`.
pub fn budget(default_secs: u64) -> Duration {
    match env_num("RAYGATE_SOAK_MINUTES") {
        Some(m) => Duration::from_secs(m * 60),
        None => Duration::from_secs(env_num("RAYGATE_SOAK_SECONDS").unwrap_or(default_secs)),
    }
}
