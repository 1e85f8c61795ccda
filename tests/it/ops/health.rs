//! gRPC health and server reflection, as grpcurl and Kubernetes probes use them.

use chargeguard::startup::LIVENESS_SERVICE;
use prost::Message;
use tokio_stream::StreamExt;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};

use super::process::free_addr;
use crate::support::health::{channel, health};
use crate::support::TestApp;

const PAYMENTS: &str = "chargeguard.v1.Payments";
const REPORTS: &str = "chargeguard.v1.Reports";

async fn reflect(app: &TestApp, request: MessageRequest) -> MessageResponse {
    let mut client = ServerReflectionClient::new(channel(app.grpc_addr).await.unwrap());
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let mut responses = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let response: ServerReflectionResponse = responses.next().await.expect("one answer").unwrap();
    response.message_response.expect("an answer body")
}

#[tokio::test]
async fn reflection_lists_and_describes_the_payments_service() {
    let app = TestApp::spawn().await;
    let MessageResponse::ListServicesResponse(list) =
        reflect(&app, MessageRequest::ListServices(String::new())).await
    else {
        panic!("expected a service list");
    };
    let names: Vec<&str> = list
        .service
        .iter()
        .map(|service| service.name.as_str())
        .collect();
    assert!(names.contains(&PAYMENTS), "{names:?}");
    assert!(names.contains(&"grpc.health.v1.Health"), "{names:?}");

    // `grpcurl describe chargeguard.v1.Payments` asks for the file that defines the symbol.
    let MessageResponse::FileDescriptorResponse(files) = reflect(
        &app,
        MessageRequest::FileContainingSymbol(PAYMENTS.to_owned()),
    )
    .await
    else {
        panic!("expected file descriptors");
    };
    let methods: Vec<String> = files
        .file_descriptor_proto
        .iter()
        .map(|bytes| prost_types::FileDescriptorProto::decode(bytes.as_slice()).unwrap())
        .flat_map(|file| file.service)
        .filter(|service| service.name() == "Payments")
        .flat_map(|service| service.method)
        .map(|method| method.name().to_owned())
        .collect();
    assert_eq!(methods, ["Charge", "Refund", "GetAttempt", "ListAttempts"]);
}

/// Older grpcurl, Postman and grpcui ask the v1alpha reflection service.
#[tokio::test]
async fn reflection_v1alpha_lists_the_same_services() {
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient as V1alphaClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest as V1alphaRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse as V1alphaResponse;
    let app = TestApp::spawn().await;
    let mut client = V1alphaClient::new(channel(app.grpc_addr).await.unwrap());
    let request = tonic_reflection::pb::v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(V1alphaRequest::ListServices(String::new())),
    };
    let mut responses = client.server_reflection_info(tokio_stream::iter([request])).await.unwrap().into_inner();
    let response = responses.next().await.expect("one answer").unwrap();
    let Some(V1alphaResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("expected a service list: {response:?}");
    };
    let names: Vec<&str> = list.service.iter().map(|service| service.name.as_str()).collect();
    for expected in [PAYMENTS, REPORTS, "grpc.health.v1.Health"] {
        assert!(names.contains(&expected), "{expected} in {names:?}");
    }
}

type HealthStream = tonic::Streaming<tonic_health::pb::HealthCheckResponse>;

async fn watch(addr: std::net::SocketAddr, service: &str) -> HealthStream {
    let mut client = HealthClient::new(channel(addr).await.unwrap());
    let request = HealthCheckRequest {
        service: service.to_owned(),
    };
    client.watch(request).await.unwrap().into_inner()
}

/// Statuses announced on `stream` (the first is the current one), until `until` is seen.
async fn read_until(stream: &mut HealthStream, until: ServingStatus) -> Vec<ServingStatus> {
    let mut seen = Vec::new();
    while let Some(message) = stream.next().await {
        let status = ServingStatus::try_from(message.unwrap().status).unwrap();
        seen.push(status);
        if status == until {
            return seen;
        }
    }
    panic!("health stream ended without {until:?}; saw {seen:?}");
}

/// One health check of a server that is up.
async fn check(addr: std::net::SocketAddr, service: &str) -> ServingStatus {
    health(addr, service).await.expect("the server answers health checks")
}

#[tokio::test]
async fn health_is_serving_with_a_reachable_database_and_not_serving_once_it_goes_away() {
    let app = TestApp::spawn().await;
    let mut payments = watch(app.grpc_addr, PAYMENTS).await;
    read_until(&mut payments, ServingStatus::Serving).await;
    read_until(&mut watch(app.grpc_addr, "").await, ServingStatus::Serving).await;
    read_until(&mut watch(app.grpc_addr, REPORTS).await, ServingStatus::Serving).await;
    assert_eq!(
        check(app.grpc_addr, LIVENESS_SERVICE).await,
        ServingStatus::Serving
    );

    // The database disappears under the running service (its connections are closed too).
    let admin = sqlx::PgPool::connect(&crate::support::database::admin_url())
        .await
        .unwrap();
    sqlx::query(&format!(
        r#"DROP DATABASE "{}" WITH (FORCE)"#,
        app.database.name
    ))
    .execute(&admin)
    .await
    .unwrap();
    admin.close().await;

    // The same stream, which announced SERVING above, now announces the change.
    read_until(&mut payments, ServingStatus::NotServing).await;
    assert_eq!(check(app.grpc_addr, "").await, ServingStatus::NotServing);
    assert_eq!(check(app.grpc_addr, REPORTS).await, ServingStatus::NotServing);
    // Liveness is about the process: a restart would not bring the database back.
    assert_eq!(
        check(app.grpc_addr, LIVENESS_SERVICE).await,
        ServingStatus::Serving
    );
}

#[tokio::test]
async fn health_is_not_serving_while_the_database_is_unreachable() {
    let closed = free_addr();
    let app = TestApp::spawn_with(|config| {
        config.database.url = Some(chargeguard::secret::Secret::new(format!(
            "postgres://postgres@{closed}/chargeguard"
        )));
        config.database.migrate_on_start = false;
        config.database.acquire_timeout_ms = 500;
    })
    .await;
    assert_eq!(
        check(app.grpc_addr, PAYMENTS).await,
        ServingStatus::NotServing
    );
    assert_eq!(check(app.grpc_addr, "").await, ServingStatus::NotServing);
    assert_eq!(
        check(app.grpc_addr, LIVENESS_SERVICE).await,
        ServingStatus::Serving
    );

    // And the API says why instead of hanging: the database is unavailable, retry later.
    let error = app
        .charge(crate::support::charge_request("order-db-down:charge"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), tonic::Code::Unavailable);
    assert_eq!(crate::support::error_code(&error), "unavailable");
}

#[tokio::test]
async fn on_the_embedded_store_reports_are_serving_as_payments_are() {
    let app = TestApp::spawn_backend(crate::support::Backend::Sqlite).await;
    read_until(&mut watch(app.grpc_addr, PAYMENTS).await, ServingStatus::Serving).await;
    // Reports run on the embedded store too: they follow the same database.
    read_until(&mut watch(app.grpc_addr, REPORTS).await, ServingStatus::Serving).await;
}
