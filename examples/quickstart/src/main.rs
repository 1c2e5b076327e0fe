//! Run with: cargo run -p example-quickstart (add `-- --demo` to watch it answer 429)
//!
//! The smallest useful setup: an axum API on 127.0.0.1 where each client IP may make 5 requests
//! per 10 seconds as a token bucket, counted in this process's memory: a burst of 5, then one
//! request every 2 seconds as the tokens come back. A request with no token left gets
//! `429 Too Many Requests` with `Retry-After`.
//!
//! Flags:
//! - `--listen ADDR`: where to listen (default `127.0.0.1:3000`);
//! - `--demo`: listen on a free port, send 7 requests to itself, wait as `Retry-After` says,
//!   send one more, print what each got, and exit.

use std::error::Error;

#[path = "../../common/say.rs"]
mod say;
use say::{say, tell};
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use ratelimit_core::{Algorithm, Limit, MemoryStore, Quota};
use tower_ratelimit::{Policy, RateLimitLayer};

/// Where the server listens unless `--listen` says otherwise.
const DEFAULT_LISTEN: &str = "127.0.0.1:3000";
/// Requests each client may make per [`WINDOW`].
const LIMIT: u64 = 5;
/// The period of the quota.
const WINDOW: Duration = Duration::from_secs(10);

/// The API: `GET /` answers a greeting, at most 5 times per 10 seconds per client IP.
///
/// The key is the TCP peer address (the default key of a [`Policy`]), so the router must be
/// served with `into_make_service_with_connect_info::<SocketAddr>()`.
fn app() -> Result<Router, tower_ratelimit::Error> {
    let quota = Quota::per_period(LIMIT, WINDOW)?;
    let policy = Policy::new("quickstart", Limit::single(Algorithm::TokenBucket, quota)?)?;
    let layer = RateLimitLayer::new(MemoryStore::new(), policy)?;
    Ok(Router::new()
        .route(
            "/",
            get(|| async {
                "Hello! You may call me 5 times at once, then once every 2 seconds.\n"
            }),
        )
        .layer(layer))
}

/// Serves `app` on `listener` until the process ends.
async fn serve(listener: tokio::net::TcpListener, app: Router) -> std::io::Result<()> {
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}

/// `r` of a `RateLimit` field such as `"quickstart";r=4;t=2`.
fn remaining(field: &str) -> Option<&str> {
    field.split(';').find_map(|item| item.strip_prefix("r="))
}

/// One line of the demo for one response.
fn describe(n: usize, response: &reqwest::Response) -> String {
    let status = response.status();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    let detail = if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
        format!("retry-after={}", header("retry-after"))
    } else {
        let field = header("ratelimit");
        format!("remaining={}", remaining(&field).unwrap_or("-"))
    };
    format!("request {n:>2}: {status}  {detail}")
}

/// Starts the app on a free loopback port, sends 7 requests, waits as the last `Retry-After`
/// says, sends an 8th, and returns one line per request (and one for the wait).
async fn demo() -> Result<Vec<String>, Box<dyn Error>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/", listener.local_addr()?);
    let server = tokio::spawn(serve(listener, app()?));
    // The demo talks to itself on loopback: never through an HTTP_PROXY set for the machine.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()?;

    let mut lines = Vec::new();
    let mut retry_after = None;
    for n in 1..=7 {
        let response = client.get(&url).send().await?;
        lines.push(describe(n, &response));
        if let Some(v) = response.headers().get("retry-after") {
            retry_after = Some(v.to_str()?.parse::<u64>()?);
        }
    }
    let wait = retry_after.ok_or("no request was denied")?;
    lines.push(format!("(waiting {wait} s, as Retry-After says)"));
    tokio::time::sleep(Duration::from_secs(wait)).await;
    let response = client.get(&url).send().await?;
    lines.push(describe(8, &response));
    server.abort();
    Ok(lines)
}

/// Why the quickstart stopped: a wrong command line (status 2), or a failure while it ran
/// (status 1).
enum Failure {
    Usage(String),
    Run(Box<dyn Error>),
}

impl<E: Into<Box<dyn Error>>> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure::Run(e.into())
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(Failure::Usage(message)) => {
            tell(format_args!("example-quickstart: {message}"));
            std::process::ExitCode::from(2)
        }
        Err(Failure::Run(e)) => {
            tell(format_args!("example-quickstart: {e}"));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Failure> {
    let mut listen = DEFAULT_LISTEN.to_owned();
    let mut run_demo = false;
    // `args_os`: `args` would panic on an argument that is not UTF-8.
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        match arg.to_string_lossy().as_ref() {
            "--demo" => run_demo = true,
            "--listen" => {
                listen = args
                    .next()
                    .ok_or_else(|| Failure::Usage("--listen needs an address".into()))?
                    .into_string()
                    .map_err(|a| {
                        Failure::Usage(format!(
                            "--listen {}: not an address (expected IP:PORT)",
                            a.to_string_lossy()
                        ))
                    })?;
                // Read now, so that a malformed address is a wrong command line (status 2), not a
                // failure of the run (1, kept for an address in use).
                if let Err(e) = std::net::ToSocketAddrs::to_socket_addrs(listen.as_str()) {
                    return Err(Failure::Usage(format!(
                        "--listen {listen}: not an address (expected IP:PORT): {e}"
                    )));
                }
            }
            "--help" | "-h" => {
                say(format_args!(
                    "example-quickstart: an axum app with a rate limit in memory\n\n\
                     Usage: example-quickstart [--demo] [--listen ADDR]\n\n  \
                     --demo         send a few requests to itself and print the answers\n  \
                     --listen ADDR  serve on ADDR (default {DEFAULT_LISTEN})"
                ))?;
                return Ok(());
            }
            other => {
                return Err(Failure::Usage(format!(
                    "unknown argument `{other}` (try --demo or --listen ADDR)"
                )));
            }
        }
    }

    if run_demo {
        say(format_args!(
            "{LIMIT} requests per {} s per client IP; sending 7 at once:",
            WINDOW.as_secs()
        ))?;
        for line in demo().await? {
            say(format_args!("{line}"))?;
        }
        return Ok(());
    }

    let listener = tokio::net::TcpListener::bind(&listen).await.map_err(|e| {
        format!("cannot listen on {listen}: {e} (try --listen 127.0.0.1:3001, or --demo)")
    })?;
    let addr = listener.local_addr()?;
    say(format_args!(
        "quickstart listening on http://{addr}/ ({LIMIT} requests per {} s per client IP)",
        WINDOW.as_secs()
    ))?;
    say(format_args!(
        "try it: for i in 1 2 3 4 5 6; do curl -si http://{addr}/ | head -n 1; done"
    ))?;
    say(format_args!(
        "        curl -i http://{addr}/    # right after: 429 Too Many Requests, Retry-After (a token comes back every 2 s)"
    ))?;
    serve(listener, app()?).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Extension;
    use axum::body::Body;
    use axum::extract::ConnectInfo;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    fn request() -> axum::http::Request<Body> {
        axum::http::Request::get("/").body(Body::empty()).unwrap()
    }

    #[tokio::test]
    async fn five_per_client_then_429_with_retry_after() {
        // The peer address as `axum::serve` would give it, in the extensions (`PeerIp` also reads
        // axum's `MockConnectInfo`, which tests can use instead).
        let router = app().unwrap();
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let app = router.clone().layer(Extension(ConnectInfo(peer)));
        for left in (0..5).rev() {
            let res = app.clone().oneshot(request()).await.unwrap();
            assert_eq!(res.status(), 200);
            let field = res.headers()["ratelimit"].to_str().unwrap().to_owned();
            assert_eq!(
                remaining(&field),
                Some(left.to_string().as_str()),
                "{field}"
            );
            let body = res.into_body().collect().await.unwrap().to_bytes();
            assert!(body.starts_with(b"Hello!"));
        }
        let res = app.clone().oneshot(request()).await.unwrap();
        assert_eq!(res.status(), 429);
        // One token every 2 s: the wait is just under 2 s, rounded up.
        assert_eq!(res.headers()["retry-after"], "2");
        assert_eq!(res.headers()["ratelimit-policy"], "\"quickstart\";q=5;w=10");

        // Another client of the same router is counted apart.
        let other_peer: SocketAddr = "127.0.0.2:40000".parse().unwrap();
        let other = router.layer(Extension(ConnectInfo(other_peer)));
        assert_eq!(other.oneshot(request()).await.unwrap().status(), 200);
    }

    /// The demo exactly as the README's first command runs it: over a real connection, on the
    /// system clock (so this test waits the 2 s that `Retry-After` says, on purpose: it checks
    /// what a new user sees, which a manual clock would not). The limiting itself is tested on a
    /// manual clock above and in the crates.
    #[tokio::test]
    async fn the_demo_shows_five_allowed_two_denied_and_one_after_the_wait() {
        let lines = demo().await.unwrap();
        assert_eq!(
            lines,
            [
                "request  1: 200 OK  remaining=4",
                "request  2: 200 OK  remaining=3",
                "request  3: 200 OK  remaining=2",
                "request  4: 200 OK  remaining=1",
                "request  5: 200 OK  remaining=0",
                "request  6: 429 Too Many Requests  retry-after=2",
                "request  7: 429 Too Many Requests  retry-after=2",
                "(waiting 2 s, as Retry-After says)",
                "request  8: 200 OK  remaining=0",
            ]
        );
    }
}
