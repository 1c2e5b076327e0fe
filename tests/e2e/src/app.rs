//! Serving a router on a loopback port.

use std::net::SocketAddr;

use axum::Router;

/// A router served by `axum::serve` on `127.0.0.1:<free port>`, with the peer address given to
/// handlers and key extractors as `ConnectInfo<SocketAddr>`. Dropping it stops the server.
#[derive(Debug)]
pub struct TestApp {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl TestApp {
    /// Binds a free loopback port and serves `router` on it in a background task.
    pub async fn serve(router: Router) -> TestApp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("local address");
        let task = tokio::spawn(async move {
            axum::serve(
                listener,
                router.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
            .expect("serve");
        });
        TestApp { addr, task }
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.task.abort();
    }
}
