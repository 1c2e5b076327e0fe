//! The distributed race: 20 gateways, each with its own `RedisStore` (its own pool), hammer one
//! key at once; exactly the capacity is admitted. 20 independent `MemoryStore`s admit 20 times as
//! much, which is why the state must be shared.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::unique_prefix;
use futures::future::join_all;
use ratelimit_core::{Algorithm, Limit, MemoryStore, Quota, Store};
use ratelimit_redis::RedisStore;
use redis_harness::RedisServer;

const GATEWAYS: usize = 20;
const PER_GATEWAY: usize = 150;
const CAPACITY: u64 = 100;

/// Every gateway sends `PER_GATEWAY` checks at once; returns how many were admitted in all.
async fn hammer<S: Store + Clone>(gateways: &[S], key: &[u8], limit: &Limit) -> usize {
    let tasks = gateways.iter().map(|store| {
        let store = store.clone();
        let key = key.to_vec();
        let limit = limit.clone();
        tokio::spawn(async move {
            let checks = (0..PER_GATEWAY).map(|_| store.check(&key, &limit, 1));
            join_all(checks)
                .await
                .into_iter()
                .map(|r| r.expect("check failed"))
                .filter(|d| d.is_allowed())
                .count()
        })
    });
    join_all(tasks).await.into_iter().map(|r| r.unwrap()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_gateways_share_one_limit() {
    let server = RedisServer::start();
    let prefix = unique_prefix("race");
    let mut gateways = Vec::new();
    for _ in 0..GATEWAYS {
        // Server time (the default): what real gateways use.
        // A patient response timeout: the test counts admissions, and a loaded machine must not
        // turn the last of 2,000 concurrent answers into a failure.
        let store = RedisStore::builder(server.url())
            .prefix(prefix.clone())
            .pool_size(2)
            .response_timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap();
        gateways.push(store);
    }
    let memories: Vec<Arc<MemoryStore>> = (0..GATEWAYS)
        .map(|_| Arc::new(MemoryStore::new()))
        .collect();

    for alg in Algorithm::ALL {
        // 100 a day: nothing refills during the test.
        let limit = Limit::single(alg, Quota::per_day(CAPACITY).unwrap()).unwrap();
        let key = format!("hot-{alg}");
        let shared = hammer(&gateways, key.as_bytes(), &limit).await;
        assert_eq!(shared as u64, CAPACITY, "{alg}: shared Redis state");
        let local = hammer(&memories, key.as_bytes(), &limit).await;
        assert_eq!(
            local as u64,
            CAPACITY * GATEWAYS as u64,
            "{alg}: one MemoryStore per gateway admits 20x"
        );
        println!(
            "{alg}: {} requests from {GATEWAYS} gateways: Redis admitted {shared}, \
             separate MemoryStores admitted {local}",
            GATEWAYS * PER_GATEWAY
        );
    }
}
