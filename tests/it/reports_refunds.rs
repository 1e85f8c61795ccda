//! The report's refund categories and "ours refunded" (issue 15) against the simulator and a
//! real database: refunds made through the real Refund RPC, disagreements made by the
//! simulator's controls while chargeguard hears no webhook (both stores), disputes and refund
//! events recorded by the real webhook path (`Hooked`, from `webhooks.rs`: PostgreSQL only on
//! this branch, whose webhook inbox has no SQLite implementation yet).

use std::collections::BTreeMap;

use chargeguard::grpc::proto;
use chargeguard::simulator::{Ledger, OpenDispute, RefundMode};
use serde_json::Value;

use crate::reports::{Dialect, charge, json_categories, refund, run_json, spawn_app_on, sql, summary_count};
use crate::support::{Backend, TestApp, on_both_backends, refund_request};
use crate::webhooks::Hooked;

async fn refunded(app: &TestApp, refund_key: &str, charge_key: &str, amount: Option<i64>) -> proto::Attempt {
    app.refund(refund_request(refund_key, charge_key, amount)).await.unwrap().attempt.unwrap()
}

/// Succeeded refunds at the provider, the money really returned, in minor units.
fn succeeded_at_provider(ledger: &Ledger) -> i64 {
    ledger.refunds.iter().filter(|refund| refund.status == "succeeded").map(|refund| refund.amount).sum()
}

fn usd(report: &Value) -> &Value {
    report["summary"]["currencies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["currency"] == "usd")
        .unwrap()
}

fn row<'a>(report: &'a Value, operation_key: &str) -> &'a Value {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["attempt"]["operation_key"] == operation_key)
        .unwrap()
}

/// A dispute is recorded by its webhook: the only events this test lets chargeguard hear.
#[tokio::test]
async fn a_dispute_heard_by_webhook_lands_in_disputed() {
    let hooked = Hooked::spawn().await;
    let app = &hooked.app;
    let (_, disputed_intent) = charge(app, "rc-disputed", "pm_card_visa").await;
    app.sim()
        .open_dispute(&disputed_intent, OpenDispute { amount: None, reason: Some("product_not_received".into()) })
        .await
        .unwrap();
    hooked.deliver().await;
    charge(app, "rc-undisputed", "pm_card_visa").await;

    let (code, report) = run_json(app, &[]).await;
    assert_eq!(code, 1, "a dispute is a discrepancy");
    assert_eq!(
        json_categories(&report),
        BTreeMap::from([("rc-disputed".into(), "disputed".into()), ("rc-undisputed".into(), "matched".into())])
    );
    let detail = row(&report, "rc-disputed")["detail"].as_str().unwrap().to_owned();
    assert!(detail.starts_with("dispute: dp_") && detail.contains("product_not_received"), "{detail}");
}

/// Every refund disagreement, seeded while chargeguard hears no webhook.
async fn each_refund_disagreement_lands_in_its_category(backend: Backend) {
    let app = &spawn_app_on(backend).await;
    let dialect = Dialect::of(app);
    let mut expected: BTreeMap<String, String> = BTreeMap::new();

    // Two partial refunds through chargeguard, as the provider has them.
    charge(app, "rc-matched", "pm_card_visa").await;
    refunded(app, "rc-matched:refund-1", "rc-matched", Some(300)).await;
    refunded(app, "rc-matched:refund-2", "rc-matched", Some(200)).await;
    expected.insert("rc-matched".into(), "matched".into());

    // Refunded at the provider by someone else.
    let (_, orphan_intent) = charge(app, "rc-orphan", "pm_card_visa").await;
    refund(app, &orphan_intent, 250).await;
    expected.insert("rc-orphan".into(), "orphan_refund".into());

    // Our succeeded refund, failed at the provider since (its events never arrived).
    charge(app, "rc-failed", "pm_card_visa").await;
    let failed = refunded(app, "rc-failed:refund-1", "rc-failed", Some(400)).await;
    app.sim().fail_refund(&failed.provider_payment_id, None).await.unwrap();
    expected.insert("rc-failed".into(), "refund_mismatch".into());

    // Our succeeded refund the provider never had.
    let (missing_charge, _) = charge(app, "rc-missing", "pm_card_visa").await;
    let now = dialect.now();
    sql(
        app,
        &format!(
            "INSERT INTO payment_attempts (id, consumer, operation_key, kind, parent_attempt_id,
                 amount_minor, currency, payment_method, fingerprint, status, provider,
                 provider_payment_id, idempotency_key, key_window_started_at, next_check_at,
                 created_at, updated_at)
             VALUES ({}, 'orders', 'rc-missing:refund-1', 'refund', {}, 999, 'usd',
                 'pm_card_visa', 'seeded', 'succeeded', 'stripe', 're_never_existed',
                 'seeded-rc-missing', {now}, {now}, {now}, {now})",
            dialect.new_id(),
            dialect.id(&missing_charge)
        ),
    )
    .await;
    expected.insert("rc-missing".into(), "refund_mismatch".into());

    // Pending when we last heard; succeeded at the provider since.
    charge(app, "rc-beyond", "pm_card_visa").await;
    app.sim().set_refund_mode(RefundMode::Pending).await.unwrap();
    let pending = refunded(app, "rc-beyond:refund-1", "rc-beyond", Some(300)).await;
    app.sim().set_refund_mode(RefundMode::Succeeded).await.unwrap();
    app.sim().settle_refund(&pending.provider_payment_id).await.unwrap();
    expected.insert("rc-beyond".into(), "refunded_beyond_record".into());

    let (code, report) = run_json(app, &[]).await;
    assert_eq!(code, 1, "discrepancies exit 1");
    assert_eq!(json_categories(&report), expected);
    for (category, rows) in [("refund_mismatch", 2), ("orphan_refund", 1), ("refunded_beyond_record", 1), ("matched", 1)] {
        assert_eq!(summary_count(&report, category), rows, "{category}");
    }
    let detail = |key: &str| row(&report, key)["detail"].as_str().unwrap().to_owned();
    assert!(detail("rc-failed").contains(&failed.provider_payment_id) && detail("rc-failed").contains("has it failed"), "{}", detail("rc-failed"));
    assert!(detail("rc-missing").contains("re_never_existed") && detail("rc-missing").contains("does not list it"), "{}", detail("rc-missing"));
    assert!(detail("rc-orphan").contains("2.50 usd"), "{}", detail("rc-orphan"));
    assert!(detail("rc-beyond").contains("refunded 3.00 usd") && detail("rc-beyond").contains("recorded 0.00 usd"), "{}", detail("rc-beyond"));
    assert_eq!(row(&report, "rc-orphan")["attempt"]["refunds"]["orphans_total"], 1);
    assert_eq!(row(&report, "rc-matched")["attempt"]["refunded_minor"], 500);

    // Ours refunded: what chargeguard recorded succeeded (matched 500, failed 400, missing 999);
    // the provider's: what it really returned.
    assert_eq!(usd(&report)["ours_refunded_minor"], 1_899);
    let ledger = app.sim().ledger().await.unwrap();
    assert_eq!(usd(&report)["provider_refunded_minor"], succeeded_at_provider(&ledger));
    assert_eq!(succeeded_at_provider(&ledger), 500 + 250 + 300);
}

/// The refund events settle the refunds (webhooks: PostgreSQL only on this branch).
#[tokio::test]
async fn with_every_event_in_ours_refunded_equals_the_simulators_succeeded_refunds() {
    let hooked = Hooked::spawn().await;
    let app = &hooked.app;
    charge(app, "rr-full", "pm_card_visa").await;
    refunded(app, "rr-full:refund-1", "rr-full", None).await;
    charge(app, "rr-partial", "pm_card_visa").await;
    refunded(app, "rr-partial:refund-1", "rr-partial", Some(100)).await;
    refunded(app, "rr-partial:refund-2", "rr-partial", Some(250)).await;
    charge(app, "rr-failed", "pm_card_visa").await;
    let failed = refunded(app, "rr-failed:refund-1", "rr-failed", Some(600)).await;
    charge(app, "rr-settled", "pm_card_visa").await;
    app.sim().set_refund_mode(RefundMode::Pending).await.unwrap();
    let pending = refunded(app, "rr-settled:refund-1", "rr-settled", Some(700)).await;
    app.sim().settle_refund(&pending.provider_payment_id).await.unwrap();
    app.sim().fail_refund(&failed.provider_payment_id, Some("expired_or_canceled_card")).await.unwrap();
    hooked.deliver().await;

    let (code, report) = run_json(app, &[]).await;
    assert_eq!(code, 0, "{report}");
    for key in ["rr-full", "rr-partial", "rr-failed", "rr-settled"] {
        assert_eq!(row(&report, key)["category"], "matched", "{key}: {}", row(&report, key)["detail"]);
    }
    let ledger = app.sim().ledger().await.unwrap();
    assert_eq!(succeeded_at_provider(&ledger), 1_000 + 100 + 250 + 700, "the failed refund returned nothing");
    assert_eq!(usd(&report)["ours_refunded_minor"], succeeded_at_provider(&ledger));
    assert_eq!(usd(&report)["provider_refunded_minor"], succeeded_at_provider(&ledger));
    assert_eq!(row(&report, "rr-failed")["attempt"]["refunded_minor"], 0);
}

on_both_backends!(each_refund_disagreement_lands_in_its_category);
