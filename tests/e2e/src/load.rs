//! A bounded HTTP load that records every response.

use std::fmt;
use std::time::{Duration, Instant};

/// How long the client waits for any response before recording it as a failure (status 0). No
/// request in these tests may come close: a response that slow is a hang.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// An HTTP client for loopback tests: no proxy, a [`CLIENT_TIMEOUT`] on every request.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(CLIENT_TIMEOUT)
        .pool_max_idle_per_host(64)
        .build()
        .expect("build the HTTP client")
}

/// One request and its answer.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Which route (the label given to [`run`]).
    pub route: &'static str,
    /// When it was sent, from the start of the load.
    pub sent_at: Duration,
    /// How long the answer took.
    pub latency: Duration,
    /// The status, or 0 if the client got no response (error or [`CLIENT_TIMEOUT`]).
    pub status: u16,
    /// The `Retry-After` header, if any.
    pub retry_after: Option<String>,
    /// Whether the answer carried the `RateLimit` field: a decision of the store (or of the
    /// local fallback), which a request let through by fail-open, or refused by fail-closed,
    /// does not carry. On a fail-open route a 200 with it was decided, one without it was not.
    pub decided: bool,
}

/// The samples of one load.
#[derive(Debug, Clone, Default)]
pub struct Samples(pub Vec<Sample>);

impl Samples {
    /// The samples of one route.
    pub fn route(&self, route: &str) -> Samples {
        Samples(
            self.0
                .iter()
                .filter(|s| s.route == route)
                .cloned()
                .collect(),
        )
    }

    /// The samples sent in `[from, to)` (offsets from the start of the load).
    pub fn sent_between(&self, from: Duration, to: Duration) -> Samples {
        Samples(
            self.0
                .iter()
                .filter(|s| s.sent_at >= from && s.sent_at < to)
                .cloned()
                .collect(),
        )
    }

    /// The samples answered before `t` (sent and answered: `sent_at + latency < t`).
    pub fn answered_before(&self, t: Duration) -> Samples {
        Samples(
            self.0
                .iter()
                .filter(|s| s.sent_at + s.latency < t)
                .cloned()
                .collect(),
        )
    }

    /// The share (0 to 1) of samples that answered `status`; 0 if there are none, so that a
    /// window left empty (a recovery slower than the test allows for) fails an assertion of a
    /// share instead of passing it with no evidence.
    pub fn share(&self, status: u16) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.count(status) as f64 / self.0.len() as f64
    }

    /// How many samples there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many answered `status`.
    pub fn count(&self, status: u16) -> usize {
        self.0.iter().filter(|s| s.status == status).count()
    }

    /// How many carried the `RateLimit` field (see [`Sample::decided`]).
    pub fn decided(&self) -> usize {
        self.0.iter().filter(|s| s.decided).count()
    }

    /// The share (0 to 1) of samples that carried the `RateLimit` field; 0 if there are none
    /// (see [`share`](Self::share)).
    pub fn decided_share(&self) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.decided() as f64 / self.0.len() as f64
    }

    /// The statuses that were answered, each once, sorted.
    pub fn statuses(&self) -> Vec<u16> {
        let mut v: Vec<u16> = self.0.iter().map(|s| s.status).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The latency at percentile `p` (0 to 100), nearest rank; zero if there are no samples.
    pub fn percentile(&self, p: f64) -> Duration {
        let mut l: Vec<Duration> = self.0.iter().map(|s| s.latency).collect();
        if l.is_empty() {
            return Duration::ZERO;
        }
        l.sort_unstable();
        let rank = ((p / 100.0) * l.len() as f64).ceil() as usize;
        l[rank.clamp(1, l.len()) - 1]
    }

    /// The largest latency; zero if there are no samples.
    pub fn max(&self) -> Duration {
        self.0.iter().map(|s| s.latency).max().unwrap_or_default()
    }

    /// The first sample (by time of sending) that answered `status`.
    pub fn first_with(&self, status: u16) -> Option<&Sample> {
        self.0
            .iter()
            .filter(|s| s.status == status)
            .min_by_key(|s| s.sent_at)
    }
}

impl fmt::Display for Samples {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counts: Vec<String> = self
            .statuses()
            .iter()
            .map(|s| format!("{s}: {}", self.count(*s)))
            .collect();
        write!(
            f,
            "{} requests [{}], p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            self.len(),
            counts.join(", "),
            ms(self.percentile(50.0)),
            ms(self.percentile(99.0)),
            ms(self.max())
        )
    }
}

/// A duration in milliseconds, for printing.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1_000.0
}

/// Sends one GET and records it (`sent_at` from `origin`).
pub async fn get(
    client: &reqwest::Client,
    route: &'static str,
    url: &str,
    origin: Instant,
) -> Sample {
    let start = Instant::now();
    let res = client.get(url).send().await;
    let latency = start.elapsed();
    let (status, retry_after, decided) = match res {
        Ok(r) => {
            let status = r.status().as_u16();
            let ra = r
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let decided = r.headers().contains_key("ratelimit");
            // Read the body, so that the connection goes back to the pool; a body that breaks
            // off is no answer.
            match r.bytes().await {
                Ok(_) => (status, ra, decided),
                Err(_) => (0, None, false),
            }
        }
        Err(_) => (0, None, false),
    };
    Sample {
        route,
        sent_at: start.duration_since(origin),
        latency,
        status,
        retry_after,
        decided,
    }
}

/// Runs `workers` concurrent loops per route for `duration`, each sending a GET, recording it,
/// and pausing `pause` before the next. Returns every sample, sorted by time of sending.
///
/// `origin` is the instant the offsets are measured from, so the caller can inject a fault at a
/// known offset.
pub async fn run(
    client: &reqwest::Client,
    routes: &[(&'static str, String)],
    workers: usize,
    duration: Duration,
    pause: Duration,
    origin: Instant,
) -> Samples {
    let mut tasks = Vec::new();
    for (route, url) in routes {
        for _ in 0..workers {
            let client = client.clone();
            let url = url.clone();
            let route = *route;
            tasks.push(tokio::spawn(async move {
                let mut out = Vec::new();
                while origin.elapsed() < duration {
                    out.push(get(&client, route, &url, origin).await);
                    tokio::time::sleep(pause).await;
                }
                out
            }));
        }
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("a load worker panicked"));
    }
    all.sort_by_key(|s| s.sent_at);
    Samples(all)
}
