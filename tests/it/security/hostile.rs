//! What a hostile or broken client sends gets a clear answer, never INTERNAL, UNKNOWN or a 5xx:
//! random and bit-flipped Charge messages, odd authorization metadata, malformed webhook
//! requests, and a webhook whose body or headers never arrive (cut off in bounded time). Afterwards the
//! server still serves.

use std::time::{Duration, Instant};

use bytes::{Buf, BufMut};
use chargeguard::secret::Secret;
use chargeguard::webhook::signature::sign;
use prost::Message;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Code, Status};

use crate::support::{ORDERS_TOKEN, TestApp, charge_request, error_code};

const RANDOM_MESSAGES: usize = 1_500;
const FLIPPED_MESSAGES: usize = 1_500;
const WEBHOOK_REQUESTS: usize = 500;
const CALLS_IN_FLIGHT: usize = 16;
const WEBHOOK_SECRET: &str = "whsec_hostile_input_test";
const HTTP_REQUEST_TIMEOUT_MS: u64 = 1_000;

/// Sends and receives message bytes as they are: the test decides what goes on the wire.
#[derive(Clone, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

async fn raw_charge(channel: tonic::transport::Channel, authorization: &str, message: Vec<u8>) -> Result<Vec<u8>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|error| Status::unavailable(error.to_string()))?;
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", authorization.parse().unwrap());
    let path = http::uri::PathAndQuery::from_static("/chargeguard.v1.Payments/Charge");
    grpc.unary(request, path, RawCodec).await.map(tonic::Response::into_inner)
}

/// A Charge that a bit flip may turn into anything: valid, invalid or undecodable.
fn flipped(rng: &mut impl Rng, index: usize) -> Vec<u8> {
    let mut bytes = charge_request(&format!("hostile-{index}")).encode_to_vec();
    for _ in 0..rng.gen_range(1..=3) {
        let bit = rng.gen_range(0..bytes.len() * 8);
        bytes[bit / 8] ^= 1 << (bit % 8);
    }
    bytes
}

fn random(rng: &mut impl Rng) -> Vec<u8> {
    let length = rng.gen_range(0..=256);
    (0..length).map(|_| rng.r#gen::<u8>()).collect()
}

#[tokio::test]
async fn random_and_bit_flipped_messages_and_malformed_webhooks_get_clear_answers_and_the_server_keeps_serving() {
    let app = TestApp::spawn_with(|config| {
        config.webhooks.secrets = vec![Secret::new(WEBHOOK_SECRET)];
        config.server.http_request_timeout_ms = HTTP_REQUEST_TIMEOUT_MS;
        for consumer in &mut config.consumers {
            consumer.requests_per_second_max = 100_000;
            consumer.burst_max = 100_000;
        }
    })
    .await;
    let channel = crate::support::health::channel(app.grpc_addr).await.unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(18);
    let mut messages: Vec<(String, Vec<u8>)> = Vec::new();
    let bearer = format!("Bearer {ORDERS_TOKEN}");
    messages.extend((0..RANDOM_MESSAGES).map(|_| (bearer.clone(), random(&mut rng))));
    messages.extend((0..FLIPPED_MESSAGES).map(|index| (bearer.clone(), flipped(&mut rng, index))));
    // Authorization metadata that is too long or not a bearer token, on a valid message.
    let valid = charge_request("hostile-authorization").encode_to_vec();
    // 40 KiB is over hyper's default header limit (16 KiB), under server.grpc_metadata_bytes_max.
    for authorization in ["Bearer ".to_owned() + &"t".repeat(4_096), "Bearer ".to_owned() + &"u".repeat(40_000), "Basic b3JkZXJzOg==".to_owned(), "Bearer".to_owned(), "Bearer \t".to_owned()] {
        messages.push((authorization, valid.clone()));
    }

    let started = Instant::now();
    let mut codes = std::collections::BTreeMap::<String, usize>::new();
    let mut answers = futures::stream::iter(messages.into_iter().map(|(authorization, message)| {
        let channel = channel.clone();
        async move { raw_charge(channel, &authorization, message).await }
    }))
    .buffer_unordered(CALLS_IN_FLIGHT);
    use futures::StreamExt;
    while let Some(answer) = answers.next().await {
        let key = match &answer {
            Ok(_) => "OK".to_owned(),
            Err(status) => {
                // UNAVAILABLE is a clear answer only with chargeguard's code (outcome unknown);
                // without one it is a connection that died.
                let ours = !error_code(status).is_empty();
                assert!(
                    !matches!(status.code(), Code::Internal | Code::Unknown) && (ours || status.code() != Code::Unavailable),
                    "a hostile message got {status:?}"
                );
                format!("{:?}/{}", status.code(), error_code(status))
            }
        };
        *codes.entry(key).or_default() += 1;
    }
    println!("{} gRPC messages in {:?}: {codes:?}", RANDOM_MESSAGES + FLIPPED_MESSAGES + 5, started.elapsed());
    assert!(codes.keys().any(|code| code.contains("undecodable_request")), "some messages did not decode: {codes:?}");
    assert!(codes.keys().any(|code| code.starts_with("Unauthenticated")), "{codes:?}");
    // Beyond server.grpc_metadata_bytes_max HTTP/2 refuses the headers before any service sees
    // them (431 for the stream, or GOAWAY for a flood of CONTINUATION frames): that connection
    // is refused, nothing is charged, and the server goes on serving everyone else (below).
    let flood = crate::support::health::channel(app.grpc_addr).await.unwrap();
    let beyond = raw_charge(flood, &("Bearer ".to_owned() + &"w".repeat(200_000)), charge_request("hostile-flood").encode_to_vec()).await;
    assert!(beyond.is_err(), "200 KB of metadata is refused: {beyond:?}");

    // Webhooks: random bodies, random or missing signatures, and signed bodies that are not
    // events; each answered 4xx.
    let http = reqwest::Client::new();
    let url = format!("http://{}/webhooks/stripe", app.http_addr);
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let now = chrono::Utc::now().timestamp();
    for index in 0..WEBHOOK_REQUESTS {
        let body = match index % 3 {
            0 => random(&mut rng),
            1 => format!("{{\"id\":\"evt_{index}\",\"type\":\"payment_intent.succeeded\",\"data\":{{\"object\":{}}}}}", rng.r#gen::<u32>()).into_bytes(),
            _ => flipped(&mut rng, index),
        };
        let signature = match index % 4 {
            0 => None,
            1 => Some(String::from_utf8_lossy(&random(&mut rng)).chars().filter(|c| c.is_ascii_graphic()).collect::<String>()),
            2 => Some(format!("t={now},v1={}", "0".repeat(64))),
            _ => Some(sign(&Secret::new(WEBHOOK_SECRET), now, &body)),
        };
        let mut request = http.post(&url).body(body);
        if let Some(signature) = signature {
            request = request.header("Stripe-Signature", signature);
        }
        let status = request.send().await.expect("the webhook endpoint answers").status().as_u16();
        assert!((400..500).contains(&status), "a malformed webhook got {status}");
        *statuses.entry(status).or_default() += 1;
    }
    println!("{WEBHOOK_REQUESTS} malformed webhook requests: {statuses:?}");

    // A webhook whose body never arrives is cut off.
    let mut slow = tokio::net::TcpStream::connect(app.http_addr).await.unwrap();
    let head = format!("POST /webhooks/stripe HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nStripe-Signature: t=1,v1=00\r\nContent-Length: 10000\r\n\r\n{{\"id\":", app.http_addr);
    slow.write_all(head.as_bytes()).await.unwrap();
    let sent = Instant::now();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut answer)).await;
    let waited = sent.elapsed();
    assert!(read.is_ok(), "the connection of a body that never arrives was not cut off within 10 s");
    let answer = String::from_utf8_lossy(&answer);
    println!("a webhook body that never arrives: cut off after {waited:?}: {:?}", answer.lines().next());
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(waited >= Duration::from_millis(HTTP_REQUEST_TIMEOUT_MS - 100), "{waited:?}");

    // Headers that never end (a byte now and then would do the same) are cut off too.
    let mut slow_headers = tokio::net::TcpStream::connect(app.http_addr).await.unwrap();
    slow_headers.write_all(b"POST /webhooks/stripe HTTP/1.1\r\nHost: chargeguard\r\nStripe-Sig").await.unwrap();
    let sent = Instant::now();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), slow_headers.read_to_end(&mut answer)).await;
    let waited = sent.elapsed();
    assert!(read.is_ok(), "a connection whose headers never end was not cut off within 10 s");
    println!("headers that never end: connection closed after {waited:?}: {:?}", String::from_utf8_lossy(&answer).lines().next());
    assert!(waited >= Duration::from_millis(HTTP_REQUEST_TIMEOUT_MS - 100), "{waited:?}");

    // Still serving.
    app.charge(charge_request("hostile-after")).await.expect("the server still serves charges");
    let health = reqwest::get(format!("http://{}/healthz", app.http_addr)).await.unwrap();
    assert_eq!(health.status(), 200);
}
