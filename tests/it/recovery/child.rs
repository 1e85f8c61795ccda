//! A real `chargeguard` process (the binary built with `--features failpoints`) pointed at a
//! test's database and simulator. With a crash point configured through FAILPOINTS it exits on
//! the spot when it reaches it, like a kill -9: no reply, no cleanup; or it stalls there a
//! while and goes on (`FailpointAction::Stall`). Its wall clock may run
//! ahead or behind (libfaketime), as another replica's does.

use std::io::Write;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chargeguard::failpoints::CRASH_EXIT_CODE;
use chrono::{DateTime, Utc};
use chargeguard::grpc::hash_token;
use chargeguard::grpc::proto::payments_client::PaymentsClient;
use chargeguard::grpc::proto::{ChargeRequest, ChargeResponse};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr};

use crate::ops::process::command;
use crate::support::faketime::ClockOffset;
use crate::support::{ORDERS_TOKEN, SIM_API_KEY, TestApp, authed};

/// Upper bound on a child's start or its run to a crash point; only a hung child reaches it.
const CHILD_WAIT_MAX: Duration = Duration::from_secs(120);
/// How often to look whether the database has ended a dead child's sessions.
const SESSION_POLL: Duration = Duration::from_millis(20);

/// The `[sweep]` section of the child's configuration.
pub enum ChildSweep {
    Off,
    /// Scheduled every second, so the job starts at once.
    EverySecond {
        batch_max: u32,
        concurrency_max: u32,
    },
}

/// What a child does when it reaches its armed failpoint.
#[derive(Debug, Clone, Copy)]
pub enum FailpointAction {
    /// Exits on the spot (`return`), like a kill -9.
    Crash,
    /// Blocks the thread that reached it this long (`sleep(ms)`), then goes on: a round that
    /// stalls after the provider answered, as a long GC pause or a descheduled VM would.
    Stall { ms: u64 },
}

impl FailpointAction {
    fn spec(self) -> String {
        match self {
            Self::Crash => "return".to_owned(),
            Self::Stall { ms } => format!("sleep({ms})"),
        }
    }
}

/// How a child is run.
pub struct ChildSpec<'a> {
    /// The failpoint armed through FAILPOINTS, if any.
    pub failpoint: Option<&'a str>,
    pub failpoint_action: FailpointAction,
    pub sweep: ChildSweep,
    /// How far the child's wall clock is from the real one.
    pub clock: ClockOffset,
    pub call_timeout_ms: u64,
    /// `charge.lease_ms` (and `charge.recovery_grace_ms`).
    pub lease_ms: u64,
    /// `database.statement_timeout_ms`; a short lease needs a short one (config validates).
    pub statement_timeout_ms: u64,
    /// `database.group_commit.enabled`: the test run's choice (`support::group_commit_enabled`).
    pub group_commit: bool,
}

impl Default for ChildSpec<'_> {
    /// A replica on the real clock with no crash point and no scheduled sweep.
    fn default() -> Self {
        Self {
            failpoint: None,
            failpoint_action: FailpointAction::Crash,
            sweep: ChildSweep::Off,
            clock: ClockOffset::NONE,
            call_timeout_ms: 1_000,
            // Leases of a minute: long enough that the dead process's rows stay its own while a
            // test looks at them (tests move the in-process app's clock past them).
            lease_ms: 60_000,
            statement_timeout_ms: 5_000,
            group_commit: crate::support::group_commit_enabled(),
        }
    }
}

impl<'a> ChildSpec<'a> {
    /// Stops at `failpoint`, sweep off, real clock.
    pub fn crashing_at(failpoint: &'a str) -> Self {
        Self { failpoint: Some(failpoint), ..Self::default() }
    }

    /// Stalls `ms` at `failpoint` with leases of `lease_ms`, sweep off, real clock: a lease
    /// that lapses under a live round. The call and statement timeouts are cut to fit.
    pub fn stalling_at(failpoint: &'a str, ms: u64, lease_ms: u64) -> Self {
        Self {
            failpoint: Some(failpoint),
            failpoint_action: FailpointAction::Stall { ms },
            lease_ms,
            call_timeout_ms: lease_ms / 4,
            statement_timeout_ms: lease_ms / 4,
            ..Self::default()
        }
    }

    /// A replica whose wall clock reads `clock` off the real one.
    pub fn replica_at(clock: ClockOffset) -> Self {
        Self { clock, ..Self::default() }
    }
}

pub struct ChildProcess {
    process: Child,
    /// The child's `application_name` in PostgreSQL, to see its sessions.
    session_name: String,
    database_url: String,
    grpc_addr: Option<SocketAddr>,
    stderr: Arc<Mutex<Vec<String>>>,
    /// The offset the child's clock was given, and the real time just before it started.
    clock: ClockOffset,
    started_at: DateTime<Utc>,
    _config: tempfile::NamedTempFile,
}

fn config_toml(app: &TestApp, session_name: &str, spec: &ChildSpec) -> String {
    let sweep = match &spec.sweep {
        ChildSweep::Off => "enabled = false".to_owned(),
        ChildSweep::EverySecond { batch_max, concurrency_max } => format!(
            "enabled = true\nschedule = \"* * * * * *\"\nbatch_max = {batch_max}\nconcurrency_max = {concurrency_max}"
        ),
    };
    format!(
        r#"[server]
grpc_listen = "127.0.0.1:0"
http_listen = "127.0.0.1:0"

[database]
url = "{database}?application_name={session_name}"
statement_timeout_ms = {statement_timeout_ms}
group_commit = {{ enabled = {group_commit} }}

[provider]
api_key = "{SIM_API_KEY}"
base_url = "{simulator}"
call_timeout_ms = {call_timeout_ms}

[charge]
lease_ms = {lease_ms}
recovery_grace_ms = {lease_ms}

[sweep]
{sweep}

[[consumers]]
name = "orders"
token_sha256 = "{token}"
"#,
        database = app.database.url,
        simulator = app.simulator.base_url(),
        token = hash_token(ORDERS_TOKEN),
        call_timeout_ms = spec.call_timeout_ms,
        lease_ms = spec.lease_ms,
        statement_timeout_ms = spec.statement_timeout_ms,
        group_commit = spec.group_commit,
    )
}

/// Keeps reading the child's log so that it never blocks on a full pipe.
pub(crate) fn drain(
    stderr: ChildStderr,
    lines: Arc<Mutex<Vec<String>>>,
    mut ready: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
) {
    tokio::spawn(async move {
        let mut reader = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            if let Some(addr) = serving_addr(&line)
                && let Some(ready) = ready.take()
            {
                let _ = ready.send(addr);
            }
            lines.lock().unwrap().push(line);
        }
    });
}

/// When a JSON log line says it was written (by the writer's clock).
pub(crate) fn log_timestamp(line: &str) -> Option<DateTime<Utc>> {
    let event: serde_json::Value = serde_json::from_str(line).ok()?;
    let stamp = event.get("timestamp")?.as_str()?;
    DateTime::parse_from_rfc3339(stamp).ok().map(|stamp| stamp.with_timezone(&Utc))
}

/// The gRPC address from the JSON log line `serve` writes once it listens.
fn serving_addr(line: &str) -> Option<SocketAddr> {
    let event: serde_json::Value = serde_json::from_str(line).ok()?;
    if event.get("message")?.as_str()? != "chargeguard serving" {
        return None;
    }
    event.get("grpc")?.as_str()?.parse().ok()
}

impl ChildProcess {
    /// Starts `chargeguard serve` as `spec` says and waits until it listens.
    pub async fn serve(app: &TestApp, spec: ChildSpec<'_>) -> Self {
        let mut child = Self::start(app, &spec, &["serve"], Stdio::null());
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        drain(child.process.stderr.take().unwrap(), child.stderr.clone(), Some(ready_tx));
        match tokio::time::timeout(CHILD_WAIT_MAX, ready_rx).await {
            Ok(Ok(addr)) => child.grpc_addr = Some(addr),
            _ => panic!("chargeguard serve did not start:\n{}", child.log()),
        }
        child.assert_clock();
        child
    }

    /// Starts `chargeguard serve` as `spec` says without waiting for it to listen (for a child
    /// that reaches its crash point by itself).
    pub fn serve_unattended(app: &TestApp, spec: ChildSpec<'_>) -> Self {
        let mut child = Self::start(app, &spec, &["serve"], Stdio::null());
        drain(child.process.stderr.take().unwrap(), child.stderr.clone(), None);
        child
    }

    /// Runs `chargeguard sweep --once` as `spec` says (its sweep section aside) to its end;
    /// returns what it printed.
    pub async fn sweep_once(app: &TestApp, spec: ChildSpec<'_>) -> String {
        let mut child = Self::start(app, &spec, &["sweep", "--once"], Stdio::piped());
        drain(child.process.stderr.take().unwrap(), child.stderr.clone(), None);
        let mut stdout = child.process.stdout.take().unwrap();
        let read = async {
            let mut printed = String::new();
            tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut printed).await.unwrap();
            (printed, child.process.wait().await.unwrap())
        };
        let (printed, status) = match tokio::time::timeout(CHILD_WAIT_MAX, read).await {
            Ok(done) => done,
            Err(_) => panic!("sweep --once did not finish:\n{}", child.log()),
        };
        assert!(status.success(), "sweep --once: {status}\n{printed}\n{}", child.log());
        child.assert_clock();
        printed
    }

    /// The child's first log line is stamped with the clock it was given: a libfaketime that
    /// failed to load would otherwise leave a "skewed" replica on the real clock unnoticed.
    fn assert_clock(&self) {
        let stamped = self.stderr.lock().unwrap().iter().find_map(|line| log_timestamp(line));
        let stamped = stamped.unwrap_or_else(|| panic!("no timestamped log line:\n{}", self.log()));
        self.clock.assert_read_by_child(stamped, self.started_at);
    }

    fn start(app: &TestApp, spec: &ChildSpec, subcommand: &[&str], stdout: Stdio) -> Self {
        let session_name = format!("chargeguard-child-{}", uuid::Uuid::new_v4().simple());
        let mut config = tempfile::NamedTempFile::new().unwrap();
        config.write_all(config_toml(app, &session_name, spec).as_bytes()).unwrap();
        let mut command = command(&std::env::temp_dir());
        command
            .arg("--config")
            .arg(config.path())
            .args(["--log-format", "json"])
            .args(subcommand)
            .env("RUST_LOG", "info,sqlx=warn")
            .stdout(stdout)
            .stderr(Stdio::piped());
        if let Some(failpoint) = spec.failpoint {
            command.env("FAILPOINTS", format!("{failpoint}={}", spec.failpoint_action.spec()));
        }
        spec.clock.apply(&mut command);
        let started_at = Utc::now();
        let process = command.spawn().expect("the chargeguard binary starts");
        Self {
            process,
            session_name,
            database_url: app.database.url.clone(),
            grpc_addr: None,
            stderr: Arc::new(Mutex::new(Vec::new())),
            clock: spec.clock,
            started_at,
            _config: config,
        }
    }

    /// Sends `Charge` as the `orders` consumer to the child.
    pub async fn charge(&self, request: ChargeRequest) -> Result<ChargeResponse, tonic::Status> {
        let endpoint = format!("http://{}", self.grpc_addr.expect("started with serve()"));
        let mut client =
            PaymentsClient::connect(endpoint).await.expect("gRPC connects to the child");
        client.charge(authed(ORDERS_TOKEN, request)).await.map(|response| response.into_inner())
    }

    pub async fn refund(&self, request: chargeguard::grpc::proto::RefundRequest) -> Result<chargeguard::grpc::proto::RefundResponse, tonic::Status> {
        let endpoint = format!("http://{}", self.grpc_addr.expect("started with serve()"));
        let mut client =
            PaymentsClient::connect(endpoint).await.expect("gRPC connects to the child");
        client.refund(authed(ORDERS_TOKEN, request)).await.map(|response| response.into_inner())
    }

    /// Waits for the child to exit and checks that it stopped at its crash point.
    pub async fn expect_crash(mut self) {
        let status = match tokio::time::timeout(CHILD_WAIT_MAX, self.process.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => panic!("the child never reached its crash point:\n{}", self.log()),
        };
        assert_eq!(status.code(), Some(CRASH_EXIT_CODE), "child log:\n{}", self.log());
        self.assert_clock();
        self.wait_for_sessions_to_end().await;
    }

    /// Kills the child with SIGKILL, as an operator's kill -9 or the OOM killer would: no
    /// reply, no cleanup. Statements it sent may still run (and commit) in the database: see
    /// [`Self::wait_for_sessions_to_end`] before looking. `&self`, so that calls to the child
    /// can be in flight meanwhile; [`Self::reap`] then collects it.
    pub fn kill_now(&self) {
        let pid = self.process.id().expect("the child still runs");
        let status = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
        assert!(status.success(), "kill -KILL {pid}");
    }

    /// Waits for a child killed by [`Self::kill_now`] and checks that SIGKILL ended it.
    pub async fn reap(&mut self) {
        let status = tokio::time::timeout(CHILD_WAIT_MAX, self.process.wait()).await.unwrap().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9), "{}", self.log());
    }

    /// A statement the child sent just before it died still runs, and may commit, in its
    /// server session; the database ends the session only after that. Until then the dead
    /// process can still change rows, so tests look only once its sessions are gone.
    pub async fn wait_for_sessions_to_end(&self) {
        let pool = sqlx::PgPool::connect(&self.database_url).await.unwrap();
        let gone = async {
            loop {
                let (sessions,): (i64,) = sqlx::query_as(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                )
                .bind(&self.session_name)
                .fetch_one(&pool)
                .await
                .unwrap();
                if sessions == 0 {
                    return;
                }
                tokio::time::sleep(SESSION_POLL).await;
            }
        };
        if tokio::time::timeout(CHILD_WAIT_MAX, gone).await.is_err() {
            panic!("the database kept the dead child's sessions");
        }
        pool.close().await;
    }

    fn log(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }
}
