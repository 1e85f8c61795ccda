//! SIGHUP re-reads the TLS files, in a real `chargeguard serve` process: with the change poll
//! set to an hour, new files are served only after the signal, the process survives it, and a
//! connection opened before keeps working.

use std::time::Duration;

use super::{Ca, ServerFiles, tls_client};
use crate::ops::process::{ServeProcess, command, consumers_toml, write_config};
use crate::support::{ORDERS_TOKEN, TestDatabase, authed, charge_request};

const READY_WAIT_MAX: Duration = Duration::from_secs(120);
const RELOAD_WAIT_MAX: Duration = Duration::from_secs(15);
/// How long the test checks that changed files alone are not picked up (the poll is an hour).
const UNCHANGED_FOR: Duration = Duration::from_millis(600);

#[tokio::test]
async fn sighup_re_reads_the_certificate_files_without_a_restart_or_a_dropped_connection() {
    let dir = tempfile::tempdir().unwrap();
    let database = TestDatabase::create().await;
    let (old_ca, new_ca) = (Ca::new("old CA"), Ca::new("new CA"));
    let files = ServerFiles::write(dir.path(), &old_ca.server(), None);
    let toml = format!(
        "[server]\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\ntls_reload_interval_ms = 3600000\n\n{}",
        files.cert.display(),
        files.key.display(),
        consumers_toml(&[("orders", ORDERS_TOKEN)]),
    );
    let config = write_config(dir.path(), &toml);
    let mut serve = command(dir.path());
    serve.env("CHARGEGUARD_DATABASE__URL", &database.url);
    let mut server = ServeProcess::start(serve, &["--config", config.to_str().unwrap()]);
    let started = std::time::Instant::now();
    // Plaintext health checks cannot reach a TLS port: the log says when it serves.
    while !server.stderr().contains("chargeguard serving") {
        assert!(started.elapsed() < READY_WAIT_MAX, "never served:\n{}", server.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let addr = server.grpc_addr;
    let mut before = tls_client(addr, &old_ca, None).await.expect("the first certificate is served");
    before.charge(authed(ORDERS_TOKEN, charge_request("hup-1"))).await.expect("a charge over TLS");

    files.replace(&new_ca.server());
    tokio::time::sleep(UNCHANGED_FOR).await;
    assert!(tls_client(addr, &new_ca, None).await.is_err(), "changed files alone are not served before the poll or a SIGHUP");
    tls_client(addr, &old_ca, None).await.expect("the old certificate is still served until the signal");

    server.hang_up();
    let signalled = std::time::Instant::now();
    let mut after = loop {
        if let Ok(mut client) = tls_client(addr, &new_ca, None).await
            && client.charge(authed(ORDERS_TOKEN, charge_request("hup-2"))).await.is_ok()
        {
            break client;
        }
        assert!(signalled.elapsed() < RELOAD_WAIT_MAX, "the new certificate was never served after SIGHUP:\n{}", server.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!("new certificate served {:?} after SIGHUP", signalled.elapsed());
    assert!(server.stderr().contains("TLS certificate files re-read"), "the reload is logged:\n{}", server.stderr());
    before.charge(authed(ORDERS_TOKEN, charge_request("hup-3"))).await.expect("the connection opened before the signal still works");
    after.charge(authed(ORDERS_TOKEN, charge_request("hup-4"))).await.expect("a second call on the new certificate");
    assert!(tls_client(addr, &old_ca, None).await.is_err(), "new connections no longer get the old certificate");

    server.terminate();
    let exit = tokio::time::timeout(Duration::from_secs(30), server.wait_exit()).await.expect("stops on SIGTERM");
    assert!(exit.success(), "the process that took the SIGHUP stops cleanly: {exit:?}\n{}", server.stderr());
}
