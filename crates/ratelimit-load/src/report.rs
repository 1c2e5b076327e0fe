//! What a run measured: text, JSON and an SVG plot.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};

use crate::config::{Distribution, Mode, StoreKind, Target};

/// Latency of the requests scheduled in one second of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct SecondStats {
    /// Seconds from the start (by scheduled time).
    pub second: u64,
    /// Requests scheduled in that second that completed.
    pub completed: u64,
    /// Median latency, µs.
    pub p50_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// Slowest, µs.
    pub max_us: u64,
}

/// The measurements of one run. Latencies are in microseconds, from each request's scheduled
/// time to its answer.
#[derive(Debug, Clone)]
pub struct Report {
    /// What was loaded.
    pub target: Target,
    /// Where state lived.
    pub store: StoreKind,
    /// Wrapper between gateway and store.
    pub mode: Mode,
    /// Gateway instances.
    pub gateways: usize,
    /// Users (abusive ones included).
    pub users: u64,
    /// Abusive users.
    pub abusive: u64,
    /// Distribution of normal users.
    pub dist: Distribution,
    /// The per-user limit, as text.
    pub limit: String,
    /// Decisions a second asked for.
    pub target_rate: f64,
    /// Length of the schedule.
    pub duration: Duration,
    /// Most checks in flight (store) or connections (HTTP).
    pub concurrency: usize,
    /// Requests in the schedule.
    pub scheduled: u64,
    /// Requests answered (admitted, denied or failed).
    pub completed: u64,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests denied.
    pub denied: u64,
    /// Requests that failed (store error, HTTP status other than 200/429, broken connection).
    pub errors: u64,
    /// `true` if the run was cut short because requests were still pending long after the end.
    pub timed_out: bool,
    /// From the first scheduled request to the last answer.
    pub elapsed: Duration,
    /// `completed / (elapsed + 1 / target_rate)`: `elapsed` spans one interval of the schedule
    /// fewer than it has requests.
    pub achieved_rate: f64,
    /// Requests that started more than 1 ms after their scheduled time.
    pub late_starts: u64,
    /// The latest start relative to schedule.
    pub max_start_lateness: Duration,
    /// Median latency.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Slowest.
    pub max_us: u64,
    /// Mean.
    pub mean_us: f64,
    /// Latency per second of schedule.
    pub per_second: Vec<SecondStats>,
    /// Users who sent at least one request.
    pub users_seen: u64,
    /// The most requests admitted for one user.
    pub max_admitted: u64,
    /// The most a user may be admitted over `elapsed` by the limit.
    pub admission_bound: u64,
    /// Users with more than `admission_bound` requests decided (admitted or denied; a failed
    /// request tests no limit): the only users a limiter could over-admit, so the only ones the
    /// exactness check tests. With none, `users_above_bound` is 0 whatever the limiter does.
    pub users_tested: u64,
    /// Users admitted more than `admission_bound`: 0 when admission is exact.
    pub users_above_bound: u64,
    /// Users admitted more than the bound (plus `tolerance`) of some interval within the run
    /// (from one admission's request to another's answer): 0 when the mode keeps its guarantee
    /// in every interval, not only over the whole run.
    pub users_above_in_some_interval: u64,
    /// How far above the exact bound the mode may admit by its documented guarantee, in any span
    /// or, with `tolerance_per_period`, per period the bound counts (leasing: one lease,
    /// `ratelimit_core::DEFAULT_MAX_LEASE` units by default, on the bucket algorithms;
    /// `gateways × (lease − 1)` per period on the sliding ones; 0 on fixed windows and for the
    /// exact modes).
    pub tolerance: u64,
    /// The tolerance is per period the bound counts, not once.
    pub tolerance_per_period: bool,
    /// Users admitted more than `admission_bound` plus the tolerance: 0 if the mode kept its
    /// guarantee.
    pub users_above_tolerance: u64,
    /// Users with more than `admission_bound` plus the tolerance requests decided: the only ones
    /// the tolerance check tests (with a tolerance of 0, the same as `users_tested`).
    pub users_tested_tolerance: u64,
    /// Live keys the memory store evicted at its cap (memory stores only). Not 0 means some users
    /// started again from a full quota mid-run, and the exactness figures do not hold.
    pub memory_evictions: Option<u64>,
    /// Requests sent by abusive users.
    pub abusive_sent: u64,
    /// Requests of abusive users admitted.
    pub abusive_admitted: u64,
    /// EVAL/EVALSHA calls Redis answered during the run (Redis store only).
    pub redis_calls: Option<u64>,
    /// Why the Redis server could not be read after the run (gone by its end: killed, stopped,
    /// unreachable), if it could not: its calls and its clock's rate are then unknown, and the
    /// exactness checks allow for the server's clock by 1 ms in any span only.
    pub redis_unread: Option<String>,
    /// How much faster the Redis server's clock ran than the tool's over the run, at most (parts
    /// per million, the readings' uncertainty included; 0 if slower): the bounds of the
    /// exactness checks are taken over spans that much longer, and 1 ms more (Redis store only).
    pub server_clock_faster_ppm: Option<f64>,
    /// Checks the wrappers answered without a store call of their own (denial-cache, leasing and
    /// coalesce modes; for coalesce, the checks that shared another check's script call).
    pub local_answers: Option<u64>,
    /// Checks the wrappers passed to the store (denial-cache and leasing modes).
    pub store_calls: Option<u64>,
}

impl Report {
    /// Redis calls per completed request, if the store is Redis.
    pub fn redis_calls_per_request(&self) -> Option<f64> {
        self.redis_calls
            .map(|c| c as f64 / (self.completed.max(1)) as f64)
    }

    /// `true` if the run kept up: p99 within `p99_target`, at least 95% of the target rate
    /// achieved, under 0.1% errors, and nothing cut short.
    pub fn sustained(&self, p99_target: Duration) -> bool {
        !self.timed_out
            && self.completed == self.scheduled
            && Duration::from_micros(self.p99_us) <= p99_target
            && self.achieved_rate >= 0.95 * self.target_rate
            && (self.errors as f64) < 0.001 * self.completed as f64
    }

    /// What keeps this run from showing the mode's guarantee (`--check`): a user admitted above
    /// the bound (plus the mode's tolerance) over the run or within some interval of it, live
    /// keys evicted, no user with more requests decided than the bound plus tolerance (nothing
    /// tested), failed requests (each one a decision not seen) or a run cut short. Empty if
    /// none.
    pub fn check(&self) -> Vec<String> {
        let mut failed = Vec::new();
        if self.users_above_tolerance > 0 {
            failed.push(format!(
                "{} users admitted above the bound{}",
                self.users_above_tolerance,
                if self.tolerance > 0 {
                    " + tolerance"
                } else {
                    ""
                }
            ));
        }
        if self.users_above_in_some_interval > 0 {
            failed.push(format!(
                "{} users admitted above the bound of some interval within the run",
                self.users_above_in_some_interval
            ));
        }
        if let Some(n) = self.memory_evictions.filter(|&n| n > 0) {
            failed.push(format!("the memory store evicted {n} live keys"));
        }
        if self.users_tested_tolerance == 0 {
            failed.push(
                "no user had more requests decided than the bound + tolerance: nothing was tested"
                    .to_owned(),
            );
        }
        if self.errors > 0 {
            failed.push(format!("{} requests failed", self.errors));
        }
        if let Some(why) = &self.redis_unread {
            failed.push(format!("Redis could not be read after the run: {why}"));
        }
        if self.timed_out || self.completed < self.scheduled {
            failed.push(format!(
                "cut short: {} of {} requests answered",
                self.completed, self.scheduled
            ));
        }
        failed
    }

    /// The report as JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "target": self.target.to_string(),
            "store": self.store.to_string(),
            "mode": self.mode.to_string(),
            "gateways": self.gateways,
            "users": self.users,
            "abusive": self.abusive,
            "dist": self.dist.to_string(),
            "limit": self.limit,
            "target_rate": self.target_rate,
            "duration_s": self.duration.as_secs_f64(),
            "concurrency": self.concurrency,
            "scheduled": self.scheduled,
            "completed": self.completed,
            // None for a bare server, as `exactness` below: it has no limiter to fail.
            "check_failures": if self.store == StoreKind::None {
                serde_json::Value::Null
            } else {
                json!(self.check())
            },
            "admitted": self.admitted,
            "denied": self.denied,
            "errors": self.errors,
            "timed_out": self.timed_out,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "achieved_rate": self.achieved_rate,
            "late_starts": self.late_starts,
            "max_start_lateness_us": self.max_start_lateness.as_micros() as u64,
            "latency_us": {
                "p50": self.p50_us,
                "p90": self.p90_us,
                "p99": self.p99_us,
                "p99.9": self.p999_us,
                "max": self.max_us,
                "mean": self.mean_us,
            },
            // A bare server (`--store none`) has no limiter: every 200 would read as an admission,
            // and its "users above bound" as a limiter's failure.
            "exactness": if self.store == StoreKind::None {
                serde_json::Value::Null
            } else {
                json!({
                    "users_seen": self.users_seen,
                    "max_admitted": self.max_admitted,
                    "bound": self.admission_bound,
                    "users_tested": self.users_tested,
                    "users_above_bound": self.users_above_bound,
                    "users_above_in_some_interval": self.users_above_in_some_interval,
                    "tolerance": self.tolerance,
                    "tolerance_per_period": self.tolerance_per_period,
                    "users_above_tolerance": self.users_above_tolerance,
                    "users_tested_tolerance": self.users_tested_tolerance,
                    "memory_evictions": self.memory_evictions,
                    "abusive_sent": self.abusive_sent,
                    "abusive_admitted": self.abusive_admitted,
                })
            },
            "redis_calls": self.redis_calls,
            "redis_calls_per_request": self.redis_calls_per_request(),
            "redis_unread": self.redis_unread,
            "server_clock_faster_ppm": self.server_clock_faster_ppm,
            "local_answers": self.local_answers,
            "store_calls": self.store_calls,
            "per_second": self.per_second.iter().map(|s| json!({
                "second": s.second,
                "completed": s.completed,
                "p50_us": s.p50_us,
                "p99_us": s.p99_us,
                "max_us": s.max_us,
            })).collect::<Vec<_>>(),
        })
    }

    /// The report as text for a terminal.
    pub fn text(&self) -> String {
        let mut o = String::new();
        let abusive = if self.abusive > 0 {
            format!(", {} abusive", self.abusive)
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "{} target, {} store, {} mode, {} gateway(s), {} users ({}{abusive}), limit {}",
            self.target, self.store, self.mode, self.gateways, self.users, self.dist, self.limit
        );
        let _ = writeln!(
            o,
            "schedule   {} requests at {:.0}/s over {:.1} s, {} {}",
            self.scheduled,
            self.target_rate,
            self.duration.as_secs_f64(),
            self.concurrency,
            if self.target == Target::Http {
                "connections"
            } else {
                "in flight at most"
            }
        );
        let _ = writeln!(
            o,
            "achieved   {:.0}/s ({:.1}% of target): {} completed in {:.2} s{}",
            self.achieved_rate,
            100.0 * self.achieved_rate / self.target_rate,
            self.completed,
            self.elapsed.as_secs_f64(),
            if self.timed_out { ", CUT SHORT" } else { "" }
        );
        let _ = writeln!(
            o,
            "behind     {} started over 1 ms late ({:.2}%), latest by {:.1} ms",
            self.late_starts,
            100.0 * self.late_starts as f64 / self.completed.max(1) as f64,
            self.max_start_lateness.as_secs_f64() * 1e3
        );
        let _ = writeln!(
            o,
            "latency    p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  (mean {}), from scheduled time",
            ms(self.p50_us),
            ms(self.p90_us),
            ms(self.p99_us),
            ms(self.p999_us),
            ms(self.max_us),
            ms(self.mean_us as u64)
        );
        let _ = writeln!(
            o,
            "decisions  {} admitted, {} denied, {} errors",
            self.admitted, self.denied, self.errors
        );
        if self.store == StoreKind::None {
            // Every 200 of a bare server counts as an admission: its "users above bound" would
            // read as a limiter's failure.
            let _ = writeln!(
                o,
                "exactness  not measured: no limiter (--store none, the bare-server baseline); {} users seen",
                self.users_seen
            );
        } else {
            let _ = writeln!(
                o,
                "exactness  {} users seen; most admitted for one user {} (bound {}); users above bound: {}",
                self.users_seen, self.max_admitted, self.admission_bound, self.users_above_bound
            );
            let _ = writeln!(
                o,
                "           users above the bound (+ tolerance) of some interval within the run: {}",
                self.users_above_in_some_interval
            );
            let _ = writeln!(
                o,
                "           users with more than the bound decided (the only ones that test it): {}{}",
                self.users_tested,
                if self.users_tested == 0 {
                    " (this run does not test exactness)"
                } else {
                    ""
                }
            );
            if self.tolerance > 0 {
                let _ = writeln!(
                    o,
                    "           documented tolerance of this mode +{}{}: users above bound + tolerance: {}",
                    self.tolerance,
                    if self.tolerance_per_period {
                        " per period"
                    } else {
                        ""
                    },
                    self.users_above_tolerance
                );
                let _ = writeln!(
                    o,
                    "           users with more than bound + tolerance decided (the only ones that test it): {}{}",
                    self.users_tested_tolerance,
                    if self.users_tested_tolerance == 0 {
                        " (this run does not test the tolerance)"
                    } else {
                        ""
                    }
                );
            }
        }
        if let Some(n) = self.memory_evictions.filter(|&n| n > 0) {
            let _ = writeln!(
                o,
                "WARNING    the memory store evicted {n} live keys at its cap: those users started again \
                 from a full quota, and the exactness figures above do not hold"
            );
        }
        if self.abusive > 0 {
            let _ = writeln!(
                o,
                "abusive    {} sent, {} admitted",
                self.abusive_sent, self.abusive_admitted
            );
        }
        if let (Some(c), Some(per)) = (self.redis_calls, self.redis_calls_per_request()) {
            let _ = writeln!(o, "redis      {c} EVAL/EVALSHA calls, {per:.3} per request");
        }
        if let Some(why) = &self.redis_unread {
            let _ = writeln!(
                o,
                "WARNING    Redis could not be read after the run ({why}): its EVAL/EVALSHA calls \
                 and its clock's rate are unknown, and the exactness figures allow for its clock \
                 by 1 ms in any span only"
            );
        }
        if let Some(ppm) = self.server_clock_faster_ppm {
            let _ = writeln!(
                o,
                "clocks     the server's ran at most {ppm:.0} ppm faster than the tool's (allowed for, with 1 ms more in any span)"
            );
        }
        if let (Some(h), Some(s)) = (self.local_answers, self.store_calls) {
            let what = if self.mode == Mode::Coalesce {
                "shared another check's script call"
            } else {
                "answered locally"
            };
            let _ = writeln!(
                o,
                "{:<10} {h} {what}, {s} store calls ({:.3} per request)",
                self.mode.to_string(),
                s as f64 / self.completed.max(1) as f64
            );
        }
        o
    }

    /// p50 and p99 latency per second of schedule, as a standalone SVG document.
    pub fn svg(&self) -> String {
        let (w, h) = (800.0, 400.0);
        let (left, right, top, bottom) = (70.0, 20.0, 40.0, 50.0);
        let pw = w - left - right;
        let ph = h - top - bottom;
        let secs = self.per_second.last().map_or(1, |s| s.second + 1).max(1) as f64;
        let top_us = self
            .per_second
            .iter()
            .map(|s| s.p99_us)
            .max()
            .unwrap_or(1)
            .max(1);
        let y_max = nice_ceiling(top_us as f64 / 1e3 * 1.1);
        let x = |s: f64| left + pw * (s + 0.5) / secs;
        let y = |us: u64| top + ph * (1.0 - (us as f64 / 1e3 / y_max).min(1.0));
        let mut o = String::new();
        let _ = writeln!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(o, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
        let _ = writeln!(
            o,
            r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#,
            w / 2.0,
            escape(&format!(
                "{} {} {}: {} gateway(s), {:.0}/s target, {:.0}/s achieved",
                self.target,
                self.store,
                self.mode,
                self.gateways,
                self.target_rate,
                self.achieved_rate
            ))
        );
        for k in 0..=5 {
            let v = y_max * f64::from(k) / 5.0;
            let yy = top + ph * (1.0 - f64::from(k) / 5.0);
            let _ = writeln!(
                o,
                r##"<line x1="{left}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                left + pw,
                left - 6.0,
                yy + 4.0,
                trim_float(v)
            );
        }
        let step = (secs / 10.0).ceil().max(1.0) as u64;
        for s in (0..secs as u64).step_by(step as usize) {
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{s}</text>"#,
                x(s as f64),
                top + ph + 18.0
            );
        }
        let _ = writeln!(
            o,
            r#"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">seconds (by scheduled time)</text>"#,
            left + pw / 2.0,
            h - 10.0
        );
        let _ = writeln!(
            o,
            r#"<text x="16" y="{:.1}" text-anchor="middle" transform="rotate(-90 16 {:.1})">latency, ms</text>"#,
            top + ph / 2.0,
            top + ph / 2.0
        );
        for (name, color, pick) in [
            (
                "p50",
                "#1f77b4",
                (|s: &SecondStats| s.p50_us) as fn(&SecondStats) -> u64,
            ),
            ("p99", "#d62728", |s: &SecondStats| s.p99_us),
        ] {
            let points: Vec<String> = self
                .per_second
                .iter()
                .map(|s| format!("{:.1},{:.1}", x(s.second as f64), y(pick(s))))
                .collect();
            let _ = writeln!(
                o,
                r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
                points.join(" ")
            );
            let ly = if name == "p50" {
                top + 16.0
            } else {
                top + 32.0
            };
            let _ = writeln!(
                o,
                r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"/><text x="{:.1}" y="{:.1}">{name}</text>"#,
                left + 10.0,
                left + 30.0,
                left + 36.0,
                ly + 4.0
            );
        }
        o.push_str("</svg>\n");
        o
    }
}

/// The runs of a sweep, in increasing rate, up to the first that was not sustained.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// The p99 a step had to stay under.
    pub p99_target: Duration,
    /// One report per step.
    pub steps: Vec<Report>,
}

impl Sweep {
    /// The highest target rate that was sustained.
    pub fn sustained_rate(&self) -> Option<f64> {
        self.steps
            .iter()
            .filter(|r| r.sustained(self.p99_target))
            .map(|r| r.target_rate)
            .reduce(f64::max)
    }

    /// The sweep as JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "p99_target_ms": self.p99_target.as_secs_f64() * 1e3,
            "sustained_rate": self.sustained_rate(),
            "steps": self.steps.iter().map(|r| {
                let mut v = r.to_json();
                if let Value::Object(m) = &mut v {
                    m.insert("sustained".into(), r.sustained(self.p99_target).into());
                }
                v
            }).collect::<Vec<_>>(),
        })
    }

    /// The sweep as text: one line per step.
    pub fn text(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "{:>10} {:>10} {:>9} {:>9} {:>9} {:>8}  sustained (p99 <= {} ms)",
            "target/s",
            "achieved/s",
            "p50 ms",
            "p99 ms",
            "max ms",
            "errors",
            trim_float(self.p99_target.as_secs_f64() * 1e3)
        );
        for r in &self.steps {
            let _ = writeln!(
                o,
                "{:>10.0} {:>10.0} {:>9} {:>9} {:>9} {:>8}  {}",
                r.target_rate,
                r.achieved_rate,
                ms(r.p50_us),
                ms(r.p99_us),
                ms(r.max_us),
                r.errors,
                if r.sustained(self.p99_target) {
                    "yes"
                } else {
                    "no"
                }
            );
        }
        match self.sustained_rate() {
            Some(r) => {
                let _ = writeln!(o, "highest sustained rate: {r:.0}/s");
            }
            None => {
                let _ = writeln!(o, "no step was sustained");
            }
        }
        o
    }
}

/// Microseconds shown as milliseconds with three decimals.
fn ms(us: u64) -> String {
    format!("{:.3}", us as f64 / 1e3)
}

fn trim_float(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// 1, 2 or 5 times a power of ten, at least `v`.
fn nice_ceiling(v: f64) -> f64 {
    if !(v.is_finite() && v > 0.0) {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|c| *c >= v)
        .unwrap_or(10.0 * p)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_ceilings() {
        assert_eq!(nice_ceiling(0.7), 1.0);
        assert_eq!(nice_ceiling(1.1), 2.0);
        assert_eq!(nice_ceiling(3.0), 5.0);
        assert_eq!(nice_ceiling(12.0), 20.0);
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(trim_float(2.5), "2.5");
        assert_eq!(trim_float(10.0), "10");
    }
}
