//! What the tests observe besides responses: metrics, log lines and resident memory.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The metrics recorded by the layers built inside [`Metrics::register`].
///
/// The debugging recorder's snapshots reset counters; this keeps running totals, so
/// [`counter`](Metrics::counter) can be read any number of times.
pub struct Metrics {
    recorder: DebuggingRecorder,
    snapshotter: Snapshotter,
    counters: Mutex<HashMap<String, u64>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh recorder.
    pub fn new() -> Metrics {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        Metrics {
            recorder,
            snapshotter,
            counters: Mutex::new(HashMap::new()),
        }
    }

    /// Runs `f` (building layers) with this recorder installed, so the layers' metric handles
    /// record into it from then on.
    pub fn register<T>(&self, f: impl FnOnce() -> T) -> T {
        metrics::with_local_recorder(&self.recorder, f)
    }

    fn id(name: &str, labels: &[(&str, &str)]) -> String {
        let mut l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        l.sort();
        format!("{name}{{{}}}", l.join(","))
    }

    fn drain(&self) {
        let mut counters = lock(&self.counters);
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            if let DebugValue::Counter(n) = value {
                let labels: Vec<(&str, &str)> =
                    key.key().labels().map(|l| (l.key(), l.value())).collect();
                *counters
                    .entry(Metrics::id(key.key().name(), &labels))
                    .or_default() += n;
            }
        }
    }

    /// The total of counter `name` with exactly these labels (0 if never incremented).
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.drain();
        lock(&self.counters)
            .get(&Metrics::id(name, labels))
            .copied()
            .unwrap_or(0)
    }

    /// `ratelimit_decisions_total{policy, outcome}`.
    pub fn decisions(&self, policy: &str, outcome: &str) -> u64 {
        self.counter(
            tower_ratelimit::metrics::DECISIONS_TOTAL,
            &[("policy", policy), ("outcome", outcome)],
        )
    }

    /// `ratelimit_store_errors_total{policy, kind}`.
    pub fn store_errors(&self, policy: &str, kind: &str) -> u64 {
        self.counter(
            tower_ratelimit::metrics::STORE_ERRORS_TOTAL,
            &[("policy", policy), ("kind", kind)],
        )
    }
}

/// The log lines (level INFO and above) of this process, captured by a small `tracing`
/// subscriber installed as the global default.
#[derive(Debug)]
pub struct Logs {
    lines: Arc<Mutex<Vec<String>>>,
}

/// At most this many lines are kept (a failing store under load logs on every request).
const MAX_LINES: usize = 200_000;

impl Logs {
    /// Installs the capturing subscriber (once per process) and returns it.
    ///
    /// Call it before building anything that logs, so every call site sees the subscriber.
    pub fn install() -> &'static Logs {
        static LOGS: OnceLock<Logs> = OnceLock::new();
        LOGS.get_or_init(|| {
            let lines = Arc::new(Mutex::new(Vec::new()));
            let subscriber = Capture {
                lines: Arc::clone(&lines),
            };
            // Another subscriber may already be installed by the test binary; then nothing is
            // captured, and tests asserting on logs fail, saying so.
            let _ = tracing::subscriber::set_global_default(subscriber);
            Logs { lines }
        })
    }

    /// The captured lines that contain every one of `needles`.
    pub fn matching(&self, needles: &[&str]) -> Vec<String> {
        lock(&self.lines)
            .iter()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .cloned()
            .collect()
    }

    /// How many lines were captured.
    pub fn len(&self) -> usize {
        lock(&self.lines).len()
    }

    /// Whether none were.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

struct Capture {
    lines: Arc<Mutex<Vec<String>>>,
}

struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, " {value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            let _ = write!(self.0, " {value}");
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }
}

impl Subscriber for Capture {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= Level::INFO
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let m = event.metadata();
        let mut line = Line(format!("{} {}:", m.level(), m.target()));
        event.record(&mut line);
        let mut lines = lock(&self.lines);
        if lines.len() < MAX_LINES {
            lines.push(line.0);
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// The resident set size of this process in bytes, from `/proc/self/statm` (Linux).
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("statm has a resident page count");
    // x86-64 and aarch64 Linux use 4 KiB pages here; the tests state the assumption.
    pages * 4096
}
