//! The example consumer's NATS JetStream variant: every order charged once or declined, an
//! event published twice charged once, and the consumer killed mid-run (its unacked messages
//! come back after AckWait... or at once, to the restarted durable consumer).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection};

use super::rig::{ConsumerProcess, order_consumer_binary};
use crate::support::{ORDERS_TOKEN, TestApp};

const ORDERS: u32 = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jetstream_consumer_charges_each_order_once_and_records_declines() {
    let app = TestApp::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    let subject = format!("cg_it_{}.orders", std::process::id());
    let token_file = dir.path().join("orders.token");
    std::fs::write(&token_file, ORDERS_TOKEN).unwrap();
    let manifest_path = dir.path().join("manifest.jsonl");
    let published = tokio::process::Command::new(order_consumer_binary())
        .args(["publish", "--broker=nats", &format!("--queue={subject}"), &format!("--count={ORDERS}")])
        .args(["--prefix=nats", "--decline-percent=10", "--duplicate-percent=20", "--seed=5"])
        .arg(format!("--manifest={}", manifest_path.display()))
        .output()
        .await
        .unwrap();
    assert!(published.status.success(), "{}", String::from_utf8_lossy(&published.stderr));
    let mut consumer = ConsumerProcess::new(
        dir.path(),
        "nats-consumer",
        vec![
            "--broker=nats".to_owned(),
            format!("--queue={subject}"),
            format!("--database-url={}", app.database.url),
            format!("--chargeguard=http://{}", app.grpc_addr),
            format!("--token-file={}", token_file.display()),
            "--prefetch=8".to_owned(),
        ],
    );
    consumer.start();
    let mut database = PgConnection::connect(&app.database.url).await.unwrap();
    let started = Instant::now();
    loop {
        consumer.assert_running();
        let decided: Option<i64> = sqlx::query_scalar("SELECT count(*) FROM order_payments").fetch_one(&mut database).await.ok();
        if decided == Some(i64::from(ORDERS)) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(90), "{decided:?} of {ORDERS} orders decided in 90 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    consumer.kill_9();

    let ledger = app.sim().ledger().await.unwrap();
    let mut charged: HashMap<String, usize> = HashMap::new();
    for intent in ledger.payment_intents.iter().filter(|intent| intent.status == "succeeded") {
        *charged.entry(intent.metadata.get("order_id").cloned().unwrap_or_default()).or_default() += 1;
    }
    let rows: Vec<(String, String)> = sqlx::query_as("SELECT order_id, status FROM order_payments").fetch_all(&mut database).await.unwrap();
    let recorded: HashMap<String, String> = rows.into_iter().collect();
    let mut published_twice = 0;
    for line in std::fs::read_to_string(&manifest_path).unwrap().lines() {
        let planned: serde_json::Value = serde_json::from_str(line).unwrap();
        let order_id = planned["order_id"].as_str().unwrap();
        published_twice += u32::from(planned["published"] == 2);
        let expected = if planned["declining"].as_bool().unwrap() { ("declined", 0) } else { ("paid", 1) };
        assert_eq!((recorded[order_id].as_str(), charged.get(order_id).copied().unwrap_or(0)), expected, "order {order_id}");
    }
    assert!(published_twice > 0, "the seed publishes some events twice");
    let client = async_nats::connect("nats://127.0.0.1:4222").await.unwrap();
    let jetstream = async_nats::jetstream::new(client);
    let _ = jetstream.delete_stream(subject.replace('.', "_").to_uppercase()).await;
}
