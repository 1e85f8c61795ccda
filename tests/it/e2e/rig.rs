//! The processes of an end-to-end run, each started, killed (SIGKILL) and restarted by the
//! test: the simulator, pgbouncer, `serve` replicas and order consumers, plus a RabbitMQ
//! virtual host of the run's own.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::ops::process::{ServeProcess, command, free_addr};
use crate::support::faketime::{FakeClockCluster, as_server_user, is_root};
use crate::support::{ORDERS_TOKEN, SIM_API_KEY};

/// The example consumer, built by `cargo test` beside this binary (`target/<profile>/examples`).
pub fn order_consumer_binary() -> PathBuf {
    let deps = std::env::current_exe().expect("test binary path");
    let profile_dir = deps.parent().and_then(Path::parent).expect("target/<profile>");
    let binary = profile_dir.join("examples").join("order-consumer");
    assert!(binary.exists(), "{} is built by `cargo test` (an [[example]] of the package)", binary.display());
    binary
}

async fn wait_for_port(addr: SocketAddr, what: &str) {
    for _ in 0..600 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what} never listened on {addr}");
}

fn log_file(dir: &Path, name: &str) -> std::fs::File {
    std::fs::OpenOptions::new().create(true).append(true).open(dir.join(format!("{name}.log"))).expect("log file")
}

/// The last lines of a process's log, for a failure message.
pub fn log_tail(dir: &Path, name: &str) -> String {
    let text = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// `chargeguard stripe-sim` as a process of its own.
pub struct SimulatorProcess {
    child: Child,
    pub base_url: String,
}

impl SimulatorProcess {
    pub async fn start(dir: &Path, seed: u64) -> Self {
        let addr = free_addr();
        let mut simulator = command(dir);
        simulator
            .args(["stripe-sim", "--listen", &addr.to_string(), "--seed", &seed.to_string()])
            .args(["--api-key", SIM_API_KEY, "--objects-max", "1000000", "--idempotency-keys-max", "1000000"])
            .stdout(Stdio::null())
            .stderr(log_file(dir, "simulator"));
        let child = simulator.spawn().expect("simulator starts");
        wait_for_port(addr, "the simulator").await;
        Self { child, base_url: format!("http://{addr}") }
    }

    pub async fn control(&self, method: reqwest::Method, path: &str, body: Option<serde_json::Value>) -> serde_json::Value {
        let client = reqwest::Client::new();
        let mut request = client.request(method, format!("{}/_sim/{path}", self.base_url));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("simulator control answers");
        assert!(response.status().is_success(), "simulator control {path}: {}", response.status());
        response.json().await.unwrap_or(serde_json::Value::Null)
    }
}

impl Drop for SimulatorProcess {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Where Debian's package puts it.
const PGBOUNCER: &str = "/usr/sbin/pgbouncer";

/// pgbouncer between the replicas and the cluster. Session mode: pgbouncer 1.18 (Debian 12)
/// cannot keep sqlx's named prepared statements apart in transaction mode (README "Deploying").
pub struct Pgbouncer {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Pgbouncer {
    pub async fn start(cluster: &FakeClockCluster) -> Self {
        let dir = tempfile::Builder::new().prefix("cg_it_pgbouncer_").tempdir().expect("temporary directory");
        let port = free_addr().port();
        std::fs::write(dir.path().join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        let ini = format!(
            "[databases]\n* = host=127.0.0.1 port={cluster_port}\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
             listen_port = {port}\nunix_socket_dir =\nauth_type = trust\nauth_file = {dir}/users.txt\n\
             ignore_startup_parameters = extra_float_digits\n\
             pool_mode = session\nmax_client_conn = 400\ndefault_pool_size = 80\nserver_login_retry = 1\n\
             logfile = {dir}/pgbouncer.log\n",
            cluster_port = cluster.port(),
            dir = dir.path().display(),
        );
        std::fs::write(dir.path().join("pgbouncer.ini"), ini).unwrap();
        if is_root() {
            let _ = std::process::Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir.path()).status();
        }
        assert!(Path::new(PGBOUNCER).exists(), "{PGBOUNCER} is missing (.ci/run installs Debian's pgbouncer)");
        let mut pgbouncer = Command::from(as_server_user(PathBuf::from(PGBOUNCER)));
        pgbouncer.arg(dir.path().join("pgbouncer.ini")).kill_on_drop(true).stdout(Stdio::null()).stderr(Stdio::null());
        let child = pgbouncer.spawn().expect("pgbouncer starts");
        wait_for_port(SocketAddr::from(([127, 0, 0, 1], port)), "pgbouncer").await;
        Self { child, port, _dir: dir }
    }

    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }
}

impl Drop for Pgbouncer {
    fn drop(&mut self) {
        // As root, the child is runuser; pgbouncer itself is its child and gets SIGKILL too.
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("pkill").args(["-9", "-P", &pid.to_string()]).status();
        }
        let _ = self.child.start_kill();
    }
}

/// One `serve` replica: its addresses stay fixed across restarts, so consumers keep them.
pub struct Replica {
    pub grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    config: PathBuf,
    dir: PathBuf,
    process: Option<ServeProcess>,
}

pub struct ReplicaSettings<'a> {
    pub database_url: &'a str,
    pub simulator_url: &'a str,
}

impl Replica {
    pub fn config_toml(settings: &ReplicaSettings) -> String {
        format!(
            r#"[database]
url = "{database}"
connections_max = 8
statement_timeout_ms = 3000
acquire_timeout_ms = 5000

[provider]
api_key = "{SIM_API_KEY}"
base_url = "{simulator}"
call_timeout_ms = 2000

[charge]
lease_ms = 8000
concurrent_wait_ms = 1000
recovery_grace_ms = 8000

[sweep]
enabled = true
schedule = "*/2 * * * * *"
batch_max = 200

[[consumers]]
name = "orders"
token_sha256 = "{token}"
"#,
            database = settings.database_url,
            simulator = settings.simulator_url,
            token = chargeguard::grpc::hash_token(ORDERS_TOKEN),
        )
    }

    pub fn new(dir: &Path, index: usize, toml: &str) -> Self {
        let dir = dir.join(format!("replica-{index}"));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("chargeguard.toml");
        std::fs::write(&config, toml).unwrap();
        Self { grpc_addr: free_addr(), http_addr: free_addr(), config, dir, process: None }
    }

    pub async fn start(&mut self) {
        let mut serve = command(&self.dir);
        serve.env("RUST_LOG", std::env::var("CG_E2E_REPLICA_LOG").unwrap_or_else(|_| "warn".to_owned()));
        let config = self.config.to_str().unwrap().to_owned();
        let mut process = ServeProcess::start_listening(serve, &["--config", &config], self.grpc_addr, self.http_addr);
        process.wait_ready().await;
        self.process = Some(process);
    }

    /// SIGKILL: no destructor, no shutdown, as the OOM killer or a lost host would.
    pub fn kill_9(&mut self) {
        if let Some(process) = self.process.take() {
            process.kill();
        }
    }

    /// The last lines the running process wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        let stderr = self.process.as_ref().map(ServeProcess::stderr).unwrap_or_default();
        let lines: Vec<&str> = stderr.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.grpc_addr)
    }
}

/// One `order-consumer run` process.
pub struct ConsumerProcess {
    name: String,
    args: Vec<String>,
    dir: PathBuf,
    child: Option<Child>,
}

impl ConsumerProcess {
    pub fn new(dir: &Path, name: &str, args: Vec<String>) -> Self {
        Self { name: name.to_owned(), args, dir: dir.to_owned(), child: None }
    }

    pub fn start(&mut self) {
        let mut consumer = Command::new(order_consumer_binary());
        consumer
            .arg("run")
            .args(&self.args)
            .env("RUST_LOG", std::env::var("CG_E2E_CONSUMER_LOG").unwrap_or_else(|_| "order_consumer=warn,warn".to_owned()))
            .kill_on_drop(true)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file(&self.dir, &self.name));
        self.child = Some(consumer.spawn().expect("order-consumer starts"));
    }

    pub fn kill_9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
        }
    }

    /// Fails with its log when the process exited by itself (it never should).
    pub fn assert_running(&mut self) {
        if let Some(child) = &mut self.child
            && let Ok(Some(status)) = child.try_wait()
        {
            panic!("{} exited with {status}:\n{}", self.name, log_tail(&self.dir, &self.name));
        }
    }
}

/// A RabbitMQ virtual host of one run (queues, connections), removed at the end.
pub struct Vhost {
    pub name: String,
}

fn rabbitmqctl(args: &[&str]) -> String {
    let output = std::process::Command::new("rabbitmqctl").args(args).output().expect("rabbitmqctl runs");
    assert!(output.status.success(), "rabbitmqctl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

impl Vhost {
    pub fn create(name: &str) -> Self {
        let _ = std::process::Command::new("rabbitmqctl").args(["delete_vhost", name]).output();
        rabbitmqctl(&["add_vhost", name]);
        rabbitmqctl(&["set_permissions", "-p", name, "guest", ".*", ".*", ".*"]);
        Self { name: name.to_owned() }
    }

    pub fn amqp_url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:5672/{}", self.name)
    }

    /// The broker closes every connection of this virtual host (consumers reconnect).
    pub fn close_connections(&self) {
        rabbitmqctl(&["close_all_connections", "--vhost", &self.name, "chaos: broker connection restarted"]);
    }

    /// Messages ready in a queue.
    pub fn queue_messages(&self, queue: &str) -> u64 {
        let listed = rabbitmqctl(&["list_queues", "-p", &self.name, "--no-table-headers", "-q", "name", "messages"]);
        listed
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                Some((fields.next()?, fields.next()?.parse::<u64>().ok()?))
            })
            .find(|(name, _)| *name == queue)
            .map_or(0, |(_, messages)| messages)
    }
}

impl Drop for Vhost {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rabbitmqctl").args(["delete_vhost", &self.name]).output();
    }
}
