//! The 3-D Secure redirect URL of the simulator is a page for people: opening it changes
//! nothing; its "Complete" and "Fail" buttons (POST forms) authenticate, then return to the
//! intent's `return_url`.

use stripe_core::PaymentIntentStatus;
use stripe_core::payment_intent::RetrievePaymentIntent;

use super::{Sim, charge};

async fn status(sim: &Sim, id: &stripe_core::PaymentIntentId) -> PaymentIntentStatus {
    RetrievePaymentIntent::new(id.clone()).send(&sim.stripe).await.unwrap().status
}

#[tokio::test]
async fn simulator_3ds_page_shows_buttons_and_only_a_post_authenticates() {
    let sim = Sim::start().await;
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();

    let failing = charge(1_234, "pm_card_authenticationRequired", "3ds-page-1").send(&sim.stripe).await.unwrap();
    let url = failing.next_action.unwrap().redirect_to_url.unwrap().url.unwrap();
    let shown = client.get(&url).send().await.unwrap();
    assert_eq!(shown.status(), 200);
    assert!(shown.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    let html = shown.text().await.unwrap();
    assert!(html.contains("value=\"succeed\"") && html.contains("value=\"fail\""), "{html}");
    assert!(html.contains("method=\"post\""), "{html}");
    assert_eq!(status(&sim, &failing.id).await, PaymentIntentStatus::RequiresAction, "opening the page changes nothing");

    let failed = client.post(&url).form(&[("outcome", "fail")]).send().await.unwrap();
    assert_eq!(failed.status(), 200);
    assert!(failed.text().await.unwrap().contains("authentication failed"));
    assert_eq!(status(&sim, &failing.id).await, PaymentIntentStatus::RequiresPaymentMethod);
    assert_eq!(client.get(&url).send().await.unwrap().status(), 404, "nothing left to authenticate");

    let fresh = charge(500, "pm_card_threeDSecure2Required", "3ds-page-3")
        .return_url("https://shop.example/back?order=1")
        .send(&sim.stripe)
        .await
        .unwrap();
    let url = fresh.next_action.unwrap().redirect_to_url.unwrap().url.unwrap();
    let completed = client.post(&url).form(&[("outcome", "succeed")]).send().await.unwrap();
    assert_eq!(completed.status(), 302);
    assert_eq!(completed.headers()["location"], "https://shop.example/back?order=1");
    assert_eq!(status(&sim, &fresh.id).await, PaymentIntentStatus::Succeeded);
    assert_eq!(client.post(&url).form(&[("outcome", "bogus")]).send().await.unwrap().status(), 400);
}
