//! The HTTP transport under async-stripe's request types: one pooled client for the process.
//!
//! async-stripe's own hyper client disables idle pooling, so every call to Stripe would pay a
//! TCP and TLS handshake (STACK.md, pitfall 4). async-stripe lets any type implementing
//! `StripeClient` send its requests; this one keeps connections alive, sends exactly one attempt
//! per call (never the crate's retrying strategies, whose keys are random), never follows
//! redirects, reads at most `provider.response_body_bytes_max` of an answer, and turns every
//! answer into the same `StripeError` values the crate's client produces — plus what that
//! client drops: whether the answer was a replay (`Idempotent-Replayed: true`), and a body over
//! the limit (`CallError`).

use std::fmt::Write as _;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use stripe::{RequestStrategy, StripeError};
use stripe_client_core::{CustomizedStripeRequest, StripeClient, StripeClientErr, StripeMethod};

use super::stripe::StripeProviderConfig;

const STRIPE_API_BASE: &str = "https://api.stripe.com/";
const USER_AGENT_VALUE: &str = concat!("chargeguard/", env!("CARGO_PKG_VERSION"), " (async-stripe)");
/// Kept shorter than the keep-alive of common load balancers (60 s), so that a request is not
/// written into a connection the other side is closing.
const IDLE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// The header Stripe sets (to `true`) on an answer replayed from its idempotency store.
const REPLAYED_HEADER: &str = "idempotent-replayed";

/// Why a call gave no usable answer.
#[derive(Debug)]
pub enum CallError {
    /// What async-stripe's own client would have returned. `replayed`: the answer carried
    /// `Idempotent-Replayed: true`, so the provider will give this key the same answer forever.
    Stripe { error: StripeError, replayed: bool },
    /// The answer's body was longer than `provider.response_body_bytes_max`; it was not read
    /// to the end, and whatever the request did at the provider is unknown.
    BodyTooLarge { bytes_max: usize },
}

impl From<StripeError> for CallError {
    fn from(error: StripeError) -> Self {
        Self::Stripe { error, replayed: false }
    }
}

impl StripeClientErr for CallError {
    fn deserialize_err(message: impl std::fmt::Display) -> Self {
        StripeError::JSONDeserialize(message.to_string()).into()
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Stripe { error, replayed: false } => write!(formatter, "{error}"),
            Self::Stripe { error, replayed: true } => write!(formatter, "{error} (replayed)"),
            Self::BodyTooLarge { bytes_max } => write!(
                formatter,
                "the answer's body is larger than provider.response_body_bytes_max ({bytes_max} bytes)"
            ),
        }
    }
}

/// Sends async-stripe requests over one connection pool.
#[derive(Clone)]
pub struct PooledStripeClient {
    http: reqwest::Client,
    api_base: String,
    authorization: HeaderValue,
    stripe_version: HeaderValue,
    call_timeout: Duration,
    response_body_bytes_max: usize,
}

impl std::fmt::Debug for PooledStripeClient {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The authorization header is deliberately left out.
        formatter.debug_struct("PooledStripeClient").field("api_base", &self.api_base).finish_non_exhaustive()
    }
}

impl PooledStripeClient {
    pub fn new(config: &StripeProviderConfig) -> Result<Self, StripeError> {
        let configured = config.base_url.clone().unwrap_or_else(|| STRIPE_API_BASE.to_owned());
        let parsed = reqwest::Url::parse(&configured)
            .map_err(|error| StripeError::ConfigError(format!("provider base URL: {error}")))?;
        if !parsed.path().ends_with('/') {
            return Err(StripeError::ConfigError("provider base URL must end with '/'".to_owned()));
        }
        // The parsed form: a bare `http://host:port` has the path `/`, which the string as
        // configured lacks (paths are appended to it).
        let api_base = parsed.to_string();
        let mut authorization = HeaderValue::try_from(format!("Bearer {}", config.api_key.expose()))
            .map_err(|_| StripeError::ConfigError("the API key is not a valid header value".to_owned()))?;
        authorization.set_sensitive(true);
        let http = reqwest::Client::builder()
            .http1_only()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(config.idle_connections_max)
            .pool_idle_timeout(IDLE_CONNECTION_TIMEOUT)
            .connect_timeout(config.call_timeout)
            // Stripe does not redirect; following one could re-send a create elsewhere.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(USER_AGENT_VALUE)
            .build()
            .map_err(|error| StripeError::ConfigError(format!("HTTP client: {error}")))?;
        Ok(Self {
            http,
            api_base,
            authorization,
            stripe_version: HeaderValue::from_static(stripe_client_core::VERSION.as_str()),
            call_timeout: config.call_timeout,
            response_body_bytes_max: config.response_body_bytes_max,
        })
    }

    async fn send_once(&self, request: reqwest::RequestBuilder) -> Result<Bytes, CallError> {
        let response = request.send().await.map_err(transport_error)?;
        let status = response.status();
        let replayed = response
            .headers()
            .get(REPLAYED_HEADER)
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"true"));
        let body = read_body_bounded(response, self.response_body_bytes_max).await?;
        if status.is_success() {
            return Ok(body);
        }
        // The same reading as async-stripe's client: a Stripe error body keeps its status; an
        // answer that is not one (a proxy's HTML 502) cannot be told apart from an unknown outcome.
        let error = std::str::from_utf8(&body)
            .ok()
            .and_then(|text| miniserde::json::from_str::<stripe_shared::Error>(text).ok())
            .map(|parsed| StripeError::Stripe(parsed.error, status.as_u16()))
            .unwrap_or_else(|| StripeError::JSONDeserialize(format!("error answer with status {status} was not Stripe's")));
        Err(CallError::Stripe { error, replayed })
    }
}

/// The body, or `BodyTooLarge` as soon as it is known to exceed `bytes_max` (from
/// `Content-Length`, else while reading): an answer never costs more memory than the limit.
async fn read_body_bounded(mut response: reqwest::Response, bytes_max: usize) -> Result<Bytes, CallError> {
    let too_large = CallError::BodyTooLarge { bytes_max };
    if response.content_length().is_some_and(|length| length > bytes_max as u64) {
        return Err(too_large);
    }
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut length: usize = 0;
    while let Some(chunk) = response.chunk().await.map_err(transport_error)? {
        length = length.saturating_add(chunk.len());
        if length > bytes_max {
            return Err(too_large);
        }
        chunks.push(chunk);
    }
    // Most answers arrive in one chunk: no copy then.
    if chunks.len() == 1 {
        return Ok(chunks.swap_remove(0));
    }
    let mut body = BytesMut::with_capacity(length);
    for chunk in chunks {
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

impl StripeClient for PooledStripeClient {
    type Err = CallError;

    async fn execute(&self, request: CustomizedStripeRequest) -> Result<Bytes, CallError> {
        let (request, overrides) = request.into_pieces();
        if overrides.account_id.is_some() {
            return Err(StripeError::ConfigError("connected accounts are not supported".to_owned()).into());
        }
        let idempotency_key = match overrides.request_strategy.unwrap_or(RequestStrategy::Once) {
            RequestStrategy::Once => None,
            RequestStrategy::Idempotent(key) => Some(key),
            // Their retries carry keys the crate makes up; chargeguard retries with stored keys.
            other => {
                return Err(StripeError::ConfigError(format!("request strategy {other:?} is not allowed")).into());
            }
        };
        let mut url = format!("{}v1{}", self.api_base, request.path);
        if let Some(query) = &request.query {
            let _ = write!(url, "?{query}");
        }
        let method = match request.method {
            StripeMethod::Get => reqwest::Method::GET,
            StripeMethod::Post => reqwest::Method::POST,
            StripeMethod::Delete => reqwest::Method::DELETE,
        };
        let mut builder = self
            .http
            .request(method, url)
            .header(AUTHORIZATION, self.authorization.clone())
            .header("stripe-version", self.stripe_version.clone());
        if let Some(key) = &idempotency_key {
            builder = builder.header("idempotency-key", key.as_str());
        }
        if let Some(body) = request.body {
            builder = builder.header(CONTENT_TYPE, "application/x-www-form-urlencoded").body(body);
        }
        let timeout = overrides.timeout.unwrap_or(self.call_timeout);
        match tokio::time::timeout(timeout, self.send_once(builder)).await {
            Ok(answer) => answer,
            Err(_) => Err(StripeError::Timeout.into()),
        }
    }
}

fn transport_error(error: reqwest::Error) -> StripeError {
    if error.is_timeout() {
        return StripeError::Timeout;
    }
    // Without the URL: it can carry query parameters, and the message goes to logs.
    StripeError::ClientError(error.without_url().to_string())
}

#[cfg(test)]
mod tests {
    use stripe::StripeRequest as _;
    use stripe_core::payment_intent::RetrievePaymentIntent;

    use super::*;
    use crate::secret::Secret;

    fn config(base_url: &str) -> StripeProviderConfig {
        StripeProviderConfig {
            api_key: Secret::new("sk_test_never_printed"),
            base_url: Some(base_url.to_owned()),
            call_timeout: Duration::from_millis(200),
            idle_connections_max: 4,
            response_body_bytes_max: 4 * 1024 * 1024,
        }
    }

    #[test]
    fn a_base_url_without_a_trailing_slash_is_refused() {
        let error = PooledStripeClient::new(&config("http://127.0.0.1:9/v")).unwrap_err();
        assert!(matches!(error, StripeError::ConfigError(message) if message.contains("end with '/'")));
    }

    #[test]
    fn a_base_url_of_a_bare_host_gets_its_root_path() {
        let client = PooledStripeClient::new(&config("http://127.0.0.1:9")).unwrap();
        assert_eq!(client.api_base, "http://127.0.0.1:9/");
    }

    #[test]
    fn debug_output_leaves_the_api_key_out() {
        let client = PooledStripeClient::new(&config("http://127.0.0.1:9/")).unwrap();
        assert!(!format!("{client:?}").contains("never_printed"));
    }

    #[tokio::test]
    async fn retrying_strategies_are_refused_before_anything_is_sent() {
        // Port 9 (discard) is closed here: a request that went out would fail as ClientError.
        let client = PooledStripeClient::new(&config("http://127.0.0.1:9/")).unwrap();
        for strategy in [RequestStrategy::Retry(3), RequestStrategy::ExponentialBackoff(3)] {
            let error = RetrievePaymentIntent::new("pi_1")
                .customize()
                .request_strategy(strategy)
                .send(&client)
                .await
                .unwrap_err();
            assert!(
                matches!(error, CallError::Stripe { error: StripeError::ConfigError(message), .. } if message.contains("not allowed"))
            );
        }
    }

    #[tokio::test]
    async fn nothing_listening_is_a_client_error_not_a_stripe_answer() {
        let client = PooledStripeClient::new(&config("http://127.0.0.1:9/")).unwrap();
        let error = RetrievePaymentIntent::new("pi_1").send(&client).await.unwrap_err();
        assert!(
            matches!(
                error,
                CallError::Stripe { error: StripeError::ClientError(_) | StripeError::Timeout, replayed: false }
            ),
            "{error:?}"
        );
    }

    /// Serves one HTTP/1.1 answer whose body comes in `chunks` (chunked encoding, so no
    /// `Content-Length` announces its size) and returns its URL.
    async fn chunked_server(chunks: &'static [&'static str]) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = [0_u8; 1024];
            let _ = stream.read(&mut request).await.unwrap();
            let mut answer = String::from("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n");
            for chunk in chunks {
                answer.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
            }
            answer.push_str("0\r\n\r\n");
            stream.write_all(answer.as_bytes()).await.unwrap();
            stream.flush().await.unwrap();
        });
        url
    }

    #[tokio::test]
    async fn a_body_is_read_whole_up_to_the_limit_and_refused_past_it() {
        const CHUNKS: &[&str] = &["0123456789", "abcdefghij"];
        let within = reqwest::get(chunked_server(CHUNKS).await).await.unwrap();
        assert_eq!(read_body_bounded(within, 20).await.unwrap(), Bytes::from_static(b"0123456789abcdefghij"));

        let past = reqwest::get(chunked_server(CHUNKS).await).await.unwrap();
        assert!(past.content_length().is_none(), "the size is only known while reading");
        let error = read_body_bounded(past, 19).await.unwrap_err();
        assert!(matches!(error, CallError::BodyTooLarge { bytes_max: 19 }), "{error:?}");
        assert!(error.to_string().contains("provider.response_body_bytes_max (19 bytes)"), "{error}");
    }
}
