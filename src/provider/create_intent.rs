//! The one create a charge sends: `POST /v1/payment_intents` with `confirm=true`, as a request
//! of only the fields chargeguard sets.
//!
//! async-stripe's `CreatePaymentIntent` carries every parameter Stripe accepts inline (payment
//! method data and options for every method type), tens of kilobytes, and its builder takes
//! and returns it by value: each setter, and each move of the future holding it, copied the
//! whole struct: 12 % of the service's instructions per new charge (`bench/callgrind.sh`,
//! BENCHMARKS.md's twelfth round). This type sends the same form through the same client,
//! strategy and answer type; `tests::the_form_is_the_one_async_stripe_builds` fails if the two
//! ever differ.

use std::collections::BTreeMap;

use serde::Serialize;
use stripe_client_core::{RequestBuilder, StripeMethod, StripeRequest};
use stripe_core::PaymentIntent;
use stripe_types::Currency as StripeCurrency;

/// The fields in the order async-stripe serializes them (its builder's, alphabetical), so the
/// body is byte for byte the one it would send, but for metadata, which goes in key order here
/// (async-stripe's `HashMap` sends it in whatever order the map iterates).
#[derive(Debug, Serialize)]
pub struct CreateConfirmedIntent<'a> {
    amount: i64,
    confirm: bool,
    currency: StripeCurrency,
    #[serde(skip_serializing_if = "Option::is_none")]
    customer: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    metadata: &'a BTreeMap<String, String>,
    payment_method: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    return_url: Option<&'a str>,
}

impl<'a> CreateConfirmedIntent<'a> {
    pub fn new(
        amount: i64,
        currency: StripeCurrency,
        payment_method: &'a str,
        metadata: &'a BTreeMap<String, String>,
    ) -> Self {
        Self {
            amount,
            confirm: true,
            currency,
            customer: None,
            description: None,
            metadata,
            payment_method,
            return_url: None,
        }
    }

    pub fn customer(mut self, customer: Option<&'a str>) -> Self {
        self.customer = customer;
        self
    }

    pub fn description(mut self, description: Option<&'a str>) -> Self {
        self.description = description;
        self
    }

    pub fn return_url(mut self, return_url: Option<&'a str>) -> Self {
        self.return_url = return_url;
        self
    }
}

impl StripeRequest for CreateConfirmedIntent<'_> {
    type Output = PaymentIntent;

    fn build(&self) -> RequestBuilder {
        RequestBuilder::new(StripeMethod::Post, "/payment_intents").form(self)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use stripe_core::payment_intent::CreatePaymentIntent;

    use super::*;

    fn pairs(builder: &RequestBuilder) -> Vec<(String, String)> {
        let body = builder.body.as_deref().expect("a create has a form body");
        let mut pairs: Vec<(String, String)> = serde_urlencoded::from_str(body).expect("a form");
        pairs.sort();
        pairs
    }

    fn metadata() -> BTreeMap<String, String> {
        [
            ("order", "o-1 & co"),
            ("chargeguard_attempt_id", "0192"),
            ("zeta", "ü=1"),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect()
    }

    #[test]
    fn the_form_is_the_one_async_stripe_builds() {
        let metadata = metadata();
        let cases: [(Option<&str>, Option<&str>, Option<&str>); 3] = [
            (None, None, None),
            (
                Some("cus_1"),
                Some("Order #1, 2 items"),
                Some("https://shop.example/return?x=1"),
            ),
            (None, Some(""), None),
        ];
        for (customer, description, return_url) in cases {
            let ours =
                CreateConfirmedIntent::new(1200, StripeCurrency::USD, "pm_card_visa", &metadata)
                    .customer(customer)
                    .description(description)
                    .return_url(return_url)
                    .build();
            let mut theirs = CreatePaymentIntent::new(1200, StripeCurrency::USD)
                .confirm(true)
                .payment_method("pm_card_visa")
                .metadata(
                    metadata
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect::<HashMap<_, _>>(),
                );
            if let Some(customer) = customer {
                theirs = theirs.customer(customer);
            }
            if let Some(description) = description {
                theirs = theirs.description(description);
            }
            if let Some(return_url) = return_url {
                theirs = theirs.return_url(return_url);
            }
            let theirs = theirs.build();
            assert_eq!(
                pairs(&ours),
                pairs(&theirs),
                "{customer:?} {description:?} {return_url:?}"
            );
            assert_eq!(ours.path, theirs.path);
            assert_eq!(format!("{:?}", ours.method), format!("{:?}", theirs.method));
            assert_eq!(ours.query, theirs.query);
        }
    }

    #[test]
    fn metadata_goes_in_key_order() {
        let metadata = metadata();
        let body = CreateConfirmedIntent::new(5, StripeCurrency::EUR, "pm_x", &metadata)
            .build()
            .body
            .unwrap();
        let keys: Vec<&str> = body
            .split('&')
            .filter(|pair| pair.starts_with("metadata"))
            .map(|pair| pair.split('=').next().unwrap())
            .collect();
        assert_eq!(
            keys,
            [
                "metadata[chargeguard_attempt_id]",
                "metadata[order]",
                "metadata[zeta]"
            ]
        );
        assert!(
            body.starts_with("amount=5&confirm=true&currency=eur&metadata"),
            "{body}"
        );
    }
}
