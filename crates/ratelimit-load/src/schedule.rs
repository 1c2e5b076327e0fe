//! The open-loop schedule: request i is due at `start + i / rate`, for a user drawn
//! deterministically from (seed, i).

use std::time::Duration;

use crate::config::{Config, Distribution};

/// Draws the user of each request.
#[derive(Debug)]
pub(crate) struct Sampler {
    seed: u64,
    normal: u64,
    abusive: u64,
    /// Probability that a request comes from an abusive user, as a fraction of 2^64.
    abuse_threshold: u64,
    /// Zipf: cumulative weights of ranks 1..=normal, normalised to 1.0 at the end.
    cdf: Option<Vec<f64>>,
}

impl Sampler {
    pub(crate) fn new(c: &Config) -> Sampler {
        let normal = c.users - c.abusive;
        // Each abusive user sends `factor` times a normal user's mean rate:
        // K * f * (1 - p) / normal = p, so p = K f / (normal + K f).
        let kf = c.abusive as f64 * c.abuse_factor;
        let p = kf / (normal as f64 + kf);
        let abuse_threshold = if c.abusive == 0 {
            0
        } else {
            (p * u64::MAX as f64) as u64
        };
        let cdf = match c.dist {
            Distribution::Uniform => None,
            Distribution::Zipf(s) => {
                let mut acc = 0.0;
                let mut v: Vec<f64> = (1..=normal)
                    .map(|k| {
                        acc += (k as f64).powf(-s);
                        acc
                    })
                    .collect();
                let total = acc;
                for x in &mut v {
                    *x /= total;
                }
                Some(v)
            }
        };
        Sampler {
            seed: c.seed,
            normal,
            abusive: c.abusive,
            abuse_threshold,
            cdf,
        }
    }

    /// The user of request `i`: ids `0..normal` are normal users, `normal..users` abusive.
    pub(crate) fn user(&self, i: u64) -> u64 {
        let a = splitmix64(self.seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let b = splitmix64(a);
        if self.abusive > 0 && a < self.abuse_threshold {
            return self.normal + b % self.abusive;
        }
        match &self.cdf {
            None => b % self.normal,
            Some(cdf) => {
                let u = (b >> 11) as f64 / (1u64 << 53) as f64;
                let rank = cdf.partition_point(|&c| c < u) as u64;
                rank.min(self.normal - 1)
            }
        }
    }

    /// `true` for the ids of abusive users.
    pub(crate) fn is_abusive(&self, user: u64) -> bool {
        user >= self.normal
    }
}

/// When request `i` is due, from the start, at `rate` a second.
pub(crate) fn due(i: u64, rate: f64) -> Duration {
    Duration::from_nanos((i as f64 * 1e9 / rate) as u64)
}

/// How many requests are due by `elapsed` (request 0 is due at once).
pub(crate) fn due_by(elapsed: Duration, rate: f64) -> u64 {
    (elapsed.as_nanos() as f64 * rate / 1e9) as u64 + 1
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Writes `prefix` and the decimal digits of `n` into `buf`, returning the bytes written: the
/// key of a user, without allocating.
pub(crate) fn user_key(buf: &mut [u8; 24], n: u64) -> &[u8] {
    buf[0] = b'u';
    let mut digits = [0u8; 20];
    let mut len = 0;
    let mut v = n;
    loop {
        digits[len] = b'0' + (v % 10) as u8;
        len += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for k in 0..len {
        buf[1 + k] = digits[len - 1 - k];
    }
    &buf[..=len]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dist: Distribution, users: u64, abusive: u64) -> Config {
        Config {
            dist,
            users,
            abusive,
            ..Config::default()
        }
    }

    #[test]
    fn uniform_covers_every_user_evenly() {
        let s = Sampler::new(&config(Distribution::Uniform, 10, 0));
        let mut counts = [0u32; 10];
        for i in 0..100_000 {
            counts[s.user(i) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn zipf_favours_low_ranks() {
        let s = Sampler::new(&config(Distribution::Zipf(1.0), 1_000, 0));
        let mut counts = vec![0u32; 1_000];
        for i in 0..200_000 {
            counts[s.user(i) as usize] += 1;
        }
        // Rank 1 has weight 1 / H(1000) ~ 13.4% of the draws, rank 2 half of that.
        let first = f64::from(counts[0]) / 200_000.0;
        assert!((0.12..0.15).contains(&first), "{first}");
        assert!(counts[0] > counts[1] && counts[1] > counts[9] && counts[9] > counts[500]);
    }

    #[test]
    fn abusive_users_send_the_factor_more() {
        // 990 normal users and 10 abusive ones at 100x: 1000 / (990 + 1000) of the requests.
        let s = Sampler::new(&config(Distribution::Uniform, 1_000, 10));
        let n = 400_000;
        let abusive = (0..n).filter(|&i| s.is_abusive(s.user(i))).count();
        let share = abusive as f64 / n as f64;
        assert!((share - 1000.0 / 1990.0).abs() < 0.01, "{share}");
        assert!((0..n).all(|i| s.user(i) < 1_000));
    }

    #[test]
    fn schedule_and_keys() {
        assert_eq!(due(0, 1000.0), Duration::ZERO);
        assert_eq!(due(1500, 1000.0), Duration::from_millis(1500));
        assert_eq!(due_by(Duration::ZERO, 1000.0), 1);
        assert_eq!(due_by(Duration::from_millis(10), 1000.0), 11);
        let mut buf = [0u8; 24];
        assert_eq!(user_key(&mut buf, 0), b"u0");
        assert_eq!(user_key(&mut buf, 123_456), b"u123456");
        assert_eq!(user_key(&mut buf, u64::MAX), b"u18446744073709551615");
    }
}
