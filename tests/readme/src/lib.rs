//! The code blocks of the README and of the docs that show Rust, compiled (and those without
//! `no_run` run) as doc tests (`cargo test -p readme-check --doc`), so that what a new user
//! copies works.
//!
//! The blocks hide no lines (GitHub would show them), so what they do is checked here: the first
//! two blocks are also files of this crate, which the tests below check the README holds word
//! for word, and run.
#![doc = include_str!("../../../README.md")]
#![forbid(unsafe_code)]

/// The Rust blocks of `docs/redis.md`, compiled as doc tests.
#[doc = include_str!("../../../docs/redis.md")]
pub mod redis_doc {}

/// The Rust blocks of `docs/round-trips.md`, compiled as doc tests.
#[doc = include_str!("../../../docs/round-trips.md")]
pub mod round_trips_doc {}

/// The Rust blocks of `crates/ratelimit-core/README.md` (the crate's page on crates.io).
#[doc = include_str!("../../../crates/ratelimit-core/README.md")]
pub mod core_readme {}

/// The Rust blocks of `crates/ratelimit-redis/README.md`.
#[doc = include_str!("../../../crates/ratelimit-redis/README.md")]
pub mod redis_readme {}

/// The Rust blocks of `crates/tower-ratelimit/README.md`.
#[doc = include_str!("../../../crates/tower-ratelimit/README.md")]
pub mod tower_readme {}

#[cfg(test)]
const README: &str = include_str!("../../../README.md");

/// The README's first block: `app()`, and a `main` that serves it.
#[cfg(test)]
#[allow(dead_code)]
mod first_layer {
    include!("first_layer.rs");

    /// A 101st request right after the first hundred gets what the README shows.
    #[tokio::test]
    async fn answers_as_the_readme_says() -> Result<(), Box<dyn std::error::Error>> {
        use tower::ServiceExt;
        let app = app()?;
        let req = || {
            axum::http::Request::get("/")
                .header("x-api-key", "k")
                .body(axum::body::Body::empty())
        };
        for _ in 0..100 {
            assert_eq!(app.clone().oneshot(req()?).await?.status(), 200);
        }
        let denied = app.oneshot(req()?).await?;
        let shown = super::README
            .split("A 101st request sent right after the first hundred gets:\n\n```text\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("the README shows the 101st answer");
        let mut lines = shown.lines();
        assert_eq!(lines.next(), Some("HTTP/1.1 429 Too Many Requests"));
        assert_eq!(denied.status(), 429);
        let mut names = Vec::new();
        for line in lines {
            let (name, value) = line.split_once(": ").expect("a header line");
            assert_eq!(denied.headers()[name], value, "{name}");
            names.push(name);
        }
        // Every header but the body's length is shown, in the order they are sent.
        let sent: Vec<_> = denied
            .headers()
            .keys()
            .map(|n| n.as_str())
            .filter(|n| *n != "content-length")
            .collect();
        assert_eq!(names, sent, "{:?}", denied.headers());
        Ok(())
    }

    /// "A request without the header (or with it empty, or twice) gets `400 Bad Request`".
    #[tokio::test]
    async fn a_request_without_a_usable_key_gets_400_as_the_readme_says()
    -> Result<(), Box<dyn std::error::Error>> {
        use tower::ServiceExt;
        assert!(super::README.contains(
            "A request without the header (or with it empty, or twice) gets `400 Bad Request`"
        ));
        let app = app()?;
        let without = axum::http::Request::get("/").body(axum::body::Body::empty())?;
        let empty = axum::http::Request::get("/")
            .header("x-api-key", "")
            .body(axum::body::Body::empty())?;
        let twice = axum::http::Request::get("/")
            .header("x-api-key", "a")
            .header("x-api-key", "b")
            .body(axum::body::Body::empty())?;
        for req in [without, empty, twice] {
            assert_eq!(app.clone().oneshot(req).await?.status(), 400);
        }
        Ok(())
    }
}

/// The README's per-route block.
#[cfg(test)]
#[allow(dead_code)]
mod per_route {
    include!("per_route.rs");

    use tower::ServiceExt;

    /// A request from `peer` (as `into_make_service_with_connect_info` gives it), or from no
    /// known peer.
    fn request(
        method: &str,
        uri: &str,
        peer: Option<&str>,
    ) -> Result<axum::http::Request<axum::body::Body>, Box<dyn std::error::Error>> {
        let mut req = axum::http::Request::builder()
            .method(method)
            .uri(uri)
            .header("x-api-key", "k")
            .body(axum::body::Body::empty())?;
        if let Some(peer) = peer {
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer.parse::<SocketAddr>()?));
        }
        Ok(req)
    }

    /// The login route allows 5 a minute per client, the API 20 at once per key, and neither
    /// spends the other's; served without the peer's address, the login route answers 400, as
    /// the README says.
    #[tokio::test]
    async fn the_routes_limit_as_the_readme_says() -> Result<(), Box<dyn std::error::Error>> {
        let app = app()?;
        let login = |peer| request("POST", "/login", peer);
        // A method /login does not serve gets axum's 405, and spends none of the client's logins.
        for _ in 0..10 {
            let res = app
                .clone()
                .oneshot(request("GET", "/login", Some("203.0.113.9:4000"))?)
                .await?;
            assert_eq!(res.status(), 405);
        }
        for _ in 0..5 {
            let res = app
                .clone()
                .oneshot(login(Some("203.0.113.9:4000"))?)
                .await?;
            assert_eq!(res.status(), 200);
        }
        let denied = app
            .clone()
            .oneshot(login(Some("203.0.113.9:4000"))?)
            .await?;
        assert_eq!(denied.status(), 429);
        assert_eq!(denied.headers()["retry-after"], "12");
        // Through a trusted balancer, the client it names: the same client is still denied,
        // another has its own count.
        let via = |client: &str| -> Result<_, Box<dyn std::error::Error>> {
            let mut req = login(Some("10.0.0.10:4000"))?;
            req.headers_mut().insert("x-forwarded-for", client.parse()?);
            Ok(req)
        };
        assert_eq!(
            app.clone().oneshot(via("203.0.113.9")?).await?.status(),
            429
        );
        assert_eq!(
            app.clone().oneshot(via("198.51.100.7")?).await?.status(),
            200
        );
        for _ in 0..20 {
            let res = app
                .clone()
                .oneshot(request("GET", "/api/items", None)?)
                .await?;
            assert_eq!(res.status(), 200);
        }
        let res = app
            .clone()
            .oneshot(request("GET", "/api/items", None)?)
            .await?;
        assert_eq!(res.status(), 429);
        assert!(
            super::README
                .contains("every request to `/login` would get the missing-key answer (`400`)")
        );
        assert_eq!(app.oneshot(login(None)?).await?.status(), 400);
        Ok(())
    }
}

/// The README's block of a login that forgets a user's failed attempts at a sign-in.
#[cfg(test)]
#[allow(dead_code)]
mod login_reset {
    include!("login_reset.rs");

    use tower::ServiceExt;

    fn attempt(
        method: &str,
        password: &str,
    ) -> Result<axum::http::Request<axum::body::Body>, Box<dyn std::error::Error>> {
        Ok(axum::http::Request::builder()
            .method(method)
            .uri("/login")
            .header("x-user", "bob")
            .header("x-password", password)
            .body(axum::body::Body::empty())?)
    }

    /// Requests with a method `/login` does not serve spend nothing (a `Router::route_layer`
    /// would count their 405s, and anyone could lock a user out); failed attempts count, a
    /// sign-in forgets them, and its response tells the count as the README says.
    #[tokio::test]
    async fn only_failed_sign_ins_count_as_the_readme_says()
    -> Result<(), Box<dyn std::error::Error>> {
        let app = app()?;
        for _ in 0..10 {
            let res = app.clone().oneshot(attempt("GET", "hunter2")?).await?;
            assert_eq!(res.status(), 405);
        }
        for _ in 0..4 {
            let res = app.clone().oneshot(attempt("POST", "guess")?).await?;
            assert_eq!(res.status(), 401);
        }
        let signed_in = app.clone().oneshot(attempt("POST", "hunter2")?).await?;
        assert_eq!(signed_in.status(), 204);
        assert_eq!(signed_in.headers()["ratelimit"], "\"login\";r=5");
        assert!(super::README.contains("attempt starts from (`\"login\";r=5`, where the layer's"));
        // What the check had left, before the handler's reset: the verdict keeps it.
        let verdict = signed_in
            .extensions()
            .get::<tower_ratelimit::Verdict>()
            .unwrap();
        let check = verdict.decision().unwrap();
        // (None left, and a minute to full again: 12 s to the next unit of a bucket of 5 a minute.)
        assert_eq!(check.remaining(), 0);
        assert_eq!(check.reset_after().as_secs_f64().ceil(), 60.0);
        assert!(super::README.contains("`\"login\";r=0;t=12` for a\nfifth attempt"));
        // The count starts again: five failures, then a 429.
        for _ in 0..5 {
            let res = app.clone().oneshot(attempt("POST", "guess")?).await?;
            assert_eq!(res.status(), 401);
        }
        let denied = app.oneshot(attempt("POST", "hunter2")?).await?;
        assert_eq!(denied.status(), 429);
        Ok(())
    }
}

#[cfg(test)]
#[test]
fn the_readme_shows_the_code_tested_here() {
    for (fence, code) in [
        ("```rust,no_run\n", include_str!("first_layer.rs")),
        ("```rust,no_run\n", include_str!("per_route.rs")),
        ("```rust\n", include_str!("login_reset.rs")),
    ] {
        assert!(
            README.contains(&format!("{fence}{code}```\n")),
            "README.md no longer holds this block word for word:\n{code}"
        );
    }
}
