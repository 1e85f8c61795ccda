//! gRPC health checks of a running server: one check, or waiting until it serves.

use std::net::SocketAddr;
use std::time::Duration;

use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// The service whose health says whether charges can be served (the database is reachable).
pub const PAYMENTS_SERVICE: &str = chargeguard::grpc::proto::payments_server::SERVICE_NAME;
/// Bound on waiting for a started server to report SERVING.
const SERVING_POLLS_MAX: u32 = 200;
const SERVING_POLL_INTERVAL: Duration = Duration::from_millis(25);

/// A plaintext gRPC channel (the health and reflection clients come without `connect`).
pub async fn channel(
    addr: SocketAddr,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("valid URL")
        .connect()
        .await
}

/// One health check; `None` when the server does not answer (yet).
pub async fn health(addr: SocketAddr, service: &str) -> Option<ServingStatus> {
    let mut client = HealthClient::new(channel(addr).await.ok()?);
    let response = client
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .ok()?;
    ServingStatus::try_from(response.into_inner().status).ok()
}

/// Waits until the Payments service reports SERVING: it starts NOT_SERVING and turns SERVING
/// after its first database check.
pub async fn wait_until_serving(addr: SocketAddr) {
    for _ in 0..SERVING_POLLS_MAX {
        if health(addr, PAYMENTS_SERVICE).await == Some(ServingStatus::Serving) {
            return;
        }
        tokio::time::sleep(SERVING_POLL_INTERVAL).await;
    }
    panic!("the service at {addr} never reported SERVING");
}
