//! Where the servers are, who the caller is, and how long to wait.

use std::fmt;
use std::time::Duration;

use crate::backoff::Backoff;

/// How to reach chargeguard. `Debug` never prints the token or a private key.
#[derive(Clone)]
pub struct ClientConfig {
    /// `http://host:port` or `https://host:port`; more than one spreads the calls across the
    /// replicas (power of two choices by calls in flight).
    pub endpoints: Vec<String>,
    /// The consumer's bearer token, sent as `authorization: Bearer …`.
    pub token: Option<String>,
    /// TLS for `https://` endpoints; `None` trusts the web's roots (webpki-roots).
    pub tls: Option<TlsOptions>,
    pub connect_timeout: Duration,
    /// The deadline of each call, sent as `grpc-timeout` and enforced here.
    pub call_timeout: Duration,
    pub backoff: Backoff,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            endpoints: vec!["http://127.0.0.1:50051".to_owned()],
            token: None,
            tls: None,
            connect_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(10),
            backoff: Backoff::default(),
        }
    }
}

impl fmt::Debug for ClientConfig {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("ClientConfig")
            .field("endpoints", &self.endpoints)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("connect_timeout", &self.connect_timeout)
            .field("call_timeout", &self.call_timeout)
            .field("backoff", &self.backoff)
            .finish()
    }
}

/// TLS towards `https://` endpoints.
#[derive(Clone, Debug, Default)]
pub struct TlsOptions {
    /// The CA that signed the servers' certificates (PEM); `None` trusts the web's roots.
    pub ca_pem: Option<String>,
    /// A client certificate, for servers that authenticate consumers by certificate.
    pub identity: Option<TlsIdentity>,
    /// The name to verify the server's certificate against, when it is not the endpoint's host.
    pub domain_name: Option<String>,
}

/// A client certificate and its private key (PEM). `Debug` does not print the key.
#[derive(Clone)]
pub struct TlsIdentity {
    pub cert_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for TlsIdentity {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.debug_struct("TlsIdentity").field("cert_pem", &self.cert_pem).field("key_pem", &"<redacted>").finish()
    }
}

/// A configuration that cannot make a client. Found before any network call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("no endpoints: give at least one http:// or https:// endpoint")]
    NoEndpoints,
    #[error("endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    #[error("endpoint {endpoint:?} is plain http but TLS options are set: use https://")]
    TlsOnPlainEndpoint { endpoint: String },
    #[error("TLS options: {0}")]
    Tls(String),
    #[error("the token is not a valid header value (printable ASCII only)")]
    InvalidToken,
    #[error("{field} must be more than zero")]
    ZeroDuration { field: &'static str },
    #[error("backoff: {0}")]
    Backoff(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_prints_the_token_or_the_private_key() {
        let config = ClientConfig {
            token: Some("secret-token-value".to_owned()),
            tls: Some(TlsOptions {
                ca_pem: None,
                identity: Some(TlsIdentity { cert_pem: "CERT".to_owned(), key_pem: "secret-key-value".to_owned() }),
                domain_name: None,
            }),
            ..ClientConfig::default()
        };
        let printed = format!("{config:?} {config:#?}");
        assert!(!printed.contains("secret-token-value"), "{printed}");
        assert!(!printed.contains("secret-key-value"), "{printed}");
        assert!(printed.contains("<redacted>"), "{printed}");
    }

    #[test]
    fn the_defaults_are_the_documented_ones() {
        let config = ClientConfig::default();
        assert_eq!(config.connect_timeout, Duration::from_secs(5));
        assert_eq!(config.call_timeout, Duration::from_secs(10));
        assert_eq!(config.backoff.initial, Duration::from_millis(100));
        assert_eq!(config.backoff.max, Duration::from_secs(10));
        assert_eq!(config.backoff.multiplier, 2.0);
        assert_eq!(config.backoff.max_retries, 8);
    }
}
