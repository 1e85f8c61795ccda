//! Verification of Stripe's `Stripe-Signature` header over the raw body, as Stripe documents it:
//! `t=<unix seconds>,v1=<hex HMAC-SHA256 of "{t}.{body}">[,v1=…]`. Several `v1` values appear
//! while Stripe rolls a secret; several configured secrets let us roll ours. Pure: the caller
//! passes `now`.

use chrono::{DateTime, Duration, Utc};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::secret::Secret;

/// Bound on the header we parse; Stripe's is well under 1 KiB even with several signatures.
pub const SIGNATURE_HEADER_LENGTH_MAX: usize = 4_096;
/// Bound on `v1` entries looked at (each costs one HMAC per secret).
pub const SIGNATURES_MAX: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("missing Stripe-Signature header")]
    Missing,
    #[error("malformed Stripe-Signature header")]
    Malformed,
    #[error("signature timestamp outside the tolerance")]
    OutsideTolerance,
    #[error("no signature matches a configured secret")]
    NoMatch,
}

impl SignatureError {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            SignatureError::Missing => "signature_missing",
            SignatureError::Malformed => "signature_malformed",
            SignatureError::OutsideTolerance => "signature_stale",
            SignatureError::NoMatch => "signature_forged",
        }
    }
}

/// The signing secrets and the allowed distance between the signature's timestamp and `now`.
#[derive(Clone)]
pub struct Verifier {
    secrets: Vec<Secret>,
    tolerance: Duration,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field(
                "secrets",
                &format_args!("<{} redacted>", self.secrets.len()),
            )
            .field("tolerance", &self.tolerance)
            .finish()
    }
}

struct ParsedHeader {
    timestamp: i64,
    signatures: Vec<Vec<u8>>,
}

impl Verifier {
    /// `None` without a non-empty secret: an endpoint that accepts everything is never built.
    pub fn new(secrets: Vec<Secret>, tolerance: Duration) -> Option<Self> {
        let secrets: Vec<Secret> = secrets
            .into_iter()
            .filter(|secret| !secret.is_empty())
            .collect();
        (!secrets.is_empty() && tolerance > Duration::zero()).then_some(Self { secrets, tolerance })
    }

    /// Accepts when some `v1` signature is the HMAC of `"{t}.{body}"` under some secret and `t`
    /// is within the tolerance of `now`, in either direction.
    pub fn verify(
        &self,
        header: Option<&str>,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<(), SignatureError> {
        let header = header.ok_or(SignatureError::Missing)?;
        let parsed = parse_header(header)?;
        let distance = (now.timestamp() - parsed.timestamp).abs();
        if distance > self.tolerance.num_seconds() {
            return Err(SignatureError::OutsideTolerance);
        }
        let prefix = format!("{}.", parsed.timestamp);
        for secret in &self.secrets {
            let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.expose().as_bytes())
                .expect("HMAC takes keys of any length");
            mac.update(prefix.as_bytes());
            mac.update(body);
            for signature in &parsed.signatures {
                // verify_slice compares in constant time.
                if mac.clone().verify_slice(signature).is_ok() {
                    return Ok(());
                }
            }
        }
        Err(SignatureError::NoMatch)
    }
}

fn parse_header(header: &str) -> Result<ParsedHeader, SignatureError> {
    if header.len() > SIGNATURE_HEADER_LENGTH_MAX {
        return Err(SignatureError::Malformed);
    }
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for item in header.split(',') {
        let (key, value) = item
            .trim()
            .split_once('=')
            .ok_or(SignatureError::Malformed)?;
        match key {
            "t" => {
                if timestamp.is_some() {
                    return Err(SignatureError::Malformed);
                }
                timestamp = Some(
                    value
                        .parse::<i64>()
                        .map_err(|_| SignatureError::Malformed)?,
                );
            }
            // A v1 that is not hex cannot match; skipping it lets a well-formed one still count.
            "v1" if signatures.len() < SIGNATURES_MAX => {
                if let Ok(bytes) = hex::decode(value) {
                    signatures.push(bytes);
                }
            }
            // Other schemes (v0 is Stripe's test scheme) are not trusted.
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::Malformed)?;
    if signatures.is_empty() {
        return Err(SignatureError::NoMatch);
    }
    Ok(ParsedHeader {
        timestamp,
        signatures,
    })
}

/// The header Stripe would send for `body` at `timestamp` under `secret` (tests, tools).
pub fn sign(secret: &Secret, timestamp: i64, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.expose().as_bytes())
        .expect("HMAC takes keys of any length");
    mac.update(format!("{timestamp}.").as_bytes());
    mac.update(body);
    format!(
        "t={timestamp},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    const BODY: &[u8] = br#"{"id":"evt_1","type":"payment_intent.succeeded"}"#;

    fn at(seconds: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(seconds, 0).unwrap()
    }

    fn verifier(secrets: &[&str]) -> Verifier {
        Verifier::new(
            secrets.iter().map(|s| Secret::new(*s)).collect(),
            Duration::seconds(300),
        )
        .unwrap()
    }

    #[test]
    fn accepts_what_stripe_signs() {
        let header = stripe_webhook::Webhook::generate_test_header(
            std::str::from_utf8(BODY).unwrap(),
            "whsec_a",
            Some(1_700_000_000),
        );
        assert_eq!(
            verifier(&["whsec_a"]).verify(Some(&header), BODY, at(1_700_000_100)),
            Ok(())
        );
        assert_eq!(header, sign(&Secret::new("whsec_a"), 1_700_000_000, BODY));
    }

    #[test]
    fn any_configured_secret_and_any_v1_may_match() {
        let good = sign(&Secret::new("whsec_new"), 1_700_000_000, BODY);
        let good_v1 = good.split_once(",v1=").unwrap().1;
        let header = format!("t=1700000000,v1={},v0=abc,v1={good_v1}", "00".repeat(32));
        let rotating = verifier(&["whsec_old", "whsec_new"]);
        assert_eq!(
            rotating.verify(Some(&header), BODY, at(1_700_000_000)),
            Ok(())
        );
        assert_eq!(
            verifier(&["whsec_old"]).verify(Some(&header), BODY, at(1_700_000_000)),
            Err(SignatureError::NoMatch)
        );
    }

    #[test]
    fn rejects_a_tampered_body_or_a_wrong_secret() {
        let header = sign(&Secret::new("whsec_a"), 1_700_000_000, BODY);
        let v = verifier(&["whsec_a"]);
        assert_eq!(
            v.verify(Some(&header), b"{}", at(1_700_000_000)),
            Err(SignatureError::NoMatch)
        );
        let forged = sign(&Secret::new("whsec_b"), 1_700_000_000, BODY);
        assert_eq!(
            v.verify(Some(&forged), BODY, at(1_700_000_000)),
            Err(SignatureError::NoMatch)
        );
    }

    #[test]
    fn tolerance_is_inclusive_and_applies_both_ways() {
        let header = sign(&Secret::new("whsec_a"), 1_700_000_000, BODY);
        let v = verifier(&["whsec_a"]);
        assert_eq!(v.verify(Some(&header), BODY, at(1_700_000_300)), Ok(()));
        assert_eq!(
            v.verify(Some(&header), BODY, at(1_700_000_301)),
            Err(SignatureError::OutsideTolerance)
        );
        assert_eq!(
            v.verify(Some(&header), BODY, at(1_699_999_699)),
            Err(SignatureError::OutsideTolerance)
        );
    }

    #[test]
    fn malformed_headers_are_rejected() {
        let v = verifier(&["whsec_a"]);
        let now = at(1_700_000_000);
        assert_eq!(v.verify(None, BODY, now), Err(SignatureError::Missing));
        for header in ["", "garbage", "v1=00", "t=abc,v1=00", "t=1,t=2,v1=00"] {
            assert_eq!(
                v.verify(Some(header), BODY, now),
                Err(SignatureError::Malformed),
                "{header:?}"
            );
        }
        assert_eq!(
            v.verify(Some("t=1700000000"), BODY, now),
            Err(SignatureError::NoMatch)
        );
        let long = format!(
            "t=1700000000,v1={}",
            "0".repeat(SIGNATURE_HEADER_LENGTH_MAX)
        );
        assert_eq!(
            v.verify(Some(&long), BODY, now),
            Err(SignatureError::Malformed)
        );
    }

    #[test]
    fn no_secret_means_no_verifier() {
        assert!(Verifier::new(vec![], Duration::seconds(300)).is_none());
        assert!(Verifier::new(vec![Secret::new("")], Duration::seconds(300)).is_none());
    }
}
