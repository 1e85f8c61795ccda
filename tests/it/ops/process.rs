//! `chargeguard` as a child process: the built binary, a clean environment (no CHARGEGUARD_…
//! variables leak in from the test's own), free ports passed by flag, stderr collected.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::health::{PAYMENTS_SERVICE, health};

pub const BINARY: &str = env!("CARGO_BIN_EXE_chargeguard");

/// How long a child server gets to answer its first health check (2 shared cores, migrations).
const READY_POLLS_MAX: u32 = 2_400;
const READY_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// A command for the binary with no CHARGEGUARD_… variables from the test's environment.
pub fn command(cwd: &Path) -> Command {
    let mut command = Command::new(BINARY);
    command
        .current_dir(cwd)
        .kill_on_drop(true)
        .stdin(Stdio::null());
    for (name, _) in std::env::vars() {
        if name.starts_with("CHARGEGUARD_") || name == "RUST_LOG" || name == "FAILPOINTS" {
            command.env_remove(name);
        }
    }
    command
}

/// A port nobody listens on right now (bound, then released).
pub fn free_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

pub struct ServeProcess {
    child: Child,
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    stderr: Arc<Mutex<String>>,
    /// Copies the child's stderr into `stderr`; it ends at end of file, after the last line.
    stderr_reader: Option<tokio::task::JoinHandle<()>>,
}

impl ServeProcess {
    /// Starts `chargeguard [global…] serve --grpc-listen … --http-listen …` in `cwd`.
    pub fn start(command: Command, global_args: &[&str]) -> Self {
        Self::start_listening(command, global_args, free_addr(), free_addr())
    }

    /// As `start`, on the given addresses; the test connects to an unspecified address
    /// (`0.0.0.0:port`) through loopback on its port.
    pub fn start_listening(mut command: Command, global_args: &[&str], grpc_listen: SocketAddr, http_listen: SocketAddr) -> Self {
        let reachable = |listen: SocketAddr| match listen.ip().is_unspecified() {
            true => SocketAddr::from(([127, 0, 0, 1], listen.port())),
            false => listen,
        };
        let (grpc_addr, http_addr) = (reachable(grpc_listen), reachable(http_listen));
        command
            .args(global_args)
            .args([
                "serve",
                "--grpc-listen",
                &grpc_listen.to_string(),
                "--http-listen",
                &http_listen.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("chargeguard binary starts");
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        let stderr_reader = tokio::spawn(async move {
            let mut lines = BufReader::new(pipe).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut sink = sink.lock().unwrap();
                sink.push_str(&line);
                sink.push('\n');
            }
        });
        Self {
            child,
            grpc_addr,
            http_addr,
            stderr,
            stderr_reader: Some(stderr_reader),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("child still running")
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Polls gRPC health until the service answers SERVING; fails with the child's stderr if it
    /// exits first.
    pub async fn wait_ready(&mut self) {
        for _ in 0..READY_POLLS_MAX {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "chargeguard serve exited with {status} before serving; stderr:\n{}",
                    self.stderr()
                );
            }
            if health(self.grpc_addr, PAYMENTS_SERVICE).await
                == Some(ServingStatus::Serving)
            {
                return;
            }
            tokio::time::sleep(READY_POLL_INTERVAL).await;
        }
        panic!(
            "chargeguard serve never became ready; stderr:\n{}",
            self.stderr()
        );
    }

    /// SIGTERM, as Kubernetes and systemd stop a service.
    pub fn terminate(&self) {
        self.signal("TERM");
    }

    /// SIGHUP, as an operator (or a cert-manager hook) asks for the TLS files to be re-read.
    pub fn hang_up(&self) {
        self.signal("HUP");
    }

    /// SIGKILL: no reply, no cleanup, as an operator's kill -9 or the OOM killer would.
    pub fn kill(&self) {
        self.signal("KILL");
    }

    fn signal(&self, name: &str) {
        let status = std::process::Command::new("kill")
            .args([&format!("-{name}"), &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{name} failed");
    }

    pub async fn wait_exit(&mut self) -> ExitStatus {
        let status = self.child.wait().await.unwrap();
        // The process's last lines (a refusal's message comes last) may still be in the pipe:
        // read to end of file. One yield was not enough under RUST_LOG=trace, where thousands
        // of lines are queued behind the exit. Bounded in case a grandchild holds the pipe.
        if let Some(reader) = self.stderr_reader.take() {
            let _ = tokio::time::timeout(STDERR_DRAIN_MAX, reader).await;
        }
        status
    }
}

/// How long the stderr copy may take to reach end of file once the process has exited.
const STDERR_DRAIN_MAX: Duration = Duration::from_secs(10);

/// How long a refused start may take to exit: configuration is checked before anything starts,
/// so this only bounds a start that was not refused (it would serve until killed).
const FAILED_START_WAIT_MAX: Duration = Duration::from_secs(60);

/// Runs `serve` expecting it to refuse to start; returns its stderr.
pub async fn failed_start(command: Command, global_args: &[&str]) -> String {
    let mut server = ServeProcess::start(command, global_args);
    let Ok(exit) = tokio::time::timeout(FAILED_START_WAIT_MAX, server.wait_exit()).await else {
        panic!("serve did not refuse to start; stderr:\n{}", server.stderr());
    };
    let stderr = server.stderr();
    assert!(!exit.success(), "serve started; stderr:\n{stderr}");
    stderr
}

/// Writes `chargeguard.toml` into `dir` and returns its path.
pub fn write_config(dir: &Path, toml: &str) -> std::path::PathBuf {
    let path = dir.join("chargeguard.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// `[[consumers]]` entries for the given (name, token) pairs.
pub fn consumers_toml(consumers: &[(&str, &str)]) -> String {
    consumers
        .iter()
        .map(|(name, token)| {
            format!(
                "[[consumers]]\nname = \"{name}\"\ntoken_sha256 = \"{}\"\n",
                chargeguard::grpc::hash_token(token)
            )
        })
        .collect()
}
