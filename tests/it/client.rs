//! chargeguard-client (`client/`, issue 19) against the real server: the answers a consumer
//! acts on — Done, RetryLater, Reject — for real calls, and calls spread over two servers.

use std::time::Duration;

use chargeguard::grpc::proto::{AttemptStatus, ChargeOutcome};
use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec};
use chargeguard_client::{Answer, Backoff, ChargeRequest, ChargeResponse, Client, ClientConfig, RetryClass, TlsIdentity, TlsOptions};

use crate::security::{OrdersOverMutualTls, SERVER_NAME};
use crate::support::{ORDERS_TOKEN, TestApp, charge_request};

/// A client of the `orders` consumer with short waits, so retries take milliseconds.
fn client_of(endpoints: Vec<String>) -> Client {
    Client::connect_lazy(ClientConfig {
        endpoints,
        token: Some(ORDERS_TOKEN.to_owned()),
        call_timeout: Duration::from_secs(10),
        backoff: Backoff { initial: Duration::from_millis(10), max: Duration::from_millis(50), multiplier: 2.0, max_retries: 8 },
        ..ClientConfig::default()
    })
    .expect("a valid configuration")
}

fn endpoint(app: &TestApp) -> String {
    format!("http://{}", app.grpc_addr)
}

/// The client crate's own generated message, field for field the server's test request.
fn request(operation_key: &str) -> ChargeRequest {
    let server = charge_request(operation_key);
    ChargeRequest {
        operation_key: server.operation_key,
        amount_minor: server.amount_minor,
        currency: server.currency,
        payment_method: server.payment_method,
        customer: server.customer,
        description: server.description,
        metadata: server.metadata,
        attempt: server.attempt,
    }
}

fn done(answer: Answer<ChargeResponse>) -> (ChargeOutcome, AttemptStatus) {
    let Answer::Done(response) = answer else { panic!("not done: {answer:?}") };
    let status = AttemptStatus::try_from(response.attempt.expect("an attempt").status).expect("a known status");
    (ChargeOutcome::try_from(response.outcome).expect("a known outcome"), status)
}

#[tokio::test]
async fn a_charge_is_done_then_done_as_a_duplicate_and_bad_requests_are_rejected() {
    let app = TestApp::spawn().await;
    let client = client_of(vec![endpoint(&app)]);

    assert_eq!(done(client.charge(request("order-1:charge")).await), (ChargeOutcome::Applied, AttemptStatus::Succeeded));
    assert_eq!(done(client.charge(request("order-1:charge")).await), (ChargeOutcome::Duplicate, AttemptStatus::Succeeded));

    let mut invalid = request("order-2:charge");
    invalid.amount_minor = 0;
    let Answer::Reject(rejection) = client.charge(invalid).await else { panic!("an invalid amount is rejected") };
    assert_eq!((rejection.grpc_code, rejection.code.as_str()), (tonic::Code::InvalidArgument, "invalid_argument"));
    assert!(rejection.message.contains("amount_minor"), "{}", rejection.message);

    let mut changed = request("order-1:charge");
    changed.amount_minor = 2_000;
    let Answer::Reject(rejection) = client.charge_until_decided(changed).await else { panic!("a mismatch is rejected") };
    assert_eq!((rejection.grpc_code, rejection.code.as_str()), (tonic::Code::FailedPrecondition, "operation_mismatch"));
    assert_eq!(rejection.attempt_id, Some(app.attempt_of("order-1:charge").await.attempt_id));
    assert_eq!(app.creates().await.len(), 1, "one provider call in all; a rejection is never retried");
}

#[tokio::test]
async fn a_provider_outage_is_retry_later_and_until_decided_completes_the_charge_once() {
    let app = TestApp::spawn().await;
    let client = client_of(vec![endpoint(&app)]);
    app.sim().set_fault(Endpoint::CreatePaymentIntent, FaultSpec::next(FaultKind::FailBeforeApply, 3)).await.unwrap();

    let Answer::RetryLater(later) = client.charge(request("order-3:charge")).await else { panic!("an outage is retried") };
    assert_eq!((later.class, later.code.as_str()), (RetryClass::OutcomeUnknown, "outcome_unknown"));

    // Two more failures at the provider, then it answers: the loop retries through them.
    let (outcome, status) = done(client.charge_until_decided(request("order-3:charge")).await);
    assert_eq!((outcome, status), (ChargeOutcome::Reconciled, AttemptStatus::Succeeded));
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 1, "charged once");
}

#[tokio::test]
async fn a_server_that_is_not_there_is_retry_later_transport() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let client = client_of(vec![format!("http://{address}")]);
    let Answer::RetryLater(later) = client.charge(request("order-4:charge")).await else { panic!("a refused connection is retried") };
    assert_eq!(later.class, RetryClass::Transport, "{later}");
}

#[tokio::test]
async fn calls_spread_over_two_servers() {
    // Two servers with their own databases, so each call's attempt shows which one served it.
    let (first, second) = tokio::join!(TestApp::spawn(), TestApp::spawn());
    let client = client_of(vec![endpoint(&first), endpoint(&second)]);
    let calls = 24;
    for call in 0..calls {
        let (_, status) = done(client.charge(request(&format!("order-{call}:charge"))).await);
        assert_eq!(status, AttemptStatus::Succeeded);
    }
    let (first_rows, second_rows) = (first.attempt_rows().await, second.attempt_rows().await);
    assert_eq!(first_rows + second_rows, calls);
    assert!(first_rows > 0 && second_rows > 0, "one server took every call: {first_rows} and {second_rows}");
}

#[tokio::test]
async fn over_mutual_tls_with_the_token_a_charge_is_done_and_a_wrong_token_is_rejected() {
    let mtls = OrdersOverMutualTls::spawn().await;
    let (app, server_ca, orders) = (&mtls.app, &mtls.server_ca, &mtls.orders);
    let config = |token: &str| ClientConfig {
        endpoints: vec![format!("https://{}", app.grpc_addr)],
        token: Some(token.to_owned()),
        tls: Some(TlsOptions {
            ca_pem: Some(server_ca.pem.clone()),
            identity: Some(TlsIdentity { cert_pem: orders.cert_pem.clone(), key_pem: orders.key_pem.clone() }),
            domain_name: Some(SERVER_NAME.to_owned()),
        }),
        ..ClientConfig::default()
    };

    let client = Client::connect_lazy(config(ORDERS_TOKEN)).expect("a valid configuration");
    assert_eq!(done(client.charge(request("mtls-1")).await), (ChargeOutcome::Applied, AttemptStatus::Succeeded));

    let stranger = Client::connect_lazy(config("not-a-token-of-anyone")).expect("a valid configuration");
    let Answer::Reject(rejection) = stranger.charge_until_decided(request("mtls-2")).await else { panic!("a wrong token is rejected") };
    assert_eq!((rejection.grpc_code, rejection.code.as_str()), (tonic::Code::Unauthenticated, "unauthenticated"));
    assert_eq!(app.creates().await.len(), 1);
}
