//! Token rotation: a consumer with several tokens accepts each; a token taken out of the
//! configuration stops working at the next start; failures are counted per consumer.

use chargeguard::config::Config;
use chargeguard::grpc::hash_token;
use tonic::Code;

use super::metric;
use crate::support::{TestApp, charge_request, error_code};

const OLD_TOKEN: &str = "orders-token-old-0123456789";
const NEW_TOKEN: &str = "orders-token-new-0123456789";

fn orders_tokens(config: &mut Config, tokens: &[&str]) {
    let orders = config.consumers.iter_mut().find(|consumer| consumer.name == "orders").unwrap();
    orders.token_sha256 = tokens.iter().map(|token| hash_token(token)).collect::<Vec<_>>().into();
}

#[tokio::test]
async fn two_tokens_of_one_consumer_both_work_and_a_removed_one_stops() {
    let app = TestApp::spawn_with(|config| orders_tokens(config, &[OLD_TOKEN, NEW_TOKEN])).await;
    let by_old = app.charge_as(OLD_TOKEN, charge_request("rotation-1")).await.expect("the old token works");
    let by_new = app.charge_as(NEW_TOKEN, charge_request("rotation-2")).await.expect("the new token works");
    // One consumer: each token sees what the other charged.
    assert_eq!(by_old.attempt.as_ref().unwrap().consumer, "orders");
    assert_eq!(by_new.attempt.as_ref().unwrap().consumer, "orders");
    let again = app.charge_as(NEW_TOKEN, charge_request("rotation-1")).await.unwrap();
    assert_eq!(again.attempt.unwrap().attempt_id, by_old.attempt.unwrap().attempt_id, "the same operation of the same consumer");

    let unknown_before = metric(app.http_addr, "chargeguard_authentication_failures_total", &["consumer=\"unknown\"", "reason=\"unknown_token\""]).await;
    let app = app.restart_with(|config| orders_tokens(config, &[NEW_TOKEN])).await;
    let refused = app.charge_as(OLD_TOKEN, charge_request("rotation-3")).await.expect_err("the removed token is refused");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert_eq!(error_code(&refused), "unauthenticated");
    assert!(!refused.message().contains(OLD_TOKEN), "{refused:?}");
    app.charge_as(NEW_TOKEN, charge_request("rotation-3")).await.expect("the kept token works");
    let unknown_after = metric(app.http_addr, "chargeguard_authentication_failures_total", &["consumer=\"unknown\"", "reason=\"unknown_token\""]).await;
    assert!(unknown_after >= unknown_before + 1.0, "the refusal is counted: {unknown_before} then {unknown_after}");
    assert_eq!(app.creates().await.len(), 3, "nothing was sent for the refused call");
}
