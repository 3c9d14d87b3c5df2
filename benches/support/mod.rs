//! Side-by-side figures that survive a noisy machine: the variants run in
//! interleaved batches, round after round, and each keeps its fastest batch.
//! A neighbour's burst of load then slows every variant's worst batches,
//! not one variant's whole measurement, and the ratios stay put.

use std::time::{Duration, Instant};

/// A named piece of work to time; one call is one iteration.
pub type Variant<'a> = (&'static str, &'a mut dyn FnMut());

/// Times `variants` in `rounds` interleaved rounds and prints, for each, the
/// fastest batch's time per iteration and its ratio to the first variant.
/// Runs only under `cargo bench` (not `cargo test --benches`).
pub fn print_table(title: &str, variants: &mut [Variant<'_>]) {
    if !std::env::args().any(|arg| arg == "--bench") {
        return;
    }
    const ROUNDS: usize = 40;
    const BATCH: Duration = Duration::from_millis(2);

    // Size each variant's batch to about BATCH.
    let iterations: Vec<u32> = variants
        .iter_mut()
        .map(|(_, run)| {
            let started = Instant::now();
            for _ in 0..1000 {
                run();
            }
            let per = started.elapsed() / 1000;
            (BATCH.as_nanos() / per.as_nanos().max(1)).clamp(100, 1_000_000) as u32
        })
        .collect();

    let mut fastest = vec![f64::INFINITY; variants.len()];
    for _ in 0..ROUNDS {
        for (index, (_, run)) in variants.iter_mut().enumerate() {
            let started = Instant::now();
            for _ in 0..iterations[index] {
                run();
            }
            let per = started.elapsed().as_nanos() as f64 / f64::from(iterations[index]);
            fastest[index] = fastest[index].min(per);
        }
    }

    println!("\n{title}: fastest of {ROUNDS} interleaved batches");
    println!("{:<48} {:>10} {:>10}", "variant", "ns/iter", "ratio");
    for (index, (name, _)) in variants.iter().enumerate() {
        println!(
            "{:<48} {:>10.1} {:>9.2}x",
            name,
            fastest[index],
            fastest[index] / fastest[0]
        );
    }
}
