//! Plaintext beyond loopback, with a real `chargeguard serve` process: refused at start when
//! `server.require_tls = true` (naming the option, exit code non-zero, nothing served), and
//! otherwise served with a warning at start that says what travels in the clear.

use std::net::SocketAddr;
use std::time::Duration;

use crate::ops::process::{ServeProcess, command, consumers_toml, free_addr, write_config};
use crate::support::{ORDERS_TOKEN, TestDatabase};

/// A refused start checks the configuration before anything else; this bounds one that was not.
const REFUSED_WAIT_MAX: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_plaintext_grpc_port_on_a_non_loopback_address_is_refused_at_start_when_tls_is_required() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &format!("[server]\nrequire_tls = true\n\n{}", consumers_toml(&[("orders", ORDERS_TOKEN)])));
    let grpc_listen: SocketAddr = "0.0.0.0:0".parse().unwrap();
    let mut server = ServeProcess::start_listening(command(dir.path()), &["--config", config.to_str().unwrap()], grpc_listen, free_addr());
    let Ok(exit) = tokio::time::timeout(REFUSED_WAIT_MAX, server.wait_exit()).await else {
        panic!("serve did not refuse to start; stderr:\n{}", server.stderr());
    };
    let stderr = server.stderr();
    assert!(!exit.success() && exit.code().is_some_and(|code| code != 0), "exit {exit:?}; stderr:\n{stderr}");
    for part in ["server.grpc_listen 0.0.0.0:0 is not a loopback address", "server.require_tls = true", "server.tls_cert_file"] {
        assert!(stderr.contains(part), "the refusal says {part:?}:\n{stderr}");
    }
    // The HTTP port is on loopback here: only the non-loopback one is named.
    assert!(!stderr.contains("server.http_listen"), "{stderr}");
    assert!(!stderr.contains("chargeguard serving"), "{stderr}");
}

#[tokio::test]
async fn a_plaintext_grpc_port_on_a_non_loopback_address_serves_with_a_warning_when_tls_is_not_required() {
    let dir = tempfile::tempdir().unwrap();
    let database = TestDatabase::create().await;
    let config = write_config(dir.path(), &consumers_toml(&[("orders", ORDERS_TOKEN)]));
    let mut serve = command(dir.path());
    serve.env("CHARGEGUARD_DATABASE__URL", &database.url);
    let grpc_listen = SocketAddr::from(([0, 0, 0, 0], free_addr().port()));
    let mut server = ServeProcess::start_listening(serve, &["--config", config.to_str().unwrap()], grpc_listen, free_addr());
    server.wait_ready().await;
    let stderr = server.stderr();
    let warning = format!("server.grpc_listen {grpc_listen} is not loopback and speaks plaintext");
    assert!(stderr.contains(&warning), "{warning:?} at start:\n{stderr}");
    assert!(stderr.contains("WARN"), "logged as a warning:\n{stderr}");
    assert!(!stderr.contains("server.http_listen"), "the loopback HTTP port is not warned about:\n{stderr}");
    server.terminate();
    let exit = tokio::time::timeout(Duration::from_secs(30), server.wait_exit()).await.expect("stops on SIGTERM");
    assert!(exit.success(), "{exit:?}:\n{}", server.stderr());
}
