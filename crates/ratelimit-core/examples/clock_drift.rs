//! How far `SystemClock` and `WallClock` move from the system's wall clock over a run.
//!
//! ```text
//! cargo run --release -p ratelimit-core --example clock_drift [seconds per round, default 20] [rounds, default 3]
//! ```
//!
//! Each round makes both clocks, reads them against `SystemTime` at the start and after the
//! given time, and prints how far each moved from it, in microseconds and in parts per million
//! of the time elapsed. `SystemClock` advances at the time-stamp counter's rate as calibrated
//! once per process, so its drift is the same in every round of one run; `WallClock` reads the
//! system clock itself and does not drift (it can only stand still after a step back).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ratelimit_core::{Clock, SystemClock, WallClock};

fn wall_micros() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i128)
}

/// The clock's time minus the system's wall clock, in microseconds.
fn offset(clock: &impl Clock) -> i128 {
    let before = wall_micros();
    let t = i128::from(clock.now().as_micros());
    let after = wall_micros();
    t - (before + after) / 2
}

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(20);
    let rounds: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    println!("round  elapsed_s  clock        start_offset_us  end_offset_us  drift_us  drift_ppm");
    for round in 1..=rounds {
        let (system, wall) = (SystemClock::new(), WallClock::new());
        let started = Instant::now();
        let starts = [offset(&system), offset(&wall)];
        std::thread::sleep(Duration::from_secs(secs));
        let ends = [offset(&system), offset(&wall)];
        let elapsed = started.elapsed().as_secs_f64();
        for (i, name) in ["SystemClock", "WallClock"].into_iter().enumerate() {
            let drift = ends[i] - starts[i];
            println!(
                "{round:>5}  {elapsed:>9.1}  {name:<11}  {:>15}  {:>13}  {drift:>8}  {:>9.2}",
                starts[i],
                ends[i],
                drift as f64 / elapsed
            );
        }
    }
}
