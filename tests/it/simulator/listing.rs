use std::time::Duration;

use chargeguard::simulator::SimulatorConfig;
use stripe_core::payment_intent::{ListPaymentIntent, SearchPaymentIntent};
use stripe_types::{RangeBoundsTs, RangeQueryTs};

use super::{Sim, charge};

#[tokio::test]
async fn list_pages_newest_first_with_created_bounds() {
    let sim = Sim::start().await;
    let mut ids = Vec::new();
    let mut created = Vec::new();
    for index in 0..5 {
        let intent = charge(100 + index, "pm_card_visa", &format!("l{index}"))
            .send(&sim.stripe)
            .await
            .unwrap();
        ids.push(intent.id.as_str().to_owned());
        created.push(intent.created);
        sim.control
            .advance_clock(Duration::from_secs(10))
            .await
            .unwrap();
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();

    let page = ListPaymentIntent::new()
        .limit(2)
        .send(&sim.stripe)
        .await
        .unwrap();
    let mut seen: Vec<String> = page
        .data
        .iter()
        .map(|intent| intent.id.as_str().to_owned())
        .collect();
    assert!(page.has_more);
    let mut last = page;
    while last.has_more {
        let after = last.data.last().unwrap().id.as_str().to_owned();
        last = ListPaymentIntent::new()
            .limit(2)
            .starting_after(after)
            .send(&sim.stripe)
            .await
            .unwrap();
        seen.extend(last.data.iter().map(|intent| intent.id.as_str().to_owned()));
    }
    assert_eq!(seen, newest_first);

    let bounds = RangeBoundsTs {
        gte: Some(created[1]),
        lte: Some(created[3]),
        ..RangeBoundsTs::default()
    };
    let middle = ListPaymentIntent::new()
        .created(RangeQueryTs::Bounds(bounds))
        .limit(100)
        .send(&sim.stripe)
        .await
        .unwrap();
    let middle: Vec<&str> = middle
        .data
        .iter()
        .map(|intent| intent.id.as_str())
        .collect();
    assert_eq!(middle, [ids[3].as_str(), ids[2].as_str(), ids[1].as_str()]);
}

#[tokio::test]
async fn search_finds_by_metadata_only_after_the_lag() {
    let sim = Sim::start_with(SimulatorConfig {
        search_lag_seconds: 30,
        ..SimulatorConfig::default()
    })
    .await;
    let intent = charge(100, "pm_card_visa", "needle")
        .send(&sim.stripe)
        .await
        .unwrap();
    charge(100, "pm_card_visa", "hay")
        .send(&sim.stripe)
        .await
        .unwrap();
    let query = "metadata['attempt']:'needle'";
    assert!(
        SearchPaymentIntent::new(query)
            .send(&sim.stripe)
            .await
            .unwrap()
            .data
            .is_empty()
    );
    sim.control
        .advance_clock(Duration::from_secs(30))
        .await
        .unwrap();
    let found = SearchPaymentIntent::new(query)
        .send(&sim.stripe)
        .await
        .unwrap();
    let ids: Vec<&str> = found.data.iter().map(|found| found.id.as_str()).collect();
    assert_eq!(ids, [intent.id.as_str()]);
    let both = SearchPaymentIntent::new("status:'succeeded' AND amount>=100")
        .limit(1)
        .send(&sim.stripe)
        .await
        .unwrap();
    assert!(both.has_more);
    let next = SearchPaymentIntent::new("status:'succeeded' AND amount>=100")
        .limit(1)
        .page(both.next_page.clone().unwrap())
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(next.data.len(), 1);
    assert_ne!(next.data[0].id, both.data[0].id);
    assert!(!next.has_more);
}
