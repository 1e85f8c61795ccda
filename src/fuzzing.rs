//! Entry points for the fuzz targets in `fuzz/` (cargo fuzz, libFuzzer): every parser that takes
//! outside input, each called as the service calls it, with the invariants a success must keep.
//! Not part of the API; kept here so the targets reach private parsers without widening them.

use chrono::{Duration, TimeZone, Utc};
use prost::Message;

use crate::secret::Secret;

/// The `Stripe-Signature` header and the body together, as `POST /webhooks/stripe` reads them:
/// the first line of `data` is the header, the rest the body.
pub fn webhook(data: &[u8]) {
    let (header, body) = match data.iter().position(|&byte| byte == b'\n') {
        Some(newline) => (&data[..newline], &data[newline + 1..]),
        None => (data, &[][..]),
    };
    let header = std::str::from_utf8(header).ok();
    let secret = Secret::new("whsec_fuzz");
    let verifier = crate::webhook::Verifier::new(vec![secret.clone()], Duration::seconds(300)).expect("a secret");
    let now = Utc.timestamp_opt(1_700_000_000, 0).single().expect("a valid instant");
    // An unsigned header never verifies; the same body signed always does.
    let _ = verifier.verify(header, body, now);
    let signed = crate::webhook::signature::sign(&secret, now.timestamp(), body);
    assert!(verifier.verify(Some(&signed), body, now).is_ok(), "a correctly signed body is accepted");
    if let Ok(envelope) = crate::webhook::event::parse_envelope(body) {
        assert!(!envelope.id.is_empty() && envelope.id.len() <= crate::webhook::event::EVENT_FIELD_LENGTH_MAX);
        if let Ok(payload) = std::str::from_utf8(body) {
            let _ = crate::webhook::event::parse_subject(&envelope.event_type, payload);
        }
    }
}

/// A `ChargeRequest` off the wire, converted as `Payments/Charge` converts it.
pub fn charge_request(data: &[u8]) {
    let Ok(request) = crate::grpc::proto::ChargeRequest::decode(data) else { return };
    let amount_minor_max = 99_999_999;
    if let Ok(charge) = crate::grpc::convert::charge_request(&request, amount_minor_max) {
        assert!(charge.params.amount_minor > 0 && charge.params.amount_minor <= amount_minor_max);
        assert_eq!(charge.operation_key.as_str(), request.operation_key);
    }
}

/// Operation keys, consumer names and metadata, and the idempotency key derived from them.
pub fn operation(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(3, '\u{0}');
    let (consumer, key, rest) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if let (Ok(consumer), Ok(key)) = (crate::domain::ConsumerName::parse(consumer), crate::domain::OperationKey::parse(key)) {
        let first = crate::domain::derive_idempotency_key(&consumer, &key, 1);
        assert_eq!(first, crate::domain::derive_idempotency_key(&consumer, &key, 1), "derivation is a function");
        assert_ne!(first, crate::domain::derive_idempotency_key(&consumer, &key, 2), "generations differ");
    }
    let entries: Vec<(String, String)> = rest
        .split('&')
        .map(|pair| pair.split_once('=').map_or((pair.to_owned(), String::new()), |(k, v)| (k.to_owned(), v.to_owned())))
        .collect();
    let _ = crate::domain::Metadata::parse(entries.iter().map(|(key, value)| (key, value)));
}

/// A configuration file, loaded and validated as `serve` does (defaults, then the TOML).
pub fn config(data: &[u8]) {
    use figment::providers::{Format, Serialized, Toml};
    let Ok(text) = std::str::from_utf8(data) else { return };
    let loaded: Result<crate::config::Config, _> =
        figment::Figment::from(Serialized::defaults(crate::config::Config::default())).merge(Toml::string(text)).extract();
    if let Ok(config) = loaded
        && config.validate().is_ok()
    {
        let _ = crate::grpc::Authenticator::from_config(&config.consumers).expect("validated consumers build");
        let _ = crate::grpc::ConsumerLimits::from_config(&config.consumers).expect("validated limits build");
    }
}

/// The simulator's form decoder (`application/x-www-form-urlencoded` bodies, Stripe's syntax).
pub fn simulator_form(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(mut params) = crate::simulator::wire::Params::parse(text, 64) {
        let _ = params.fingerprint().to_owned();
        let _ = params.take_string("currency");
        let _ = params.take_i64("amount");
        let _ = params.take_bool("confirm");
        let _ = params.take_string_map("metadata");
    }
}

#[cfg(test)]
mod tests {
    /// Every target over its seed corpus and over `fuzz/regressions/<target>/` (where a crash
    /// the fuzzer finds is kept, so it stays fixed) — a plain unit test, no fuzzer needed.
    #[test]
    fn every_fuzz_seed_and_regression_runs_clean() {
        type Target = fn(&[u8]);
        let targets: [(&str, Target); 5] = [
            ("webhook", super::webhook),
            ("charge_request", super::charge_request),
            ("operation", super::operation),
            ("config", super::config),
            ("simulator_form", super::simulator_form),
        ];
        let fuzz = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
        for (target, run) in targets {
            let mut inputs = 0;
            for folder in ["corpus", "regressions"] {
                let Ok(entries) = std::fs::read_dir(fuzz.join(folder).join(target)) else { continue };
                for entry in entries {
                    let path = entry.unwrap().path();
                    if folder == "regressions" || path.file_name().unwrap().to_string_lossy().starts_with("seed-") {
                        run(&std::fs::read(&path).unwrap());
                        inputs += 1;
                    }
                }
            }
            assert!(inputs > 0, "{target} has seeds in fuzz/corpus/{target}");
            run(b"");
        }
    }
}
