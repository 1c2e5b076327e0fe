//! Run with: cargo run -p example-boundary (add `-- --svg PATH` to choose where the plot goes)
//!
//! The window-boundary experiment, through every algorithm: a limit of 100 requests per minute,
//! 150 requests at 59.9 s and 150 more at 60.1 s. A fixed window aligned to the minute admits 100
//! on each side of the boundary: 200 requests within 0.2 s. The other algorithms admit 100.
//!
//! Then the same client keeps sending bursts of 150 (at 75 s, 90 s, 105 s and 119.9 s), and the
//! program writes an SVG plot of the requests admitted so far against time, one line per
//! algorithm, to `boundary.svg` in the current directory (or the path after `--svg`).
//!
//! Nothing sleeps: every store runs on a `ManualClock` set to each burst's time.

use std::fmt::Write as _;

#[path = "../../common/say.rs"]
mod say;
use say::{say, tell};

use ratelimit_core::{Algorithm, Limit, ManualClock, MemoryStore, Quota, Timestamp};

/// Requests per burst.
const BURST: u64 = 150;
/// The limit: this many requests per minute.
const PER_MINUTE: u64 = 100;
/// When the bursts arrive, in milliseconds: the experiment (59.9 s, 60.1 s), then four more.
const BURSTS_MS: [u64; 6] = [59_900, 60_100, 75_000, 90_000, 105_000, 119_900];
/// The plot's time axis ends here (seconds).
const PLOT_END_SECS: u64 = 120;

/// What one algorithm admitted in each burst of [`BURSTS_MS`].
#[derive(Debug, Clone)]
struct Run {
    algorithm: Algorithm,
    admitted: Vec<u64>,
}

impl Run {
    /// Admitted at 59.9 s plus at 60.1 s: the boundary experiment.
    fn across_boundary(&self) -> u64 {
        self.admitted[0] + self.admitted[1]
    }

    /// Admitted in all bursts.
    fn total(&self) -> u64 {
        self.admitted.iter().sum()
    }
}

/// Sends [`BURST`] requests of one client at each time of [`BURSTS_MS`] through a fresh
/// in-memory store, under `algorithm` with 100 per minute.
fn run(algorithm: Algorithm) -> Result<Run, ratelimit_core::ConfigError> {
    let clock = ManualClock::new();
    let store = MemoryStore::builder().with_clock(clock.clone()).build()?;
    let limit = Limit::single(algorithm, Quota::per_minute(PER_MINUTE)?)?;
    let admitted = BURSTS_MS
        .iter()
        .map(|&ms| {
            clock.set(Timestamp::from_millis(ms));
            (0..BURST)
                .map(|_| u64::from(store.check_now(b"client", &limit, 1).is_allowed()))
                .sum()
        })
        .collect();
    Ok(Run {
        algorithm,
        admitted,
    })
}

/// Seconds with one decimal: `59.9`.
fn secs(ms: u64) -> String {
    format!("{}.{}", ms / 1_000, ms % 1_000 / 100)
}

/// The boundary table and the table of every burst.
fn tables(runs: &[Run]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{PER_MINUTE} requests per minute; {BURST} requests at 59.9 s and {BURST} at 60.1 s\n"
    );
    let _ = writeln!(
        out,
        "{:<16}{:>10}{:>10}{:>8}  within 0.2 s",
        "algorithm", "59.9 s", "60.1 s", "total"
    );
    for r in runs {
        let total = r.across_boundary();
        let note = if total > PER_MINUTE {
            format!("{total} > limit {PER_MINUTE}: the boundary problem")
        } else {
            format!("holds the limit of {PER_MINUTE}")
        };
        let _ = writeln!(
            out,
            "{:<16}{:>10}{:>10}{:>8}  {note}",
            r.algorithm.name(),
            r.admitted[0],
            r.admitted[1],
            total
        );
    }

    let _ = writeln!(
        out,
        "\nadmitted per burst of {BURST}, then bursts at 75, 90, 105 and 119.9 s\n"
    );
    let _ = write!(out, "{:<16}", "algorithm");
    for &ms in &BURSTS_MS {
        let _ = write!(out, "{:>8}", format!("{} s", secs(ms)));
    }
    let _ = writeln!(out, "{:>8}", "total");
    for r in runs {
        let _ = write!(out, "{:<16}", r.algorithm.name());
        for a in &r.admitted {
            let _ = write!(out, "{a:>8}");
        }
        let _ = writeln!(out, "{:>8}", r.total());
    }
    out
}

/// How each algorithm's line is drawn: colour, width and dash pattern. Token bucket and GCRA
/// make the same decisions, and the sliding window is close to them, so the lines are drawn
/// from wide to narrow to stay visible on top of each other.
fn style(algorithm: Algorithm) -> (&'static str, f64, &'static str) {
    match algorithm {
        Algorithm::TokenBucket => ("#9ecae1", 9.0, ""),
        Algorithm::Gcra => ("#1f4e9e", 3.0, "9 6"),
        Algorithm::FixedWindow => ("#d62728", 2.5, ""),
        Algorithm::SlidingWindow => ("#2ca02c", 1.5, ""),
        _ => ("#9467bd", 2.5, "2 4"),
    }
}

/// Where a panel is drawn and which times it shows.
struct Panel {
    title: &'static str,
    top: f64,
    bottom: f64,
    from_ms: u64,
    to_ms: u64,
    tick_ms: u64,
}

/// The SVG document's size and the plot area's left and right edges.
const SVG_W: f64 = 880.0;
const SVG_H: f64 = 820.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 840.0;

/// An SVG plot of the requests admitted so far against time, one polyline per algorithm: the
/// whole run (0-120 s) above, and a zoom on the boundary (59.8-60.2 s) below.
fn svg(runs: &[Run]) -> String {
    let max_total = runs.iter().map(Run::total).max().unwrap_or(0);
    let y_max = (max_total + 50).div_ceil(100) * 100;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{SVG_W}" height="{SVG_H}" viewBox="0 0 {SVG_W} {SVG_H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="{SVG_W}" height="{SVG_H}" fill="white"/>"#
    );
    let panels = [
        Panel {
            title: "Requests admitted so far: 100 per minute, bursts of 150 at 59.9, 60.1, 75, 90, 105 and 119.9 s",
            top: 50.0,
            bottom: 430.0,
            from_ms: 0,
            to_ms: PLOT_END_SECS * 1_000,
            tick_ms: 10_000,
        },
        Panel {
            title: "Zoom on the minute boundary: 59.8 s to 60.2 s",
            top: 530.0,
            bottom: 760.0,
            from_ms: 59_800,
            to_ms: 60_200,
            tick_ms: 100,
        },
    ];
    for (i, panel) in panels.iter().enumerate() {
        // Only the first panel gets the legend; both get every line.
        draw_panel(&mut s, panel, runs, y_max, i == 0);
    }
    s.push_str("</svg>\n");
    s
}

/// Draws one panel: title, grid, axes, the minute boundary and one step line per algorithm.
fn draw_panel(s: &mut String, p: &Panel, runs: &[Run], y_max: u64, legend: bool) {
    let (top, bottom) = (p.top, p.bottom);
    let span = (p.to_ms - p.from_ms) as f64;
    let x =
        |ms: u64| LEFT + (RIGHT - LEFT) * (ms.clamp(p.from_ms, p.to_ms) - p.from_ms) as f64 / span;
    let y = |n: u64| bottom - (bottom - top) * n as f64 / y_max as f64;

    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle" font-size="15">{}</text>"#,
        (LEFT + RIGHT) / 2.0,
        top - 22.0,
        p.title
    );
    let mut t = p.from_ms;
    while t <= p.to_ms {
        let px = x(t);
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{top}" x2="{px:.1}" y2="{bottom}" stroke="#e5e5e5"/><text x="{px:.1}" y="{}" text-anchor="middle">{}</text>"##,
            bottom + 18.0,
            secs_label(t, p.tick_ms)
        );
        t += p.tick_ms;
    }
    for n in (0..=y_max).step_by(100) {
        let py = y(n);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{RIGHT}" y2="{py:.1}" stroke="#e5e5e5"/><text x="{}" y="{:.1}" text-anchor="end">{n}</text>"##,
            LEFT - 8.0,
            py + 4.0
        );
    }
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{bottom}" x2="{RIGHT}" y2="{bottom}" stroke="black"/><line x1="{LEFT}" y1="{top}" x2="{LEFT}" y2="{bottom}" stroke="black"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">time (s)</text><text x="18" y="{2}" text-anchor="middle" transform="rotate(-90 18 {2})">admitted requests</text>"#,
        (LEFT + RIGHT) / 2.0,
        bottom + 38.0,
        (top + bottom) / 2.0
    );
    let _ = writeln!(
        s,
        r##"<line x1="{0:.1}" y1="{top}" x2="{0:.1}" y2="{bottom}" stroke="#999" stroke-dasharray="2 3"/><text x="{1:.1}" y="{2}" fill="#666">minute boundary</text>"##,
        x(60_000),
        x(60_000) + 4.0,
        bottom - 8.0
    );

    for (i, r) in runs.iter().enumerate() {
        let (colour, width, dash) = style(r.algorithm);
        let dash_attr = if dash.is_empty() {
            String::new()
        } else {
            format!(r#" stroke-dasharray="{dash}""#)
        };
        // A step line: flat between bursts, straight up at each burst.
        let mut points = format!("{:.1},{:.1}", x(p.from_ms), y(0));
        let mut sum = 0;
        // Only the bursts within the panel's time range.
        for (&ms, &a) in BURSTS_MS.iter().zip(&r.admitted) {
            if ms < p.from_ms || ms > p.to_ms {
                continue;
            }
            let _ = write!(points, " {:.1},{:.1}", x(ms), y(sum));
            sum += a;
            let _ = write!(points, " {:.1},{:.1}", x(ms), y(sum));
        }
        let _ = write!(points, " {:.1},{:.1}", x(p.to_ms), y(sum));
        let _ = writeln!(
            s,
            r#"<polyline data-algorithm="{}" fill="none" stroke="{colour}" stroke-width="{width}"{dash_attr} points="{points}"/>"#,
            r.algorithm.name()
        );
        if legend {
            let ly = top + 14.0 + 20.0 * i as f64;
            let _ = writeln!(
                s,
                r#"<line x1="{0}" y1="{ly}" x2="{1}" y2="{ly}" stroke="{colour}" stroke-width="{width}"{dash_attr}/><text x="{2}" y="{3}">{4}: {5} across the boundary, {6} in all</text>"#,
                LEFT + 14.0,
                LEFT + 44.0,
                LEFT + 52.0,
                ly + 4.0,
                r.algorithm.name(),
                r.across_boundary(),
                r.total()
            );
        }
    }
}

/// A tick label: whole seconds on a coarse axis, tenths on a fine one.
fn secs_label(ms: u64, tick_ms: u64) -> String {
    if tick_ms >= 1_000 {
        (ms / 1_000).to_string()
    } else {
        secs(ms)
    }
}

fn main() -> std::process::ExitCode {
    match cli() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err((status, message)) => {
            tell(format_args!("example-boundary: {message}"));
            std::process::ExitCode::from(status)
        }
    }
}

/// A failure to write stdout, as `cli` returns it.
fn cannot_print(e: std::io::Error) -> (u8, String) {
    (1, format!("cannot write the output: {e}"))
}

/// Prints the tables and writes the chart; or the exit status (2 for a wrong command line, 1
/// for a failure) and what went wrong.
fn cli() -> Result<(), (u8, String)> {
    let usage = |message: String| (2, message);
    let mut path = std::path::PathBuf::from("boundary.svg");
    // `args_os`: a path need not be UTF-8, and `args` would panic on one that is not.
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        match arg.to_string_lossy().as_ref() {
            "--svg" => {
                path = args
                    .next()
                    .ok_or_else(|| usage("--svg needs a path".into()))?
                    .into();
            }
            "--help" | "-h" => {
                say(format_args!(
                    "example-boundary: each algorithm at a window's boundary, as a table and a \
                     chart\n\nUsage: example-boundary [--svg PATH]\n\n  \
                     --svg PATH  where to write the chart (default boundary.svg)"
                ))
                .map_err(cannot_print)?;
                return Ok(());
            }
            other => {
                return Err(usage(format!(
                    "unknown argument `{other}` (try --svg PATH)"
                )));
            }
        }
    }
    let runs = Algorithm::ALL
        .into_iter()
        .map(run)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| (1, e.to_string()))?;
    // The tables first, so that a chart that cannot be written costs them nothing (and a reader
    // that goes away early, `| head`, costs the chart nothing: `say` carries on).
    say(format_args!("{}", tables(&runs).trim_end_matches('\n'))).map_err(cannot_print)?;
    let shown = path.display();
    std::fs::write(&path, svg(&runs)).map_err(|e| (1, format!("cannot write {shown}: {e}")))?;
    say(format_args!("\nplot written to {shown}")).map_err(cannot_print)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs() -> Vec<Run> {
        Algorithm::ALL
            .into_iter()
            .map(|a| run(a).unwrap())
            .collect()
    }

    #[test]
    fn only_the_fixed_window_admits_twice_the_limit_across_the_boundary() {
        for r in runs() {
            let expected = if r.algorithm == Algorithm::FixedWindow {
                [100, 100]
            } else {
                [100, 0]
            };
            assert_eq!(r.admitted[..2], expected, "{}", r.algorithm.name());
        }
        let table = tables(&runs());
        assert!(
            table.contains("fixed_window           100       100     200"),
            "{table}"
        );
        assert!(
            table.contains("sliding_log            100         0     100"),
            "{table}"
        );
    }

    #[test]
    fn after_the_boundary_each_algorithm_refills_as_it_should() {
        let got: Vec<(&str, Vec<u64>)> = runs()
            .into_iter()
            .map(|r| (r.algorithm.name(), r.admitted))
            .collect();
        let expected: Vec<(&str, Vec<u64>)> = vec![
            // 100 a minute come back at a steady 25 per 15 s.
            ("token_bucket", vec![100, 0, 25, 25, 25, 25]),
            ("gcra", vec![100, 0, 25, 25, 25, 25]),
            // The window 60-120 s was used up at 60.1 s.
            ("fixed_window", vec![100, 100, 0, 0, 0, 0]),
            // The previous window's 100 weigh less and less as the current one goes by.
            ("sliding_window", vec![100, 0, 25, 25, 25, 24]),
            // Exact: nothing until the first 100 are a minute old, at 119.9 s.
            ("sliding_log", vec![100, 0, 0, 0, 0, 100]),
        ];
        assert_eq!(got, expected);
        // In the minute from 59.9 s only the fixed window admits 200; the buckets admit at most
        // 175 (their burst of 100 plus what refills in those seconds), the sliding ones less.
        for r in runs() {
            let first_minute: u64 = r.admitted[..5].iter().sum();
            if r.algorithm == Algorithm::FixedWindow {
                assert_eq!(first_minute, 200);
            } else {
                assert!(first_minute <= 175, "{}", r.algorithm.name());
            }
        }
    }

    #[test]
    fn the_plot_is_an_svg_with_one_polyline_per_algorithm() {
        let runs = runs();
        let svg = svg(&runs);
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.ends_with("</svg>\n"));
        // One polyline per algorithm in each of the two panels.
        assert_eq!(svg.matches("<polyline ").count(), 2 * Algorithm::ALL.len());
        for a in Algorithm::ALL {
            assert!(svg.contains(&format!("data-algorithm=\"{}\"", a.name())));
        }
        // Every element is closed: one `/>` per opened line, rect, polyline.
        let opened = svg.matches("<line ").count()
            + svg.matches("<rect ").count()
            + svg.matches("<polyline ").count();
        assert_eq!(svg.matches("/>").count(), opened);
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
        // Each line has 2 points and 2 per burst the panel shows (all six above, the two at
        // 59.9 and 60.1 s in the zoom), all inside its panel.
        let lines: Vec<&str> = svg
            .split("points=\"")
            .skip(1)
            .map(|rest| rest.split('"').next().unwrap())
            .collect();
        assert_eq!(lines.len(), 2 * Algorithm::ALL.len());
        for (i, points) in lines.iter().enumerate() {
            let (bursts, top, bottom) = if i < Algorithm::ALL.len() {
                (BURSTS_MS.len(), 50.0, 430.0)
            } else {
                (2, 530.0, 760.0)
            };
            assert_eq!(points.split(' ').count(), 2 + 2 * bursts, "{points}");
            for p in points.split(' ') {
                let (px, py) = p.split_once(',').unwrap();
                let (px, py): (f64, f64) = (px.parse().unwrap(), py.parse().unwrap());
                assert!(
                    (LEFT..=RIGHT).contains(&px) && (top..=bottom).contains(&py),
                    "{p}"
                );
            }
        }
    }
}
