//! The code under fuzzing, compiled straight from its source file.
//!
//! `client_ip.rs` depends only on `http`, `ipnet` and `thiserror`, so it is
//! included by path instead of depending on the whole `tower-ratelimit`
//! crate: the fuzz build stays small, and it does not pull axum and tokio
//! through the sanitizer build.

#[path = "../../crates/tower-ratelimit/src/client_ip.rs"]
pub mod client_ip;
