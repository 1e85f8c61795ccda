//! The producer of the chaos test and the demo: N orders with a fixed amount each, some with a
//! declining card, some published twice on purpose. Pure: the broker modules publish.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::event::OrderPlaced;

pub const DECLINING_CARD: &str = "pm_card_chargeDeclined";
pub const PAYING_CARD: &str = "pm_card_visa";

#[derive(Debug, Clone)]
pub struct Plan {
    pub count: u32,
    pub prefix: String,
    pub amount_minor: i64,
    pub currency: String,
    pub decline_percent: u32,
    pub duplicate_percent: u32,
    pub seed: u64,
}

/// One line of the manifest: what the producer meant, for the checker to compare with what
/// happened.
#[derive(Debug, Clone, Serialize)]
pub struct Planned {
    pub order_id: String,
    pub amount_minor: i64,
    pub declining: bool,
    pub published: u32,
}

/// The events in publishing order (duplicates shuffled in among the rest) and the manifest.
/// Each event's `placed_at_ms` is set when it is published.
pub fn plan(plan: &Plan) -> (Vec<OrderPlaced>, Vec<Planned>) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(plan.seed);
    let mut events = Vec::new();
    let mut manifest = Vec::new();
    for index in 0..plan.count {
        let declining = rng.gen_range(0..100) < plan.decline_percent;
        let duplicated = rng.gen_range(0..100) < plan.duplicate_percent;
        let event = OrderPlaced {
            order_id: format!("{}-{index:06}", plan.prefix),
            amount_minor: plan.amount_minor,
            currency: plan.currency.clone(),
            payment_method: if declining { DECLINING_CARD } else { PAYING_CARD }.to_owned(),
            customer: None,
            placed_at_ms: 0,
        };
        let published = if duplicated { 2 } else { 1 };
        manifest.push(Planned { order_id: event.order_id.clone(), amount_minor: event.amount_minor, declining, published });
        for _ in 0..published {
            events.push(event.clone());
        }
    }
    events.shuffle(&mut rng);
    (events, manifest)
}

/// The message body of `event` placed now.
pub fn body_placed_now(event: &OrderPlaced) -> Vec<u8> {
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_millis() as i64);
    serde_json::to_vec(&OrderPlaced { placed_at_ms: now_ms, ..event.clone() }).expect("an event serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_repeats_with_its_seed_and_publishes_duplicates_twice() {
        let plan_of = |seed| Plan {
            count: 1_000,
            prefix: "o".into(),
            amount_minor: 1999,
            currency: "usd".into(),
            decline_percent: 5,
            duplicate_percent: 3,
            seed,
        };
        let (bodies, manifest) = plan(&plan_of(1));
        let (again, _) = plan(&plan_of(1));
        assert_eq!(bodies, again);
        let published: u32 = manifest.iter().map(|planned| planned.published).sum();
        assert_eq!(bodies.len(), published as usize);
        let declining = manifest.iter().filter(|planned| planned.declining).count();
        let duplicated = manifest.iter().filter(|planned| planned.published == 2).count();
        assert!((20..=90).contains(&declining), "{declining}");
        assert!((10..=60).contains(&duplicated), "{duplicated}");
    }
}
