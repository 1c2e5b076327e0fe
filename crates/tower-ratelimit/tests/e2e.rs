//! End to end: a real server on 127.0.0.1 and a real HTTP client.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use ratelimit_core::{Algorithm, Limit, MemoryStore, Quota};
use tower_ratelimit::{Headers, Policy, RateLimitLayer};

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

#[tokio::test]
async fn a_real_server_sends_the_fields_to_a_real_client() {
    // 3 an hour: a token comes back every 1,200 s, far longer than the test takes, so the
    // numbers below do not depend on how fast this machine is.
    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(3).unwrap()).unwrap();
    let policy = Policy::new("e2e", limit)
        .unwrap()
        .headers(Headers::ietf().legacy(true));
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::new(MemoryStore::new(), policy).unwrap());
    let addr = serve(app).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()
        .unwrap();
    let url = format!("http://{addr}/");

    for remaining in (0..3).rev() {
        let res = client.get(&url).send().await.unwrap();
        assert_eq!(res.status(), 200);
        let h = res.headers();
        assert_eq!(h["ratelimit-policy"], "\"e2e\";q=3;w=3600");
        let rl = h["ratelimit"].to_str().unwrap().to_owned();
        assert!(rl.starts_with(&format!("\"e2e\";r={remaining};t=")), "{rl}");
        assert_eq!(h["x-ratelimit-remaining"], remaining.to_string().as_str());
        assert_eq!(res.text().await.unwrap(), "hello");
    }
    let res = client.get(&url).send().await.unwrap();
    assert_eq!(res.status(), 429);
    let h = res.headers();
    // The wait is just under 1,200 s; rounded up it is 1,200.
    assert_eq!(h["retry-after"], "1200");
    assert_eq!(h["ratelimit"], "\"e2e\";r=0;t=1200");
    assert_eq!(h["ratelimit-policy"], "\"e2e\";q=3;w=3600");
    assert_eq!(h["x-ratelimit-limit"], "3");
    assert_eq!(h["content-type"], "text/plain; charset=utf-8");
    assert_eq!(res.text().await.unwrap(), "Too Many Requests\n");
}

/// A `HEAD` request that is denied gets the 429's head with no body: its `Content-Length` is
/// the body a `GET` would get, and a request sent after it on the same connection is read
/// from the right place. Both requests go in one write, so a body sent after the `HEAD`'s head
/// would show up where the second response should start.
#[tokio::test]
async fn a_denied_head_request_gets_the_head_of_the_429_and_no_body() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let limit = Limit::single(Algorithm::TokenBucket, Quota::per_hour(1).unwrap()).unwrap();
    let policy = Policy::new("head", limit).unwrap();
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::new(MemoryStore::new(), policy).unwrap());
    let addr = serve(app).await;
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(
        b"GET / HTTP/1.1\r\nhost: x\r\n\r\n\
          HEAD / HTTP/1.1\r\nhost: x\r\n\r\n\
          GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut raw))
        .await
        .expect("the server closes the connection after the last response")
        .unwrap();
    let text = String::from_utf8(raw).unwrap();

    let (allowed, rest) = text.split_once("\r\n\r\nhello").expect(&text);
    assert!(allowed.starts_with("HTTP/1.1 200 "), "{text}");
    // The HEAD's answer: a 429 head, then at once the next response.
    let (head, rest) = rest.split_once("\r\n\r\n").expect(&text);
    assert!(head.starts_with("HTTP/1.1 429 "), "{text}");
    assert!(
        rest.starts_with("HTTP/1.1 429 "),
        "a body after the HEAD's head: {text}"
    );
    let body = "Too Many Requests\n";
    let length = format!("content-length: {}", body.len());
    assert!(head.contains(&length), "{head}");
    assert!(head.contains("retry-after: 3600"), "{head}");
    assert!(head.contains("ratelimit: \"head\";r=0;t=3600"), "{head}");
    let (get, get_body) = rest.split_once("\r\n\r\n").expect(&text);
    assert!(get.contains(&length), "{get}");
    assert_eq!(get_body, body);
}
