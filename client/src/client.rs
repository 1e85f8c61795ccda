//! The calls: one call classified, or repeated while the answer is "retry later".

use std::future::Future;
use std::time::Duration;

use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Response, Status};

use crate::answer::Answer;
use crate::backoff::Backoff;
use crate::classify::classify;
use crate::config::{ClientConfig, ConfigError, TlsOptions};
use crate::proto::payments_client::PaymentsClient;
use crate::proto::{
    ChargeRequest, ChargeResponse, GetAttemptRequest, GetAttemptResponse, ListAttemptsRequest, ListAttemptsResponse,
    RefundRequest, RefundResponse,
};

/// A chargeguard client. Cheap to clone: clones share the connections.
#[derive(Clone)]
pub struct Client {
    payments: PaymentsClient<Channel>,
    authorization: Option<AsciiMetadataValue>,
    call_timeout: Duration,
    backoff: Backoff,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Client").field("call_timeout", &self.call_timeout).finish_non_exhaustive()
    }
}

impl Client {
    /// Checks the configuration and makes a client without touching the network: connections
    /// are opened by the first call (and reopened after a failure). Call it inside a Tokio
    /// runtime (the connections' tasks are spawned on it).
    pub fn connect_lazy(config: ClientConfig) -> Result<Client, ConfigError> {
        if config.endpoints.is_empty() {
            return Err(ConfigError::NoEndpoints);
        }
        if config.connect_timeout.is_zero() {
            return Err(ConfigError::ZeroDuration { field: "connect_timeout" });
        }
        if config.call_timeout.is_zero() {
            return Err(ConfigError::ZeroDuration { field: "call_timeout" });
        }
        check_backoff(&config.backoff)?;
        let authorization = match &config.token {
            Some(token) => {
                let mut value: AsciiMetadataValue =
                    MetadataValue::try_from(format!("Bearer {token}")).map_err(|_| ConfigError::InvalidToken)?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let endpoints = config
            .endpoints
            .iter()
            .map(|endpoint| endpoint_of(endpoint, &config))
            .collect::<Result<Vec<_>, _>>()?;
        let channel = match <[Endpoint; 1]>::try_from(endpoints) {
            Ok([endpoint]) => endpoint.connect_lazy(),
            Err(endpoints) => Channel::balance_list(endpoints.into_iter()),
        };
        Ok(Client { payments: PaymentsClient::new(channel), authorization, call_timeout: config.call_timeout, backoff: config.backoff })
    }

    /// Charges once per operation: one call, classified.
    pub async fn charge(&self, request: ChargeRequest) -> Answer<ChargeResponse> {
        self.call(request, |mut payments, request| async move { payments.charge(request).await }).await
    }

    /// Refunds once per refund operation: one call, classified.
    pub async fn refund(&self, request: RefundRequest) -> Answer<RefundResponse> {
        self.call(request, |mut payments, request| async move { payments.refund(request).await }).await
    }

    pub async fn get_attempt(&self, request: GetAttemptRequest) -> Answer<GetAttemptResponse> {
        self.call(request, |mut payments, request| async move { payments.get_attempt(request).await }).await
    }

    pub async fn list_attempts(&self, request: ListAttemptsRequest) -> Answer<ListAttemptsResponse> {
        self.call(request, |mut payments, request| async move { payments.list_attempts(request).await }).await
    }

    /// [`Client::charge`], repeated while the answer is [`Answer::RetryLater`], at most
    /// `backoff.max_retries` times, waiting the backoff's jittered delay or the server's hint,
    /// whichever is longer; then the last `RetryLater` is returned (the attempt is not lost:
    /// the server's sweep completes it, and a later call reads the outcome).
    pub async fn charge_until_decided(&self, request: ChargeRequest) -> Answer<ChargeResponse> {
        until_decided(&self.backoff, || self.charge(request.clone())).await
    }

    /// [`Client::refund`], repeated like [`Client::charge_until_decided`].
    pub async fn refund_until_decided(&self, request: RefundRequest) -> Answer<RefundResponse> {
        until_decided(&self.backoff, || self.refund(request.clone())).await
    }

    async fn call<Req, Resp, F, Fut>(&self, message: Req, send: F) -> Answer<Resp>
    where
        F: FnOnce(PaymentsClient<Channel>, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let mut request = Request::new(message);
        request.set_timeout(self.call_timeout);
        if let Some(authorization) = &self.authorization {
            request.metadata_mut().insert("authorization", authorization.clone());
        }
        match send(self.payments.clone(), request).await {
            Ok(response) => Answer::Done(response.into_inner()),
            Err(status) => classify(&status).into(),
        }
    }
}

/// Calls while the answer is `RetryLater`, at most `backoff.max_retries` times after the first,
/// each time waiting the jittered backoff or the server's hint, whichever is longer.
async fn until_decided<T, F, Fut>(backoff: &Backoff, mut call: F) -> Answer<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Answer<T>>,
{
    let mut retry = 0;
    loop {
        let answer = call().await;
        let Answer::RetryLater(later) = &answer else {
            return answer;
        };
        if retry >= backoff.max_retries {
            return answer;
        }
        let wait = backoff.delay(retry, &mut rand::thread_rng()).max(later.after);
        tokio::time::sleep(wait).await;
        retry += 1;
    }
}

fn check_backoff(backoff: &Backoff) -> Result<(), ConfigError> {
    if !(backoff.multiplier.is_finite() && backoff.multiplier >= 1.0) {
        return Err(ConfigError::Backoff(format!("multiplier {} must be a finite number ≥ 1", backoff.multiplier)));
    }
    if backoff.initial > backoff.max {
        return Err(ConfigError::Backoff(format!("initial {:?} is over max {:?}", backoff.initial, backoff.max)));
    }
    Ok(())
}

fn endpoint_of(address: &str, config: &ClientConfig) -> Result<Endpoint, ConfigError> {
    let invalid = |reason: String| ConfigError::InvalidEndpoint { endpoint: address.to_owned(), reason };
    let endpoint = Endpoint::from_shared(address.to_owned())
        .map_err(|error| invalid(error.to_string()))?
        .connect_timeout(config.connect_timeout)
        .timeout(config.call_timeout);
    match endpoint.uri().scheme_str() {
        Some("https") => endpoint.tls_config(tls_config(config.tls.as_ref())?).map_err(|error| ConfigError::Tls(error.to_string())),
        Some("http") if config.tls.is_some() => Err(ConfigError::TlsOnPlainEndpoint { endpoint: address.to_owned() }),
        Some("http") => Ok(endpoint),
        _ => Err(invalid("the scheme must be http:// or https://".to_owned())),
    }
}

fn tls_config(options: Option<&TlsOptions>) -> Result<ClientTlsConfig, ConfigError> {
    let Some(options) = options else {
        return Ok(ClientTlsConfig::new().with_webpki_roots());
    };
    let mut tls = match &options.ca_pem {
        Some(ca_pem) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem)),
        None => ClientTlsConfig::new().with_webpki_roots(),
    };
    if let Some(identity) = &options.identity {
        tls = tls.identity(Identity::from_pem(&identity.cert_pem, &identity.key_pem));
    }
    if let Some(domain_name) = &options.domain_name {
        tls = tls.domain_name(domain_name.clone());
    }
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Instant;

    use super::*;
    use crate::answer::{Rejection, RetryClass, RetryLater};

    fn later(after: Duration) -> Answer<&'static str> {
        Answer::RetryLater(RetryLater { after, class: RetryClass::Unavailable, code: "unavailable".to_owned(), message: String::new() })
    }

    fn quick(max_retries: u32) -> Backoff {
        Backoff { initial: Duration::from_millis(1), max: Duration::from_millis(2), multiplier: 2.0, max_retries }
    }

    #[tokio::test]
    async fn retries_stop_at_max_retries_with_the_last_retry_later() {
        let calls = AtomicU32::new(0);
        let answer = until_decided(&quick(3), || {
            calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(later(Duration::ZERO))
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 4, "the first call and three retries");
        assert_eq!(answer, later(Duration::ZERO));
    }

    #[tokio::test]
    async fn done_or_reject_ends_the_retries_at_once() {
        let calls = AtomicU32::new(0);
        let answer = until_decided(&quick(8), || {
            let call = calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(if call < 2 { later(Duration::ZERO) } else { Answer::Done("charged") })
        })
        .await;
        assert_eq!((answer, calls.load(Ordering::SeqCst)), (Answer::Done("charged"), 3));

        let rejection = Rejection { grpc_code: tonic::Code::InvalidArgument, code: "invalid_argument".to_owned(), message: String::new(), attempt_id: None };
        let calls = AtomicU32::new(0);
        let answer = until_decided(&quick(8), || {
            calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Answer::<&str>::Reject(rejection.clone()))
        })
        .await;
        assert_eq!((answer, calls.load(Ordering::SeqCst)), (Answer::Reject(rejection), 1));
    }

    #[tokio::test]
    async fn the_servers_hint_is_waited_when_longer_than_the_backoff() {
        let started = Instant::now();
        let answer = until_decided(&quick(2), || std::future::ready(later(Duration::from_millis(40)))).await;
        assert_eq!(answer, later(Duration::from_millis(40)));
        assert!(started.elapsed() >= Duration::from_millis(80), "two waits of the hint: {:?}", started.elapsed());
    }

    #[tokio::test]
    async fn a_configuration_that_cannot_work_is_refused_before_any_call() {
        let refused = |config: ClientConfig| Client::connect_lazy(config).expect_err("refused");
        assert!(matches!(refused(ClientConfig { endpoints: vec![], ..ClientConfig::default() }), ConfigError::NoEndpoints));
        assert!(matches!(
            refused(ClientConfig { endpoints: vec!["127.0.0.1:50051".to_owned()], ..ClientConfig::default() }),
            ConfigError::InvalidEndpoint { .. }
        ));
        assert!(matches!(
            refused(ClientConfig { tls: Some(TlsOptions::default()), ..ClientConfig::default() }),
            ConfigError::TlsOnPlainEndpoint { .. }
        ));
        assert!(matches!(refused(ClientConfig { token: Some("line\nbreak".to_owned()), ..ClientConfig::default() }), ConfigError::InvalidToken));
        assert!(matches!(refused(ClientConfig { call_timeout: Duration::ZERO, ..ClientConfig::default() }), ConfigError::ZeroDuration { .. }));
        let backoff = Backoff { multiplier: 0.5, ..Backoff::default() };
        assert!(matches!(refused(ClientConfig { backoff, ..ClientConfig::default() }), ConfigError::Backoff(_)));
        let two = ClientConfig { endpoints: vec!["http://127.0.0.1:1".to_owned(), "https://example.com".to_owned()], ..ClientConfig::default() };
        Client::connect_lazy(two).expect("http and https endpoints together");
    }
}
