//! Who is calling: bearer tokens (several per consumer while rotating) and client certificates
//! (mutual TLS; by the certificate's SHA-256 or by a name in it), tokens and digests compared in
//! constant time. Failures are counted per consumer in
//! `chargeguard_authentication_failures_total` and logged, never with what the caller sent.

use rustls_pki_types::CertificateDer;
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};
use tonic::Request;

use crate::config::ConsumerConfig;
use crate::domain::ConsumerName;

/// Longest `authorization` value looked at. Tokens are short; a longer header is refused as
/// malformed before anything is hashed, so a huge header costs the server nothing.
pub const AUTHORIZATION_BYTES_MAX: usize = 1_024;
/// Consumer label of failures whose token and certificate name nobody.
const UNKNOWN_CONSUMER: &str = "unknown";
/// No consumer matched (an index no consumer has).
const NO_MATCH: u32 = u32::MAX;

/// Maps bearer tokens and client certificates to consumers. Holds only SHA-256 digests, so a
/// dump of the process's configuration never yields a usable token.
#[derive(Clone, Default)]
pub struct Authenticator {
    consumers: Vec<Identity>,
    /// (SHA-256 of a token, index into `consumers`).
    tokens: Vec<([u8; 32], u32)>,
    /// (SHA-256 of a client certificate's DER, index into `consumers`).
    certificates: Vec<([u8; 32], u32)>,
    /// (a name the client certificate carries, index into `consumers`). Names are public
    /// (anyone can read a certificate); what makes one trustworthy is that the client CA signed
    /// it, which the TLS handshake checked before the call got here.
    certificate_names: Vec<(String, u32)>,
}

#[derive(Clone)]
struct Identity {
    name: ConsumerName,
    needs_token: bool,
    needs_certificate: bool,
}

/// Lowercase hex SHA-256 of a token, as configuration stores it.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Lowercase hex SHA-256 of a certificate's DER, as `consumers[].client_cert_sha256` stores it
/// (`openssl x509 -in cert.pem -outform der | sha256sum`).
pub fn certificate_sha256(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

/// Why a call was not authenticated. The message never repeats what the caller sent.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("missing authorization metadata: send \"authorization: Bearer <token>\"")]
    Missing,
    #[error("malformed authorization metadata: expected \"Bearer <token>\" of at most {AUTHORIZATION_BYTES_MAX} bytes")]
    Malformed,
    #[error("unknown bearer token")]
    Unknown,
    #[error("unknown client certificate and no bearer token")]
    UnknownCertificate,
    #[error("this consumer must also present its client certificate")]
    CertificateRequired,
    #[error("this consumer must also send its bearer token")]
    TokenRequired,
    #[error("the bearer token and the client certificate belong to different consumers")]
    Conflict,
    #[error("the client certificate names more than one consumer")]
    AmbiguousCertificate,
}

impl AuthError {
    /// The metric's `reason` label.
    fn reason(&self) -> &'static str {
        match self {
            AuthError::Missing => "missing",
            AuthError::Malformed => "malformed",
            AuthError::Unknown => "unknown_token",
            AuthError::UnknownCertificate => "unknown_certificate",
            AuthError::CertificateRequired => "certificate_required",
            AuthError::TokenRequired => "token_required",
            AuthError::Conflict => "conflict",
            AuthError::AmbiguousCertificate => "ambiguous_certificate",
        }
    }
}

/// A refusal and, when the token or certificate named one, the consumer it was about.
pub struct AuthFailure {
    pub error: AuthError,
    pub consumer: Option<ConsumerName>,
}

impl Authenticator {
    pub fn from_config(consumers: &[ConsumerConfig]) -> Result<Self, crate::domain::InvalidField> {
        let mut authenticator = Self::default();
        for (index, consumer) in consumers.iter().enumerate() {
            let index = u32::try_from(index).expect("fewer than 4 billion consumers");
            authenticator.consumers.push(Identity {
                name: ConsumerName::parse(&consumer.name)?,
                needs_token: !consumer.token_sha256.is_empty(),
                needs_certificate: !consumer.client_cert_sha256.is_empty() || !consumer.client_cert_names.is_empty(),
            });
            for hash in consumer.token_sha256.iter() {
                authenticator.tokens.push((digest_of_hex("token_sha256", hash)?, index));
            }
            for hash in consumer.client_cert_sha256.iter() {
                authenticator.certificates.push((digest_of_hex("client_cert_sha256", hash)?, index));
            }
            for name in &consumer.client_cert_names {
                authenticator.certificate_names.push((name.clone(), index));
            }
        }
        Ok(authenticator)
    }

    /// The caller of `request`; a refusal is counted and logged here.
    pub fn authenticate<T>(&self, request: &Request<T>) -> Result<ConsumerName, AuthError> {
        let authorization = request.metadata().get("authorization").map(|value| value.as_bytes());
        let certificates = request.peer_certs();
        let leaf = certificates.as_ref().and_then(|certificates| certificates.first());
        self.identify(authorization, leaf).map_err(|failure| {
            record_failure(&failure);
            failure.error
        })
    }

    /// Pure: who `authorization` and the client's leaf certificate name, if they agree.
    pub fn identify(&self, authorization: Option<&[u8]>, leaf: Option<&CertificateDer<'_>>) -> Result<ConsumerName, AuthFailure> {
        let fail = |error, consumer: Option<&Identity>| AuthFailure { error, consumer: consumer.map(|c| c.name.clone()) };
        let by_certificate = match leaf {
            Some(leaf) => self.certificate_owner(leaf).map_err(|error| fail(error, None))?,
            None => None,
        };
        let token = match authorization {
            Some(header) => Some(bearer_token(header).map_err(|error| fail(error, by_certificate))?),
            None => None,
        };
        match (token, by_certificate) {
            (Some(token), by_certificate) => {
                let consumer = self
                    .find(&self.tokens, &Sha256::digest(token).into())
                    .ok_or_else(|| fail(AuthError::Unknown, by_certificate))?;
                match by_certificate {
                    Some(other) if other.name != consumer.name => Err(fail(AuthError::Conflict, Some(consumer))),
                    None if consumer.needs_certificate => Err(fail(AuthError::CertificateRequired, Some(consumer))),
                    _ => Ok(consumer.name.clone()),
                }
            }
            (None, Some(consumer)) if consumer.needs_token => Err(fail(AuthError::TokenRequired, Some(consumer))),
            (None, Some(consumer)) => Ok(consumer.name.clone()),
            (None, None) if leaf.is_some() && self.identifies_certificates() => Err(fail(AuthError::UnknownCertificate, None)),
            (None, None) => Err(fail(AuthError::Missing, None)),
        }
    }

    fn identifies_certificates(&self) -> bool {
        !self.certificates.is_empty() || !self.certificate_names.is_empty()
    }

    /// The consumer a verified client certificate identifies: by its SHA-256, or by a name it
    /// carries (`consumers[].client_cert_names`). A certificate that would identify two
    /// consumers identifies none: the call could act as either.
    fn certificate_owner(&self, leaf: &CertificateDer<'_>) -> Result<Option<&Identity>, AuthError> {
        let mut owners: Vec<u32> = self.find_index(&self.certificates, &Sha256::digest(leaf.as_ref()).into()).into_iter().collect();
        if !self.certificate_names.is_empty() {
            let names = certificate_names(leaf);
            owners.extend(
                self.certificate_names
                    .iter()
                    .filter(|(configured, _)| names.iter().any(|name| name == configured))
                    .map(|(_, index)| *index),
            );
        }
        owners.sort_unstable();
        owners.dedup();
        match owners.as_slice() {
            [] => Ok(None),
            [index] => Ok(self.consumers.get(*index as usize)),
            _ => Err(AuthError::AmbiguousCertificate),
        }
    }

    /// The consumer of `digest` in `entries`, comparing every entry in constant time: how long
    /// this takes says nothing about how close a guess came.
    fn find(&self, entries: &[([u8; 32], u32)], digest: &[u8; 32]) -> Option<&Identity> {
        self.find_index(entries, digest).and_then(|index| self.consumers.get(index as usize))
    }

    fn find_index(&self, entries: &[([u8; 32], u32)], digest: &[u8; 32]) -> Option<u32> {
        let mut found = NO_MATCH;
        for (entry, index) in entries {
            found.conditional_assign(index, entry.ct_eq(digest));
        }
        (found != NO_MATCH).then_some(found)
    }
}

/// The names a certificate carries that `client_cert_names` may match: the subject's common
/// names and the DNS and URI subject alternative names (a SPIFFE ID is a URI name), exactly as
/// written in the certificate. A certificate that does not parse carries none.
pub fn certificate_names(der: &[u8]) -> Vec<String> {
    let Ok((_, certificate)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let mut names: Vec<String> = certificate
        .subject()
        .iter_common_name()
        .filter_map(|common_name| common_name.as_str().ok())
        .map(str::to_owned)
        .collect();
    if let Ok(Some(alternative)) = certificate.subject_alternative_name() {
        for name in &alternative.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(dns) => names.push((*dns).to_owned()),
                x509_parser::extensions::GeneralName::URI(uri) => names.push((*uri).to_owned()),
                _ => {}
            }
        }
    }
    names
}

fn record_failure(failure: &AuthFailure) {
    let consumer = failure.consumer.as_ref().map_or(UNKNOWN_CONSUMER.to_owned(), ToString::to_string);
    let reason = failure.error.reason();
    metrics::counter!("chargeguard_authentication_failures_total", "consumer" => consumer.clone(), "reason" => reason)
        .increment(1);
    tracing::warn!(%consumer, reason, "call refused: not authenticated");
}

fn digest_of_hex(field: &'static str, hash: &str) -> Result<[u8; 32], crate::domain::InvalidField> {
    let mut digest = [0u8; 32];
    hex::decode_to_slice(hash, &mut digest).map_err(|_| crate::domain::InvalidField::new(field, "must be 64 hex digits"))?;
    Ok(digest)
}

/// The token of an `authorization: Bearer <token>` value.
pub fn bearer_token(header: &[u8]) -> Result<&[u8], AuthError> {
    if header.len() > AUTHORIZATION_BYTES_MAX {
        return Err(AuthError::Malformed);
    }
    let header = std::str::from_utf8(header).map_err(|_| AuthError::Malformed)?;
    let token = header
        .strip_prefix("Bearer ")
        .or_else(|| header.strip_prefix("bearer "))
        .ok_or(AuthError::Malformed)?
        .trim();
    if token.is_empty() || !token.bytes().all(|byte| byte.is_ascii_graphic()) {
        return Err(AuthError::Malformed);
    }
    Ok(token.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consumer(name: &str, tokens: &[&str], certificates: &[&[u8]]) -> ConsumerConfig {
        ConsumerConfig {
            name: name.into(),
            token_sha256: tokens.iter().map(|token| hash_token(token)).collect::<Vec<_>>().into(),
            client_cert_sha256: certificates.iter().map(|der| certificate_sha256(der)).collect::<Vec<_>>().into(),
            ..ConsumerConfig::default()
        }
    }

    fn who(authenticator: &Authenticator, token: Option<&str>, certificate: Option<&[u8]>) -> Result<String, &'static str> {
        let header = token.map(|token| format!("Bearer {token}"));
        let leaf = certificate.map(|der| CertificateDer::from(der.to_vec()));
        authenticator
            .identify(header.as_deref().map(str::as_bytes), leaf.as_ref())
            .map(|name| name.to_string())
            .map_err(|failure| failure.error.reason())
    }

    #[test]
    fn every_token_of_a_consumer_works_and_no_other() {
        let authenticator = Authenticator::from_config(&[
            consumer("orders", &["orders-old", "orders-new"], &[]),
            consumer("billing", &["billing"], &[]),
        ])
        .unwrap();
        assert_eq!(who(&authenticator, Some("orders-old"), None), Ok("orders".into()));
        assert_eq!(who(&authenticator, Some("orders-new"), None), Ok("orders".into()));
        assert_eq!(who(&authenticator, Some("billing"), None), Ok("billing".into()));
        assert_eq!(who(&authenticator, Some("orders-older"), None), Err("unknown_token"));
        assert_eq!(who(&authenticator, None, None), Err("missing"));
    }

    #[test]
    fn certificate_and_token_must_agree_when_both_are_configured() {
        let authenticator = Authenticator::from_config(&[
            consumer("orders", &["orders"], &[b"orders-cert"]),
            consumer("billing", &[], &[b"billing-cert"]),
            consumer("ledger", &["ledger"], &[]),
        ])
        .unwrap();
        assert_eq!(who(&authenticator, Some("orders"), Some(b"orders-cert")), Ok("orders".into()));
        assert_eq!(who(&authenticator, Some("orders"), None), Err("certificate_required"));
        assert_eq!(who(&authenticator, None, Some(b"orders-cert")), Err("token_required"));
        assert_eq!(who(&authenticator, None, Some(b"billing-cert")), Ok("billing".into()));
        assert_eq!(who(&authenticator, Some("orders"), Some(b"billing-cert")), Err("conflict"));
        assert_eq!(who(&authenticator, Some("ledger"), Some(b"billing-cert")), Err("conflict"));
        assert_eq!(who(&authenticator, Some("ledger"), Some(b"unlisted-cert")), Ok("ledger".into()));
        assert_eq!(who(&authenticator, None, Some(b"unlisted-cert")), Err("unknown_certificate"));
    }

    /// A self-signed certificate's DER with `common_name` and DNS `alternative_names`.
    fn named_certificate(common_name: &str, alternative_names: &[&str]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(alternative_names.iter().map(|name| (*name).to_owned()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, common_name);
        params.self_signed(&rcgen::KeyPair::generate().unwrap()).unwrap().der().to_vec()
    }

    #[test]
    fn a_certificate_name_identifies_its_consumer_and_a_certificate_naming_two_identifies_none() {
        let ledger = named_certificate("ledger-pod-7", &["ledger.internal"]);
        let renewed = named_certificate("ledger-pod-8", &["ledger.internal"]);
        let audit = named_certificate("audit", &["ledger.internal"]);
        assert_eq!(certificate_names(&ledger), ["ledger-pod-7", "ledger.internal"]);
        let authenticator = Authenticator::from_config(&[
            ConsumerConfig { name: "ledger".into(), client_cert_names: vec!["ledger.internal".into()], ..ConsumerConfig::default() },
            ConsumerConfig { name: "reports".into(), client_cert_names: vec!["reports".into()], token_sha256: hash_token("reports").into(), ..ConsumerConfig::default() },
            consumer("audit", &[], &[&audit]),
        ])
        .unwrap();
        assert_eq!(who(&authenticator, None, Some(&ledger)), Ok("ledger".into()));
        assert_eq!(who(&authenticator, None, Some(&renewed)), Ok("ledger".into()));
        assert_eq!(who(&authenticator, None, Some(&audit)), Err("ambiguous_certificate"));
        let reports = named_certificate("reports", &[]);
        assert_eq!(who(&authenticator, None, Some(&reports)), Err("token_required"));
        assert_eq!(who(&authenticator, Some("reports"), Some(&reports)), Ok("reports".into()));
        assert_eq!(who(&authenticator, Some("reports"), Some(&ledger)), Err("conflict"));
        assert_eq!(who(&authenticator, None, Some(&named_certificate("stranger", &["stranger.internal"]))), Err("unknown_certificate"));
        assert_eq!(who(&authenticator, None, Some(b"not a certificate")), Err("unknown_certificate"));
    }

    #[test]
    fn oversized_or_odd_authorization_is_malformed() {
        let authenticator = Authenticator::from_config(&[consumer("orders", &["orders"], &[])]).unwrap();
        let long = "x".repeat(AUTHORIZATION_BYTES_MAX);
        assert_eq!(who(&authenticator, Some(&long), None), Err("malformed"));
        for header in [&b"Bearer "[..], b"Basic abc", b"Bearer a\xffb", b"Bearer a b", b""] {
            let result = authenticator.identify(Some(header), None).map_err(|failure| failure.error.reason());
            assert_eq!(result.err(), Some("malformed"), "{header:?}");
        }
    }
}
