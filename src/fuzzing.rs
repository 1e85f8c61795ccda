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

/// A `RefundRequest` off the wire, converted as `Payments/Refund` converts it (the proto's
/// oneof and optionals, then `domain::RefundRequest`'s own validation).
pub fn refund_request(data: &[u8]) {
    use crate::domain::ChargeSelector;
    use crate::grpc::proto::refund_request::Charge;
    let Ok(request) = crate::grpc::proto::RefundRequest::decode(data) else { return };
    let Ok(refund) = crate::grpc::convert::refund_request(&request) else { return };
    assert_eq!(refund.operation_key.as_str(), request.operation_key);
    assert_eq!(refund.amount_minor(), request.amount_minor, "the amount is kept as sent, absent stays absent");
    assert!(refund.amount_minor().is_none_or(|amount| amount > 0), "a refund amount is positive");
    assert_eq!(refund.reason.map(|reason| reason.as_str()), request.reason.as_deref(), "the reason is kept as sent");
    match (&refund.charge, &request.charge) {
        (ChargeSelector::OperationKey(key), Some(Charge::ChargeOperationKey(sent))) => assert_eq!(key.as_str(), sent),
        (ChargeSelector::AttemptId(id), Some(Charge::ChargeAttemptId(sent))) => {
            assert_eq!(id.as_uuid(), uuid::Uuid::parse_str(sent).expect("a converted id parses"));
        }
        (selector, sent) => panic!("the charge selector {selector:?} does not match what was sent: {sent:?}"),
    }
    // Redelivery matches by fingerprint: the same bytes must convert to the same fingerprint.
    let again = crate::grpc::convert::refund_request(&request).expect("conversion is a function");
    assert_eq!(refund.fingerprint(), again.fingerprint());
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
    use rand::{Rng, SeedableRng};

    type Target = fn(&[u8]);

    /// Every fuzz target (`fuzz/fuzz_targets/`), by name.
    const TARGETS: [(&str, Target); 6] = [
        ("webhook", super::webhook),
        ("charge_request", super::charge_request),
        ("refund_request", super::refund_request),
        ("operation", super::operation),
        ("config", super::config),
        ("simulator_form", super::simulator_form),
    ];

    /// The inputs kept for `target`: its seeds (`fuzz/corpus/<target>/seed-*`) and every crash
    /// the fuzzer found (`fuzz/regressions/<target>/`), in a stable order.
    fn kept_inputs(target: &str) -> Vec<Vec<u8>> {
        let fuzz = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
        let mut paths = Vec::new();
        for folder in ["corpus", "regressions"] {
            let Ok(entries) = std::fs::read_dir(fuzz.join(folder).join(target)) else { continue };
            for entry in entries {
                let path = entry.unwrap().path();
                if folder == "regressions" || path.file_name().unwrap().to_string_lossy().starts_with("seed-") {
                    paths.push(path);
                }
            }
        }
        paths.sort();
        paths.iter().map(|path| std::fs::read(path).unwrap()).collect()
    }

    /// Every target over its seed corpus and over `fuzz/regressions/<target>/` (where a crash
    /// the fuzzer finds is kept, so it stays fixed) — a plain unit test, no fuzzer needed.
    #[test]
    fn every_fuzz_seed_and_regression_runs_clean() {
        for (target, run) in TARGETS {
            let inputs = kept_inputs(target);
            assert!(!inputs.is_empty(), "{target} has seeds in fuzz/corpus/{target}");
            for input in &inputs {
                run(input);
            }
            run(b"");
        }
    }

    /// Mutated inputs per target in the suite's short form of `fuzz/run.sh`.
    const MUTATIONS_PER_TARGET: u32 = 20_000;

    /// The longest input a mutation makes, as `fuzz/run.sh`'s `-max_len`.
    const INPUT_LEN_MAX: usize = 4_096;

    /// Bytes that sit on the edges of the formats: varint continuation, sign and UTF-8 bounds,
    /// and the separators of TOML, forms, JSON and the signature header.
    const EDGE_BYTES: &[u8] = b"\x00\x01\x7f\x80\xff\xc3\n\r\t =&,;:.\"'[]{}#%+-tv";

    /// Tokens a byte flip would rarely make: numbers past every bound, and the words the
    /// formats key on.
    const TOKENS: &[&[u8]] = &[
        b"99999999999999999999",
        b"-1",
        b"0",
        b"%zz",
        b"%00",
        b"t=",
        b"v1=",
        b"[consumers.",
        b"metadata[",
        b"\"type\":",
        b"\xef\xbf\xbd",
    ];

    /// One input derived from `kept`: a kept input (or the splice of two), then one to four
    /// mutations of the kinds libFuzzer makes (bit flips, edge bytes, inserted and erased runs,
    /// copied runs, dictionary tokens, truncation), at most INPUT_LEN_MAX bytes. Pure but for
    /// `random`.
    fn mutate(kept: &[Vec<u8>], random: &mut impl Rng) -> Vec<u8> {
        let mut input = kept[random.gen_range(0..kept.len())].clone();
        if random.gen_ratio(1, 8) {
            let other = &kept[random.gen_range(0..kept.len())];
            input.truncate(random.gen_range(0..=input.len()));
            input.extend_from_slice(&other[random.gen_range(0..=other.len())..]);
        }
        for _ in 0..random.gen_range(1..=4) {
            let at = random.gen_range(0..=input.len());
            match random.gen_range(0..7) {
                0 if !input.is_empty() => {
                    let byte = random.gen_range(0..input.len());
                    input[byte] ^= 1 << random.gen_range(0..8);
                }
                1 if !input.is_empty() => {
                    let byte = random.gen_range(0..input.len());
                    input[byte] = EDGE_BYTES[random.gen_range(0..EDGE_BYTES.len())];
                }
                2 => {
                    let run: Vec<u8> = (0..random.gen_range(1..=8)).map(|_| random.r#gen()).collect();
                    input.splice(at..at, run);
                }
                3 => {
                    let end = random.gen_range(at..=input.len().min(at + 16));
                    input.drain(at..end);
                }
                4 if !input.is_empty() => {
                    let from = random.gen_range(0..input.len());
                    let to = random.gen_range(from..=input.len().min(from + 32));
                    let run = input[from..to].to_vec();
                    input.splice(at..at, run);
                }
                5 => {
                    let token = TOKENS[random.gen_range(0..TOKENS.len())];
                    input.splice(at..at, token.iter().copied());
                }
                _ => input.truncate(at),
            }
        }
        input.truncate(INPUT_LEN_MAX);
        input
    }

    /// The short form of `fuzz/run.sh`, so that every run of the suite fuzzes a little: each
    /// target over MUTATIONS_PER_TARGET mutations of its kept inputs, from a fixed seed (set
    /// `CHARGEGUARD_FUZZ_SEED` for others), with no coverage guidance and no cargo-fuzz. An
    /// input that fails a target is written under `target/fuzz-short/<target>/`, to be copied
    /// to `fuzz/regressions/<target>/` with its fix.
    #[test]
    fn every_fuzz_target_keeps_its_invariants_over_mutations_of_its_seeds() {
        let seed: u64 = std::env::var("CHARGEGUARD_FUZZ_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or(21);
        let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-short");
        for (index, (target, run)) in TARGETS.into_iter().enumerate() {
            let kept = kept_inputs(target);
            assert!(!kept.is_empty(), "{target} has seeds in fuzz/corpus/{target}");
            let mut random = rand_chacha::ChaCha8Rng::seed_from_u64(seed.wrapping_add(index as u64));
            for mutation in 0..MUTATIONS_PER_TARGET {
                let input = mutate(&kept, &mut random);
                if std::panic::catch_unwind(|| run(&input)).is_err() {
                    let folder = out.join(target);
                    std::fs::create_dir_all(&folder).unwrap();
                    let path = folder.join(format!("crash-seed{seed}-{mutation}"));
                    std::fs::write(&path, &input).unwrap();
                    panic!("{target} failed on mutation {mutation} of seed {seed}; the input is {}", path.display());
                }
            }
        }
    }

    #[test]
    fn mutations_stay_within_the_length_bound_and_differ_from_their_seeds() {
        let kept = vec![b"amount=2000&currency=usd".to_vec(), vec![0x08; INPUT_LEN_MAX]];
        let mut random = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let inputs: Vec<Vec<u8>> = (0..2_000).map(|_| mutate(&kept, &mut random)).collect();
        assert!(inputs.iter().all(|input| input.len() <= INPUT_LEN_MAX));
        let changed = inputs.iter().filter(|input| !kept.contains(input)).count();
        assert!(changed > 1_800, "only {changed} of 2000 mutations changed their input");
    }

    /// The refund seeds start the fuzzer past validation: by key with an amount and by attempt
    /// id with none convert, and the third is refused naming its field.
    #[test]
    fn the_refund_request_seeds_reach_both_selectors_and_a_refusal() {
        use prost::Message;
        let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/refund_request");
        let convert = |seed: &str| {
            let request = crate::grpc::proto::RefundRequest::decode(&std::fs::read(corpus.join(seed)).unwrap()[..]).unwrap();
            crate::grpc::convert::refund_request(&request)
        };
        let by_key = convert("seed-1").unwrap();
        assert!(matches!(by_key.charge, crate::domain::ChargeSelector::OperationKey(_)) && by_key.amount_minor() == Some(500));
        let by_id = convert("seed-2").unwrap();
        assert!(matches!(by_id.charge, crate::domain::ChargeSelector::AttemptId(_)) && by_id.amount_minor().is_none());
        assert_eq!(convert("seed-3").unwrap_err().field, "reason");
    }
}
