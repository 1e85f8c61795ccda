//! TLS and mutual TLS on the real server, with certificates made here: a charge over TLS, a
//! plaintext client refused, a client without a certificate refused, one consumer's certificate
//! never acting as another, and a rotated certificate used without a restart while a call that
//! began before the rotation finishes.

use std::time::Duration;

use chargeguard::config::Config;
use chargeguard::grpc::certificate_sha256;
use chargeguard::grpc::proto::{GetAttemptRequest, get_attempt_request};
use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec};
use tonic::{Code, Request};

use super::{Ca, OrdersOverMutualTls, ServerFiles, tls_client};
use crate::support::{ORDERS_TOKEN, TestApp, authed, charge_request, error_code};

/// Bound on waiting for a rewritten certificate to be picked up (the test polls every 100 ms).
const RELOAD_WAIT_MAX: Duration = Duration::from_secs(15);

#[tokio::test]
async fn a_charge_over_tls_works_and_a_plaintext_client_to_the_tls_port_fails() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("chargeguard test CA");
    let files = ServerFiles::write(dir.path(), &ca.server(), None);
    let app = TestApp::spawn_with(|config| files.configure(config, false)).await;

    let mut client = tls_client(app.grpc_addr, &ca, None).await.expect("TLS connects");
    let charged = client.charge(authed(ORDERS_TOKEN, charge_request("tls-1"))).await.expect("a charge over TLS");
    assert_eq!(charged.into_inner().attempt.unwrap().consumer, "orders");

    let plaintext = app.charge(charge_request("tls-plaintext")).await;
    assert!(plaintext.is_err(), "a plaintext client is not served: {plaintext:?}");
    let stranger = tls_client(app.grpc_addr, &Ca::new("another CA"), None).await;
    match stranger {
        Err(_) => {}
        Ok(mut client) => {
            let call = client.charge(authed(ORDERS_TOKEN, charge_request("tls-stranger"))).await;
            assert!(call.is_err(), "a server certificate of an unknown CA is refused by the client: {call:?}");
        }
    }

    // The HTTP port speaks TLS with the same certificate (webhooks, health, metrics).
    let https = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem.as_bytes()).unwrap())
        .resolve(super::SERVER_NAME, app.http_addr)
        .build()
        .unwrap();
    let health = https.get(format!("https://{}:{}/healthz", super::SERVER_NAME, app.http_addr.port())).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let plain_http = reqwest::get(format!("http://{}/healthz", app.http_addr)).await;
    assert!(plain_http.is_err() || !plain_http.unwrap().status().is_success(), "plaintext HTTP to the TLS port is not served");
    assert_eq!(app.creates().await.len(), 1, "only the TLS charge reached the provider");
}

/// orders: token and certificate; billing: certificate only.
fn mutual(config: &mut Config, files: &ServerFiles, orders_der: &[u8], billing_der: &[u8]) {
    files.configure(config, true);
    for consumer in &mut config.consumers {
        let der = if consumer.name == "orders" { orders_der } else { billing_der };
        consumer.client_cert_sha256 = certificate_sha256(der).into();
        if consumer.name == "billing" {
            consumer.token_sha256 = Vec::new().into();
        }
    }
}

#[tokio::test]
async fn mutual_tls_refuses_a_client_without_a_certificate_and_a_certificate_of_one_consumer_cannot_act_as_another() {
    let dir = tempfile::tempdir().unwrap();
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let (orders_cert, billing_cert) = (client_ca.client("orders"), client_ca.client("billing"));
    let files = ServerFiles::write(dir.path(), &server_ca.server(), Some(&client_ca));
    let app = TestApp::spawn_with(|config| mutual(config, &files, &orders_cert.der, &billing_cert.der)).await;

    // No client certificate: the handshake is refused (TLS 1.3 reports it on the first call).
    match tls_client(app.grpc_addr, &server_ca, None).await {
        Err(_) => {}
        Ok(mut client) => {
            let call = client.charge(authed(ORDERS_TOKEN, charge_request("mtls-none"))).await;
            let status = call.expect_err("a client without a certificate is refused");
            assert_ne!(status.code(), Code::Ok);
        }
    }
    // A certificate of a CA the server does not trust.
    let outsider = Ca::new("outsider CA").client("orders");
    if let Ok(mut client) = tls_client(app.grpc_addr, &server_ca, Some(&outsider)).await {
        let call = client.charge(authed(ORDERS_TOKEN, charge_request("mtls-outsider"))).await;
        assert!(call.is_err(), "a certificate of another CA is refused: {call:?}");
    }

    // orders: token and certificate together.
    let mut as_orders = tls_client(app.grpc_addr, &server_ca, Some(&orders_cert)).await.unwrap();
    let charged = as_orders.charge(authed(ORDERS_TOKEN, charge_request("mtls-1"))).await.expect("token and certificate");
    assert_eq!(charged.into_inner().attempt.unwrap().consumer, "orders");
    let without_token = as_orders.charge(Request::new(charge_request("mtls-2"))).await.expect_err("orders needs its token too");
    assert_eq!(without_token.code(), Code::Unauthenticated, "{without_token:?}");

    // billing's certificate with orders' token: the two name different consumers.
    let mut as_billing = tls_client(app.grpc_addr, &server_ca, Some(&billing_cert)).await.unwrap();
    let conflict = as_billing.charge(authed(ORDERS_TOKEN, charge_request("mtls-3"))).await.expect_err("conflict");
    assert_eq!(conflict.code(), Code::Unauthenticated, "{conflict:?}");
    assert_eq!(error_code(&conflict), "unauthenticated");
    // billing by certificate alone is billing, and sees nothing of orders'.
    let charged = as_billing.charge(Request::new(charge_request("mtls-4"))).await.expect("billing by certificate");
    assert_eq!(charged.into_inner().attempt.unwrap().consumer, "billing");
    let selector = Some(get_attempt_request::Selector::OperationKey("mtls-1".to_owned()));
    let foreign = as_billing.get_attempt(Request::new(GetAttemptRequest { selector })).await.expect_err("orders' attempt");
    assert_eq!(foreign.code(), Code::NotFound, "{foreign:?}");
    // orders' certificate without a token cannot be billing either.
    let orders_alone = as_orders.charge(Request::new(charge_request("mtls-5"))).await.expect_err("orders' cert alone");
    assert_eq!(orders_alone.code(), Code::Unauthenticated);
    assert_eq!(app.creates().await.len(), 2, "only orders' and billing's own charges reached the provider");
}

#[tokio::test]
async fn with_a_metrics_listener_of_its_own_metrics_are_plaintext_there_and_gone_from_the_tls_port() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("chargeguard test CA");
    let files = ServerFiles::write(dir.path(), &ca.server(), None);
    let app = TestApp::spawn_with(|config| {
        files.configure(config, false);
        config.server.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let metrics_addr = app.metrics_addr.expect("a metrics listener");
    let mut client = tls_client(app.grpc_addr, &ca, None).await.expect("TLS connects");
    client.charge(authed(ORDERS_TOKEN, charge_request("metrics-1"))).await.expect("a charge over TLS");

    // Prometheus scrapes plaintext on the metrics listener, and sees the charge.
    let scraped = reqwest::get(format!("http://{metrics_addr}/metrics")).await.unwrap();
    assert_eq!(scraped.status(), 200);
    let text = scraped.text().await.unwrap();
    assert!(text.lines().any(|line| line.starts_with("chargeguard_charges_total{")), "{text}");
    assert_eq!(reqwest::get(format!("http://{metrics_addr}/healthz")).await.unwrap().status(), 200);
    // The TLS port, which an ingress may expose, no longer serves them; health stays.
    let https = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem.as_bytes()).unwrap())
        .resolve(super::SERVER_NAME, app.http_addr)
        .build()
        .unwrap();
    let base = format!("https://{}:{}", super::SERVER_NAME, app.http_addr.port());
    assert_eq!(https.get(format!("{base}/metrics")).send().await.unwrap().status(), 404);
    assert_eq!(https.get(format!("{base}/healthz")).send().await.unwrap().status(), 200);
}

#[tokio::test]
async fn a_consumer_named_in_its_certificate_keeps_working_across_a_renewal_and_other_names_are_refused() {
    const BILLING_ID: &str = "spiffe://chargeguard.test/billing";
    let dir = tempfile::tempdir().unwrap();
    let (server_ca, client_ca) = (Ca::new("server CA"), Ca::new("mesh CA"));
    let files = ServerFiles::write(dir.path(), &server_ca.server(), Some(&client_ca));
    let app = TestApp::spawn_with(|config| {
        files.configure(config, true);
        for consumer in config.consumers.iter_mut().filter(|consumer| consumer.name == "billing") {
            consumer.token_sha256 = Vec::new().into();
            consumer.client_cert_names = vec![BILLING_ID.to_owned()];
        }
    })
    .await;

    // Two certificates of billing's, as a mesh renews them: new key, same name.
    for (round, certificate) in [client_ca.client_with_uri("billing-pod-1", BILLING_ID), client_ca.client_with_uri("billing-pod-2", BILLING_ID)]
        .iter()
        .enumerate()
    {
        let mut as_billing = tls_client(app.grpc_addr, &server_ca, Some(certificate)).await.unwrap();
        let charged = as_billing.charge(Request::new(charge_request(&format!("named-{round}")))).await.expect("billing by its certificate's name");
        assert_eq!(charged.into_inner().attempt.unwrap().consumer, "billing");
    }
    // A certificate of the same CA under another name, or with the consumer's name only as its
    // common name (the configured name is the URI), identifies nobody.
    for (common_name, uri) in [("billing", "spiffe://chargeguard.test/other"), ("spiffe://chargeguard.test/billing-2", "spiffe://chargeguard.test/billing-2")] {
        let mut stranger = tls_client(app.grpc_addr, &server_ca, Some(&client_ca.client_with_uri(common_name, uri))).await.unwrap();
        let refused = stranger.charge(Request::new(charge_request("named-stranger"))).await.expect_err("another name");
        assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
        assert!(refused.message().contains("unknown client certificate"), "{refused:?}");
    }
    // orders' token with billing's certificate: two consumers, refused.
    let mut mixed = tls_client(app.grpc_addr, &server_ca, Some(&client_ca.client_with_uri("billing-pod-3", BILLING_ID))).await.unwrap();
    let conflict = mixed.charge(authed(ORDERS_TOKEN, charge_request("named-conflict"))).await.expect_err("conflict");
    assert_eq!(conflict.code(), Code::Unauthenticated, "{conflict:?}");
    assert_eq!(app.creates().await.len(), 2, "only billing's two charges reached the provider");
}

#[tokio::test]
async fn a_rotated_certificate_is_picked_up_without_a_restart_while_a_call_is_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let (old_ca, new_ca) = (Ca::new("old CA"), Ca::new("new CA"));
    let files = ServerFiles::write(dir.path(), &old_ca.server(), None);
    let app = TestApp::spawn_with(|config| {
        files.configure(config, false);
        // Room for a slow provider answer: the call stays in flight while the files change.
        config.provider.call_timeout_ms = 5_000;
        config.charge.lease_ms = 16_000;
        config.charge.recovery_grace_ms = 16_000;
    })
    .await;

    app.sim().set_fault(Endpoint::CreatePaymentIntent, FaultSpec::next(FaultKind::Latency(3_000), 1)).await.unwrap();
    let mut old_client = tls_client(app.grpc_addr, &old_ca, None).await.unwrap();
    let in_flight = tokio::spawn(async move { old_client.charge(authed(ORDERS_TOKEN, charge_request("rotate-1"))).await });
    // The call reaches the provider (and waits there) before the files change; the simulator
    // logs a request only once answered, so the test waits a while instead of polling it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!in_flight.is_finished(), "the first call is in flight when the files change");
    files.replace(&new_ca.server());

    let started = std::time::Instant::now();
    let mut new_client = loop {
        if let Ok(mut client) = tls_client(app.grpc_addr, &new_ca, None).await
            && client.charge(authed(ORDERS_TOKEN, charge_request("rotate-2"))).await.is_ok()
        {
            break client;
        }
        assert!(started.elapsed() < RELOAD_WAIT_MAX, "the new certificate was never served");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!("new certificate served {:?} after the files changed", started.elapsed());
    assert!(!in_flight.is_finished(), "the rotation was seen while the first call was still in flight");
    let first = in_flight.await.unwrap().expect("the call in flight on the old connection finishes");
    assert_eq!(first.into_inner().attempt.unwrap().consumer, "orders");
    new_client.charge(authed(ORDERS_TOKEN, charge_request("rotate-3"))).await.expect("new connections use the new certificate");
    let old_again = tls_client(app.grpc_addr, &old_ca, None).await;
    if let Ok(mut client) = old_again {
        assert!(client.charge(authed(ORDERS_TOKEN, charge_request("rotate-4"))).await.is_err(), "the old certificate is no longer served");
    }
}

#[tokio::test]
async fn the_cli_charges_over_mutual_tls_with_its_ca_cert_and_key_files() {
    let mtls = OrdersOverMutualTls::spawn().await;
    let (app, dir, server_ca, orders_cert) = (&mtls.app, &mtls.dir, &mtls.server_ca, &mtls.orders);
    let (ca_file, cert_file, key_file) = (dir.path().join("ca.pem"), dir.path().join("orders.pem"), dir.path().join("orders-key.pem"));
    std::fs::write(&ca_file, &server_ca.pem).unwrap();
    std::fs::write(&cert_file, &orders_cert.cert_pem).unwrap();
    std::fs::write(&key_file, &orders_cert.key_pem).unwrap();
    let server = format!("https://{}", app.grpc_addr);
    let charge = |with_certificate: bool| {
        let mut command = crate::ops::process::command(dir.path());
        command
            .args(["charge", "--operation", "cli-tls-1", "--amount", "1000", "--currency", "usd", "--payment-method", "pm_card_visa", "--json"])
            .args(["--server", &server, "--ca-file", ca_file.to_str().unwrap()])
            .env("CHARGEGUARD_TOKEN", ORDERS_TOKEN);
        if with_certificate {
            command.args(["--cert-file", cert_file.to_str().unwrap(), "--key-file", key_file.to_str().unwrap()]);
        }
        command.output()
    };
    let output = charge(true).await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "exit {}; stderr:\n{stderr}", output.status);
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(answer["attempt"]["consumer"], "orders", "{answer}");
    assert!(!stderr.contains(&orders_cert.key_pem[40..80]), "the key is never printed");

    let without = charge(false).await.unwrap();
    assert!(!without.status.success(), "without its certificate the CLI is refused");
    assert_eq!(app.creates().await.len(), 1);
}
