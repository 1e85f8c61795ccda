//! How long each gRPC call takes inside the service: `chargeguard_grpc_request_seconds`, by
//! method and gRPC status code, from the moment the call reaches the service's layers until its
//! response is ready. The load generator sees the same call plus the network, HTTP/2 and its own
//! scheduling; this histogram is the server's side of a p99, where an operator can read it.
//!
//! The method label is bounded: a path that is not one of the service's own methods (or the
//! health check's) is recorded as `other`, so a caller cannot grow the metric's label set.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use prost::Message;
use tonic::body::Body;

/// The `method` label of a path that names none of the service's methods.
const OTHER_METHOD: &str = "other";

/// The health service's methods, which are not in chargeguard's descriptor set.
const HEALTH_METHODS: [&str; 2] = ["grpc.health.v1.Health/Check", "grpc.health.v1.Health/Watch"];

/// The layer for `Server::builder().layer(…)`.
#[derive(Clone)]
pub struct RequestDurationLayer {
    methods: Arc<HashMap<String, metrics::SharedString>>,
}

impl RequestDurationLayer {
    /// Knows the methods of the services in `descriptor_set` (an encoded `FileDescriptorSet`,
    /// the one reflection serves) and the health check's.
    pub fn new(descriptor_set: &[u8]) -> Self {
        let mut methods: Vec<String> = HEALTH_METHODS
            .iter()
            .map(|method| (*method).to_owned())
            .collect();
        // The descriptor set is compiled into the binary; one that does not decode leaves only
        // the health methods named, every other call recorded as `other`.
        if let Ok(set) = prost_types::FileDescriptorSet::decode(descriptor_set) {
            for file in &set.file {
                let package = file.package();
                for service in &file.service {
                    for method in &service.method {
                        methods.push(format!("{package}.{}/{}", service.name(), method.name()));
                    }
                }
            }
        }
        let methods = methods
            .into_iter()
            .map(|method| {
                (
                    format!("/{method}"),
                    metrics::SharedString::from(Arc::<str>::from(method)),
                )
            })
            .collect();
        Self {
            methods: Arc::new(methods),
        }
    }

    fn method_label(&self, path: &str) -> metrics::SharedString {
        self.methods
            .get(path)
            .cloned()
            .unwrap_or(metrics::SharedString::const_str(OTHER_METHOD))
    }
}

impl<S> tower::Layer<S> for RequestDurationLayer {
    type Service = RequestDurationService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestDurationService {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RequestDurationService<S> {
    inner: S,
    layer: RequestDurationLayer,
}

impl<S, B> tower::Service<http::Request<B>> for RequestDurationService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = self.layer.method_label(request.uri().path());
        let started = Instant::now();
        // The inner service is called here, on the service that was polled ready; only its
        // future moves into the timing.
        let call = self.inner.call(request);
        Box::pin(async move {
            let response = call.await;
            let code = match &response {
                Ok(response) => status_code(response),
                Err(_) => "transport_error",
            };
            metrics::histogram!("chargeguard_grpc_request_seconds", "method" => method, "code" => code)
                .record(started.elapsed().as_secs_f64());
            response
        })
    }
}

/// The call's gRPC status as its response headers carry it. tonic answers an error of a unary
/// call trailers-only (the status in the headers); a response whose headers carry none is a
/// unary call that succeeded (its `grpc-status: 0` follows in the trailers) or a stream that
/// started, whose time here is the time to its first message.
fn status_code(response: &http::Response<Body>) -> &'static str {
    let Some(value) = response.headers().get("grpc-status") else {
        return "ok";
    };
    let code = value
        .to_str()
        .ok()
        .and_then(|text| text.parse::<i32>().ok())
        .unwrap_or(-1);
    super::code_name(tonic::Code::from_i32(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_methods_are_named_and_any_other_path_is_other() {
        let layer = RequestDurationLayer::new(crate::grpc::proto::FILE_DESCRIPTOR_SET);
        assert_eq!(
            &*layer.method_label("/chargeguard.v1.Payments/Charge"),
            "chargeguard.v1.Payments/Charge"
        );
        assert_eq!(
            &*layer.method_label("/grpc.health.v1.Health/Check"),
            "grpc.health.v1.Health/Check"
        );
        assert_eq!(
            &*layer.method_label("/chargeguard.v1.Payments/NoSuchMethod"),
            OTHER_METHOD
        );
        assert_eq!(&*layer.method_label("/"), OTHER_METHOD);
    }

    #[test]
    fn a_status_in_the_headers_is_the_calls_code_and_none_is_ok() {
        let with_status = |value: &str| {
            let mut response = http::Response::new(Body::empty());
            response
                .headers_mut()
                .insert("grpc-status", value.parse().unwrap());
            response
        };
        assert_eq!(status_code(&with_status("14")), "unavailable");
        assert_eq!(status_code(&with_status("3")), "invalid_argument");
        assert_eq!(status_code(&with_status("0")), "ok");
        assert_eq!(status_code(&with_status("garbage")), "unknown");
        assert_eq!(status_code(&http::Response::new(Body::empty())), "ok");
    }
}
