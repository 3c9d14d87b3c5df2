//! Seeded open-loop workloads: request arrival times from a gamma renewal
//! process (Poisson when the shape is 1) and prompt and output lengths from
//! ShareGPT-like distributions.

use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Gamma, LogNormal};

/// A distribution of token counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Lengths {
    /// Always the same length.
    Fixed(usize),
    /// A lognormal distribution with the given mean and log-space standard
    /// deviation, rounded and clipped to `min..=max` (clipping moves the
    /// mean a little).
    LogNormal {
        /// Mean of the distribution before clipping.
        mean: f64,
        /// Standard deviation of the logarithm (its shape: larger is more
        /// skewed; the median is `mean / exp(sigma² / 2)`).
        sigma: f64,
        /// Smallest length.
        min: usize,
        /// Largest length.
        max: usize,
    },
    /// A mixture: with probability `long_fraction` a draw from `long`,
    /// otherwise from `short`. Both must be [`Lengths::LogNormal`] or
    /// [`Lengths::Fixed`] (a mixture does not nest).
    Mix {
        /// The common case.
        short: MixPart,
        /// The rare long case.
        long: MixPart,
        /// Fraction of draws from `long`, in `0..=1`.
        long_fraction: f64,
    },
}

/// One part of a [`Lengths::Mix`]: a lognormal clipped to `min..=max`, like
/// [`Lengths::LogNormal`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MixPart {
    /// Mean before clipping.
    pub mean: f64,
    /// Standard deviation of the logarithm.
    pub sigma: f64,
    /// Smallest length.
    pub min: usize,
    /// Largest length.
    pub max: usize,
}

/// ShareGPT-like prompt lengths, the short part of every mix and
/// [`Lengths::sharegpt_prompt`].
const SHAREGPT_PROMPT: MixPart = MixPart {
    mean: 161.0,
    sigma: 1.0,
    min: 4,
    max: 4096,
};

impl MixPart {
    fn lengths(self) -> Lengths {
        Lengths::LogNormal {
            mean: self.mean,
            sigma: self.sigma,
            min: self.min,
            max: self.max,
        }
    }
}

impl Lengths {
    /// ShareGPT-like prompt lengths: lognormal, mean 161 tokens, sigma 1.0
    /// (median 98), clipped to 4..=4096.
    pub fn sharegpt_prompt() -> Lengths {
        SHAREGPT_PROMPT.lengths()
    }

    /// ShareGPT-like output lengths: lognormal, mean 338 tokens, sigma 0.9
    /// (median 225), clipped to 1..=2048.
    pub fn sharegpt_output() -> Lengths {
        Lengths::LogNormal {
            mean: 338.0,
            sigma: 0.9,
            min: 1,
            max: 2048,
        }
    }

    /// A long-prompt mix: ShareGPT-like prompts, and one in five a long
    /// document (lognormal, mean 3000 tokens, sigma 0.5, clipped to
    /// 1024..=8192), as in retrieval-augmented or summarisation traffic.
    /// The mean is about 730 tokens.
    pub fn long_prompt_mix() -> Lengths {
        Lengths::Mix {
            short: SHAREGPT_PROMPT,
            long: MixPart {
                mean: 3000.0,
                sigma: 0.5,
                min: 1024,
                max: 8192,
            },
            long_fraction: 0.2,
        }
    }

    /// A long-document mix: ShareGPT-like chat prompts, and one in ten a
    /// long document of 8k–20k tokens (lognormal, mean 12,000 tokens,
    /// sigma 0.3, clipped to 8192..=20480), as in summarisation or
    /// retrieval over whole files. The mean is about 1,350 tokens; a
    /// request of the long part costs the engine about 200 ms of prefill
    /// alone.
    pub fn long_document_mix() -> Lengths {
        Lengths::Mix {
            short: SHAREGPT_PROMPT,
            long: MixPart {
                mean: 12_000.0,
                sigma: 0.3,
                min: 8192,
                max: 20_480,
            },
            long_fraction: 0.1,
        }
    }

    /// Draws one length.
    ///
    /// # Panics
    ///
    /// If a lognormal's `mean` is not positive or its `sigma` is negative.
    pub fn sample(&self, rng: &mut impl rand::Rng) -> usize {
        match *self {
            Lengths::Fixed(length) => length,
            Lengths::LogNormal {
                mean,
                sigma,
                min,
                max,
            } => {
                assert!(mean > 0.0, "a lognormal length needs a positive mean");
                let mu = mean.ln() - sigma * sigma / 2.0;
                let distribution = LogNormal::new(mu, sigma).expect("sigma is not negative");
                let length = distribution.sample(rng).round();
                (length as usize).clamp(min, max)
            }
            Lengths::Mix {
                short,
                long,
                long_fraction,
            } => {
                let part = if rng.random::<f64>() < long_fraction {
                    long
                } else {
                    short
                };
                part.lengths().sample(rng)
            }
        }
    }
}

/// An open-loop workload: clients send requests at random times whatever
/// the server does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Workload {
    /// Mean arrival rate, requests per second.
    pub rate: f64,
    /// Shape of the gamma distribution of the gaps between arrivals: 1 is a
    /// Poisson process; below 1 is burstier, above 1 smoother. The squared
    /// coefficient of variation of the gaps is `1 / burstiness`.
    pub burstiness: f64,
    /// Prompt lengths.
    pub prompt_tokens: Lengths,
    /// Output lengths.
    pub output_tokens: Lengths,
}

impl Workload {
    /// Poisson arrivals at `rate` requests per second with ShareGPT-like
    /// lengths.
    pub fn sharegpt(rate: f64) -> Workload {
        Workload {
            rate,
            burstiness: 1.0,
            prompt_tokens: Lengths::sharegpt_prompt(),
            output_tokens: Lengths::sharegpt_output(),
        }
    }

    /// The endless sequence of arrivals for `seed`.
    ///
    /// Gaps and lengths come from two generators derived from the seed, and
    /// gaps are drawn at unit mean then divided by the rate: the same seed
    /// at another rate gives the same requests, in the same order, at
    /// proportionally scaled times.
    ///
    /// # Panics
    ///
    /// If `rate` or `burstiness` is not positive and finite.
    pub fn arrivals(&self, seed: u64) -> Arrivals {
        assert!(
            self.rate.is_finite() && self.rate > 0.0,
            "the arrival rate must be positive"
        );
        assert!(
            self.burstiness.is_finite() && self.burstiness > 0.0,
            "burstiness (the gamma shape) must be positive"
        );
        Arrivals {
            gaps: Gamma::new(self.burstiness, 1.0 / self.burstiness).expect("checked above"),
            rate: self.rate,
            prompt_tokens: self.prompt_tokens,
            output_tokens: self.output_tokens,
            gap_rng: StdRng::seed_from_u64(seed),
            length_rng: StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15),
            elapsed: 0.0,
        }
    }
}

/// One request of a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// When it arrives, from the start of the workload.
    pub at: Duration,
    /// Its prompt length.
    pub prompt_tokens: usize,
    /// Its output length.
    pub output_tokens: usize,
}

/// The arrivals of a [`Workload`], in time order; never ends.
#[derive(Debug, Clone)]
pub struct Arrivals {
    gaps: Gamma<f64>,
    rate: f64,
    prompt_tokens: Lengths,
    output_tokens: Lengths,
    gap_rng: StdRng,
    length_rng: StdRng,
    /// Seconds from the start to the last arrival.
    elapsed: f64,
}

impl Iterator for Arrivals {
    type Item = Arrival;

    fn next(&mut self) -> Option<Arrival> {
        self.elapsed += self.gaps.sample(&mut self.gap_rng) / self.rate;
        Some(Arrival {
            at: Duration::from_secs_f64(self.elapsed),
            prompt_tokens: self.prompt_tokens.sample(&mut self.length_rng),
            output_tokens: self.output_tokens.sample(&mut self.length_rng),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean(values: impl Iterator<Item = f64>) -> (f64, f64) {
        let values: Vec<f64> = values.collect();
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        (mean, variance)
    }

    /// How many lengths a mix's shares are measured over.
    const DRAWS: usize = 50_000;

    /// `DRAWS` lengths drawn from `lengths` (seed 5).
    fn draw(lengths: Lengths) -> Vec<usize> {
        let mut rng = StdRng::seed_from_u64(5);
        (0..DRAWS).map(|_| lengths.sample(&mut rng)).collect()
    }

    #[test]
    fn sharegpt_lengths_have_the_fitted_means() {
        let arrivals: Vec<_> = Workload::sharegpt(10.0).arrivals(7).take(50_000).collect();
        let (prompt, _) = mean(arrivals.iter().map(|a| a.prompt_tokens as f64));
        let (output, _) = mean(arrivals.iter().map(|a| a.output_tokens as f64));
        assert!((150.0..170.0).contains(&prompt), "{prompt}");
        assert!((320.0..350.0).contains(&output), "{output}");
        assert!(
            arrivals
                .iter()
                .all(|a| (4..=4096).contains(&a.prompt_tokens))
        );
        assert!(
            arrivals
                .iter()
                .all(|a| (1..=2048).contains(&a.output_tokens))
        );
    }

    #[test]
    fn gaps_have_the_rate_and_the_burstiness() {
        for (burstiness, cv2) in [(1.0, 1.0), (0.25, 4.0), (4.0, 0.25)] {
            let workload = Workload {
                burstiness,
                ..Workload::sharegpt(50.0)
            };
            let times: Vec<f64> = workload
                .arrivals(3)
                .take(100_000)
                .map(|a| a.at.as_secs_f64())
                .collect();
            let gaps = times.windows(2).map(|w| w[1] - w[0]);
            let (mean, variance) = mean(gaps);
            assert!((mean * 50.0 - 1.0).abs() < 0.03, "{mean}");
            let measured = variance / (mean * mean);
            assert!(
                (measured / cv2 - 1.0).abs() < 0.1,
                "{burstiness}: {measured}"
            );
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_requests_at_any_rate() {
        let slow: Vec<_> = Workload::sharegpt(10.0).arrivals(42).take(100).collect();
        let fast: Vec<_> = Workload::sharegpt(40.0).arrivals(42).take(100).collect();
        let again: Vec<_> = Workload::sharegpt(10.0).arrivals(42).take(100).collect();
        assert_eq!(slow, again);
        for (slow, fast) in slow.iter().zip(&fast) {
            assert_eq!(slow.prompt_tokens, fast.prompt_tokens);
            assert_eq!(slow.output_tokens, fast.output_tokens);
            let ratio = slow.at.as_secs_f64() / fast.at.as_secs_f64();
            assert!((ratio - 4.0).abs() < 1e-6);
        }
        let other: Vec<_> = Workload::sharegpt(10.0).arrivals(43).take(100).collect();
        assert_ne!(slow, other);
    }

    #[test]
    fn the_long_document_mix_has_one_prompt_of_8k_to_20k_tokens_in_ten() {
        let lengths = draw(Lengths::long_document_mix());
        let long: Vec<usize> = lengths.iter().copied().filter(|&n| n >= 8192).collect();
        let share = long.len() as f64 / DRAWS as f64;
        assert!((0.095..0.105).contains(&share), "{share}");
        assert!(long.iter().all(|&n| n <= 20_480));
        // The short part never reaches the long one.
        assert!(lengths.iter().all(|&n| n <= 4096 || n >= 8192));
        let (mean, _) = mean(lengths.iter().map(|&n| n as f64));
        assert!((1250.0..1450.0).contains(&mean), "{mean}");
    }

    #[test]
    fn the_long_prompt_mix_has_one_long_prompt_in_five() {
        let lengths = draw(Lengths::long_prompt_mix());
        let share = lengths.iter().filter(|&&n| n >= 1024).count() as f64 / DRAWS as f64;
        // ShareGPT-like prompts of 1024 or more are rare (about 1%).
        assert!((0.19..0.22).contains(&share), "{share}");
        let (mean, _) = mean(lengths.iter().map(|&n| n as f64));
        assert!((680.0..780.0).contains(&mean), "{mean}");
    }

    #[test]
    fn fixed_lengths_are_fixed() {
        let workload = Workload {
            prompt_tokens: Lengths::Fixed(7),
            output_tokens: Lengths::Fixed(9),
            ..Workload::sharegpt(1.0)
        };
        assert!(
            workload
                .arrivals(0)
                .take(10)
                .all(|a| (a.prompt_tokens, a.output_tokens) == (7, 9))
        );
    }
}
