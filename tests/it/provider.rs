//! The transport under async-stripe (`provider/transport.rs`): connections to the provider are
//! kept alive between calls, within `provider.idle_connections_max`.

use chargeguard::grpc::proto::AttemptStatus;

use crate::support::{TestApp, charge_request, status_of};

const CHARGES: u64 = 20;

/// Connections the simulator accepted while `CHARGES` charges ran one after another.
async fn connections_for_sequential_charges(app: &TestApp, prefix: &str) -> u64 {
    // One control client for both readings: its own connection is kept alive too.
    let sim = app.sim();
    // The first charge opens the connection the others may reuse.
    app.charge(charge_request(&format!("{prefix}-warm-up"))).await.unwrap();
    let before = sim.connections_accepted().await.unwrap();
    for index in 0..CHARGES {
        let response = app.charge(charge_request(&format!("{prefix}-{index}"))).await.unwrap();
        assert_eq!(status_of(&response), AttemptStatus::Succeeded);
    }
    sim.connections_accepted().await.unwrap() - before
}

#[tokio::test]
async fn sequential_charges_reuse_one_provider_connection() {
    let app = TestApp::spawn().await;
    let opened = connections_for_sequential_charges(&app, "kept-alive").await;
    // At most the control client's reconnect; a connection per call would be 20.
    assert!(opened <= 1, "{opened} connections for {CHARGES} sequential charges");
}

#[tokio::test]
async fn with_no_idle_connections_every_call_opens_its_own() {
    let app = TestApp::spawn_with(|config| config.provider.idle_connections_max = 0).await;
    let opened = connections_for_sequential_charges(&app, "no-pool").await;
    assert!(opened >= CHARGES, "{opened} connections for {CHARGES} sequential charges");
}
