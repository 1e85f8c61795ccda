use chargeguard::simulator::{SimulatorConfig, SimulatorLimits};
use serde_json::Value;
use stripe_core::payment_intent::RetrievePaymentIntent;

use super::{API_KEY, Sim, api_error, charge, client};

/// Sends a raw request; returns the status, the error's `param` and `code`.
async fn send(
    sim: &Sim,
    method: &str,
    path_and_query: &str,
    body: &str,
    key: Option<&str>,
) -> (u16, Option<String>, Option<String>) {
    let url = format!(
        "{}{}",
        sim.handle.base_url(),
        path_and_query.trim_start_matches('/')
    );
    let mut request = reqwest::Client::new()
        .request(method.parse().unwrap(), url)
        .bearer_auth(API_KEY)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body.to_owned());
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = request.send().await.unwrap();
    assert!(
        response.headers().contains_key("request-id"),
        "every response has a Request-Id"
    );
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let field = |name: &str| body["error"][name].as_str().map(str::to_owned);
    (status, field("param"), field("code"))
}

/// Method, path, body, idempotency key; expected status, `param` and `code`.
type Case<'a> = (
    &'a str,
    &'a str,
    &'a str,
    Option<&'a str>,
    u16,
    Option<&'a str>,
    Option<&'a str>,
);

#[tokio::test]
async fn bad_input_is_a_400_naming_the_param() {
    let sim = Sim::start().await;
    let create = "/v1/payment_intents";
    let long_key = "k".repeat(256);
    let cases: &[Case] = &[
        (
            "POST",
            create,
            "currency=usd",
            None,
            400,
            Some("amount"),
            Some("parameter_missing"),
        ),
        (
            "POST",
            create,
            "amount=abc&currency=usd",
            None,
            400,
            Some("amount"),
            Some("parameter_invalid_integer"),
        ),
        (
            "POST",
            create,
            "amount=-5&currency=usd",
            None,
            400,
            Some("amount"),
            Some("amount_too_small"),
        ),
        (
            "POST",
            create,
            "amount=100000000&currency=usd",
            None,
            400,
            Some("amount"),
            Some("amount_too_large"),
        ),
        (
            "POST",
            create,
            "amount=5&currency=dollars",
            None,
            400,
            Some("currency"),
            None,
        ),
        (
            "POST",
            create,
            "amount=5&currency=usd&colour=red",
            None,
            400,
            Some("colour"),
            Some("parameter_unknown"),
        ),
        (
            "POST",
            create,
            "amount=5&currency=usd&confirm=yes",
            None,
            400,
            Some("confirm"),
            None,
        ),
        (
            "POST",
            create,
            "amount=5&currency=usd&confirm=true",
            None,
            400,
            Some("payment_method"),
            Some("parameter_missing"),
        ),
        (
            "POST",
            create,
            "amount=5&amount=6&currency=usd",
            None,
            400,
            Some("amount"),
            None,
        ),
        (
            "POST",
            create,
            "amount[x]=5&currency=usd",
            None,
            400,
            Some("amount"),
            None,
        ),
        (
            "POST",
            create,
            "metadata[a=1&amount=5&currency=usd",
            None,
            400,
            None,
            None,
        ),
        (
            "POST",
            create,
            "amount=5&currency=usd",
            Some(&long_key),
            400,
            None,
            None,
        ),
        (
            "GET",
            "/v1/payment_intents?limit=101",
            "",
            None,
            400,
            Some("limit"),
            None,
        ),
        (
            "GET",
            "/v1/payment_intents?limit=0",
            "",
            None,
            400,
            Some("limit"),
            None,
        ),
        (
            "GET",
            "/v1/payment_intents?created[soon]=1",
            "",
            None,
            400,
            Some("created[soon]"),
            Some("parameter_unknown"),
        ),
        (
            "GET",
            "/v1/payment_intents?starting_after=pi_nope",
            "",
            None,
            400,
            Some("starting_after"),
            Some("resource_missing"),
        ),
        (
            "GET",
            "/v1/payment_intents/search?query=customer:'x'",
            "",
            None,
            400,
            Some("query"),
            None,
        ),
        (
            "GET",
            "/v1/payment_intents/pi_nope",
            "",
            None,
            404,
            Some("intent"),
            Some("resource_missing"),
        ),
        (
            "GET",
            "/v1/refunds/re_nope",
            "",
            None,
            404,
            Some("id"),
            Some("resource_missing"),
        ),
        (
            "POST",
            "/v1/refunds",
            "amount=5",
            None,
            400,
            Some("payment_intent"),
            Some("parameter_missing"),
        ),
        (
            "POST",
            "/v1/refunds",
            "payment_intent=pi_nope",
            None,
            400,
            Some("payment_intent"),
            Some("resource_missing"),
        ),
        ("GET", "/v1/charges", "", None, 404, None, None),
        ("DELETE", create, "", None, 404, None, None),
    ];
    for (method, path, body, key, status, param, code) in cases {
        let expected = (*status, param.map(str::to_owned), code.map(str::to_owned));
        assert_eq!(
            send(&sim, method, path, body, *key).await,
            expected,
            "{method} {path} {body}"
        );
    }
    assert!(
        sim.control
            .ledger()
            .await
            .unwrap()
            .payment_intents
            .is_empty()
    );
}

#[tokio::test]
async fn authentication_body_size_and_object_limits() {
    let limits = SimulatorLimits {
        objects_max: 1,
        body_bytes_max: 1_024,
        ..SimulatorLimits::default()
    };
    let sim = Sim::start_with(SimulatorConfig {
        limits,
        ..SimulatorConfig::default()
    })
    .await;
    let stranger = client(&sim.handle.base_url(), "sk_test_unknown");
    let (_, status) = api_error(
        RetrievePaymentIntent::new("pi_x")
            .send(&stranger)
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 401);
    let anonymous = reqwest::Client::new()
        .get(format!("{}v1/payment_intents", sim.handle.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);

    let huge = format!("amount=5&currency=usd&description={}", "x".repeat(2_000));
    assert_eq!(
        send(&sim, "POST", "/v1/payment_intents", &huge, None)
            .await
            .0,
        413
    );

    charge(100, "pm_card_visa", "one")
        .send(&sim.stripe)
        .await
        .unwrap();
    let (_, status) = api_error(
        charge(100, "pm_card_visa", "two")
            .send(&sim.stripe)
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 429);
    assert_eq!(sim.control.ledger().await.unwrap().payment_intents.len(), 1);
}
