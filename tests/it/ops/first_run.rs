//! The first-run defaults never weaken authentication: the demo consumer exists only when no
//! consumer is configured and the only provider is the built-in simulator.

use chargeguard::embedded::{DEMO_CONSUMER, read_token_file};
use tonic::Code;

use crate::support::{ORDERS_TOKEN, TestApp, charge_request, error_code};

#[tokio::test]
async fn with_nothing_configured_the_demo_token_from_its_file_charges_the_built_in_simulator() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("demo-token");
    let app = TestApp::spawn_with(|config| {
        config.consumers.clear();
        config.provider.api_key = None;
        config.provider.base_url = None;
        config.embedded.demo_token_file = token_file.clone();
    })
    .await;
    let token = read_token_file(&token_file).expect("serve wrote the demo token");
    let response = app
        .charge_as(token.expose(), charge_request("order-demo:charge"))
        .await
        .unwrap();
    assert_eq!(response.attempt.unwrap().consumer, DEMO_CONSUMER);
    assert!(
        app.sim().ledger().await.unwrap().payment_intents.is_empty(),
        "the test's simulator was not used"
    );
    let refused = app
        .charge(charge_request("order-demo-2:charge"))
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        Code::Unauthenticated,
        "only the demo consumer exists"
    );
}

#[tokio::test]
async fn configured_consumers_get_no_demo_consumer_even_on_the_built_in_simulator() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("demo-token");
    let app = TestApp::spawn_with(|config| {
        config.provider.api_key = None;
        config.provider.base_url = None;
        config.embedded.demo_token_file = token_file.clone();
    })
    .await;
    assert!(
        !token_file.exists(),
        "no demo token when consumers are configured"
    );
    let response = app
        .charge_as(ORDERS_TOKEN, charge_request("order-configured:charge"))
        .await
        .unwrap();
    assert_eq!(response.attempt.unwrap().consumer, "orders");
}

#[tokio::test]
async fn a_provider_key_without_consumers_refuses_every_call_and_creates_no_demo_token() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("demo-token");
    let app = TestApp::spawn_with(|config| {
        config.consumers.clear();
        config.embedded.demo_token_file = token_file.clone();
    })
    .await;
    assert!(
        !token_file.exists(),
        "a real provider key never gets a demo consumer"
    );
    let refused = app
        .charge(charge_request("order-no-consumers:charge"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    assert_eq!(error_code(&refused), "unauthenticated");
    assert!(app.sim().ledger().await.unwrap().payment_intents.is_empty());
}
