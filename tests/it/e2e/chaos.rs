//! The chaos test: N orders through RabbitMQ, three consumers, three replicas on one database
//! behind pgbouncer, a provider with 10 % faults of every daily kind — while consumers and
//! replicas are killed with SIGKILL, the database restarts without a checkpoint and the broker
//! drops its connections. Afterwards, counted at the provider and in the consumers' table:
//! every order charged exactly once or declined, nothing lost, and the report clean.
//!
//! CI runs the short form (1,000 orders, a few kills of each kind). `bench/chaos.sh` runs the
//! long form with `CG_CHAOS_ORDERS` and `CG_CHAOS_KILL_EVERY_MS` (not `CHARGEGUARD_…`: the
//! configuration refuses unknown variables of its own prefix).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use sqlx::{Connection, PgConnection};

use super::rig::{ConsumerProcess, Pgbouncer, Replica, ReplicaSettings, SimulatorProcess, Vhost, log_tail, order_consumer_binary};
use crate::ops::process::command;
use crate::support::ORDERS_TOKEN;
use crate::support::faketime::FakeClockCluster;

const REPLICAS: usize = 3;
const CONSUMERS: usize = 3;
const QUEUE: &str = "orders";

struct Settings {
    orders: u32,
    /// The producer's pace: the run lasts orders / rate seconds at least, under fire throughout.
    rate_per_second: u32,
    kill_every: Duration,
    seed: u64,
    /// Every order must have its final answer within this.
    deadline: Duration,
}

impl Settings {
    fn from_env() -> Self {
        let number = |name: &str, default: u64| std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default);
        let orders = number("CG_CHAOS_ORDERS", 1_000) as u32;
        Self {
            orders,
            rate_per_second: number("CG_CHAOS_RATE", 50) as u32,
            kill_every: Duration::from_millis(number("CG_CHAOS_KILL_EVERY_MS", 2_000)),
            seed: number("CG_CHAOS_SEED", 1),
            deadline: Duration::from_secs(number("CG_CHAOS_DEADLINE_S", 240 + u64::from(orders) / 10)),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Chaos {
    KillConsumer,
    KillReplica,
    RestartDatabase,
    RestartBrokerConnections,
}

/// The first events cover every kind once; after that they are drawn at random.
const OPENING: [Chaos; 4] = [Chaos::KillConsumer, Chaos::KillReplica, Chaos::RestartDatabase, Chaos::RestartBrokerConnections];

struct Rig {
    dir: tempfile::TempDir,
    cluster: FakeClockCluster,
    _pgbouncer: Pgbouncer,
    simulator: SimulatorProcess,
    replicas: Vec<Replica>,
    consumers: Vec<ConsumerProcess>,
    vhost: Vhost,
}

impl Rig {
    async fn start(seed: u64) -> Self {
        // CG_CHAOS_KEEP=1 keeps the processes' logs for a look after the run.
        let keep = std::env::var_os("CG_CHAOS_KEEP").is_some();
        let dir = tempfile::Builder::new().prefix("cg_it_chaos_").disable_cleanup(keep).tempdir().unwrap();
        let cluster = FakeClockCluster::start_durable().await;
        let mut admin = PgConnection::connect(&cluster.admin_url()).await.unwrap();
        for database in ["chargeguard", "orders"] {
            sqlx::query(&format!("CREATE DATABASE {database}")).execute(&mut admin).await.unwrap();
        }
        admin.close().await.unwrap();
        let pgbouncer = Pgbouncer::start(&cluster).await;
        let simulator = SimulatorProcess::start(dir.path(), seed).await;
        let toml = Replica::config_toml(&ReplicaSettings {
            database_url: &pgbouncer.url("chargeguard"),
            simulator_url: &simulator.base_url,
        });
        let mut replicas: Vec<Replica> = (0..REPLICAS).map(|index| Replica::new(dir.path(), index, &toml)).collect();
        for replica in &mut replicas {
            replica.start().await;
        }
        let vhost = Vhost::create(&format!("cg_chaos_{}", std::process::id()));
        let token_file = dir.path().join("orders.token");
        std::fs::write(&token_file, ORDERS_TOKEN).unwrap();
        let endpoints: Vec<String> = replicas.iter().map(Replica::endpoint).collect();
        let consumers = (0..CONSUMERS)
            .map(|index| {
                let args = vec![
                    format!("--amqp-url={}", vhost.amqp_url()),
                    format!("--queue={QUEUE}"),
                    format!("--database-url={}", cluster.url("orders")),
                    format!("--chargeguard={}", endpoints.join(",")),
                    format!("--token-file={}", token_file.display()),
                    "--prefetch=16".to_owned(),
                    "--call-timeout-ms=5000".to_owned(),
                ];
                ConsumerProcess::new(dir.path(), &format!("consumer-{index}"), args)
            })
            .collect();
        Self { dir, cluster, _pgbouncer: pgbouncer, simulator, replicas, consumers, vhost }
    }

    fn replica_config(&self) -> String {
        self.dir.path().join("replica-0").join("chargeguard.toml").display().to_string()
    }

    /// Starts the producer; it publishes while the chaos goes on.
    fn publish(&self, settings: &Settings, manifest: &Path) -> tokio::process::Child {
        tokio::process::Command::new(order_consumer_binary())
            .arg("publish")
            .arg(format!("--amqp-url={}", self.vhost.amqp_url()))
            .arg(format!("--queue={QUEUE}"))
            .arg(format!("--count={}", settings.orders))
            .arg("--prefix=chaos")
            .arg("--decline-percent=5")
            .arg("--duplicate-percent=3")
            .arg(format!("--seed={}", settings.seed))
            .arg(format!("--rate-per-second={}", settings.rate_per_second))
            .arg(format!("--manifest={}", manifest.display()))
            .env("RUST_LOG", "warn")
            .kill_on_drop(true)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the producer starts")
    }

    async fn orders_db(&self) -> Option<PgConnection> {
        PgConnection::connect(&self.cluster.url("orders")).await.ok()
    }

    /// Orders with a final answer in the consumers' table (None while the database restarts).
    async fn decided_orders(&self) -> Option<i64> {
        let mut connection = self.orders_db().await?;
        let decided = sqlx::query_scalar("SELECT count(*) FROM order_payments WHERE status <> 'requires_action'")
            .fetch_one(&mut connection)
            .await
            .ok();
        let _ = connection.close().await;
        decided
    }

    async fn unfinished_attempts(&self) -> i64 {
        let mut connection = PgConnection::connect(&self.cluster.url("chargeguard")).await.unwrap();
        let unfinished = sqlx::query_scalar("SELECT count(*) FROM payment_attempts WHERE status IN ('pending', 'requires_action')")
            .fetch_one(&mut connection)
            .await
            .unwrap();
        let _ = connection.close().await;
        unfinished
    }

    async fn sweep_once(&self) {
        let output = command(self.dir.path()).args(["--config", &self.replica_config(), "sweep", "--once"]).output().await.unwrap();
        assert!(output.status.success(), "sweep --once failed: {}", String::from_utf8_lossy(&output.stderr));
    }

    fn logs(&self) -> String {
        let names = ["simulator", "consumer-0", "consumer-1", "consumer-2"];
        let processes = names.iter().map(|name| format!("--- {name}\n{}\n", log_tail(self.dir.path(), name)));
        let replicas = self.replicas.iter().enumerate().map(|(index, replica)| format!("--- replica-{index}\n{}\n", replica.stderr_tail()));
        processes.chain(replicas).collect()
    }
}

#[derive(Debug, Default)]
struct Figures {
    events: BTreeMap<&'static str, u32>,
}

impl Chaos {
    fn name(self) -> &'static str {
        match self {
            Self::KillConsumer => "consumer kills (SIGKILL)",
            Self::KillReplica => "replica kills (SIGKILL)",
            Self::RestartDatabase => "database restarts (immediate)",
            Self::RestartBrokerConnections => "broker connection restarts",
        }
    }
}

/// The producer's output once it exited, which must be with success.
async fn producer_output(producing: &mut tokio::task::JoinHandle<std::io::Result<std::process::Output>>) -> std::process::Output {
    let output = producing.await.unwrap().unwrap();
    assert!(output.status.success(), "the producer failed: {}", String::from_utf8_lossy(&output.stderr));
    output
}

async fn strike(rig: &mut Rig, chaos: Chaos, rng: &mut impl Rng) {
    match chaos {
        Chaos::KillConsumer => {
            let consumer = &mut rig.consumers[rng.gen_range(0..CONSUMERS)];
            consumer.kill_9();
            tokio::time::sleep(Duration::from_secs(1)).await;
            consumer.start();
        }
        Chaos::KillReplica => {
            let replica = &mut rig.replicas[rng.gen_range(0..REPLICAS)];
            replica.kill_9();
            tokio::time::sleep(Duration::from_millis(500)).await;
            replica.start().await;
        }
        Chaos::RestartDatabase => rig.cluster.restart_immediately().await,
        Chaos::RestartBrokerConnections => rig.vhost.close_connections(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_is_charged_once_or_declined_through_kills_restarts_and_provider_faults() {
    let settings = Settings::from_env();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(settings.seed);
    let mut rig = Rig::start(settings.seed).await;
    rig.simulator
        .control(
            reqwest::Method::POST,
            "faults",
            Some(serde_json::json!({"target": "*", "spec": {"kind": {"mixed": 3000}, "trigger": {"probability": 0.1}}})),
        )
        .await;
    for consumer in &mut rig.consumers {
        consumer.start();
    }
    let manifest_path = rig.dir.path().join("manifest.jsonl");
    let started = Instant::now();
    let producer = rig.publish(&settings, &manifest_path);
    let mut producing = tokio::spawn(producer.wait_with_output());
    let mut produced = None;
    let mut figures = Figures::default();
    let mut next_strike = Instant::now() + settings.kill_every;
    let mut next_progress = Instant::now();
    loop {
        for consumer in &mut rig.consumers {
            consumer.assert_running();
        }
        // A producer that failed fails the run now, not at the deadline.
        if produced.is_none() && producing.is_finished() {
            produced = Some(producer_output(&mut producing).await);
        }
        let decided = rig.decided_orders().await;
        if decided == Some(i64::from(settings.orders)) {
            break;
        }
        if Instant::now() >= next_progress {
            eprintln!("chaos: {:>5.1} s, {decided:?} of {} orders decided, events {:?}", started.elapsed().as_secs_f64(), settings.orders, figures.events);
            next_progress = Instant::now() + Duration::from_secs(10);
        }
        assert!(
            started.elapsed() < settings.deadline,
            "not every order decided within {:?} ({:?} decided); events {:?}\n{}",
            settings.deadline,
            rig.decided_orders().await,
            figures.events,
            rig.logs()
        );
        if Instant::now() >= next_strike {
            let struck: u32 = figures.events.values().sum();
            let chaos = OPENING.get(struck as usize).copied().unwrap_or_else(|| OPENING[rng.gen_range(0..OPENING.len())]);
            strike(&mut rig, chaos, &mut rng).await;
            *figures.events.entry(chaos.name()).or_default() += 1;
            next_strike = Instant::now() + settings.kill_every;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let all_decided_after = started.elapsed();
    let produced = match produced {
        Some(output) => output,
        None => producer_output(&mut producing).await,
    };
    let published: serde_json::Value = serde_json::from_slice(&produced.stdout).expect("the producer prints its figures");
    // The faults stop; the sweep completes what nobody came back for (e.g. an attempt whose
    // caller gave up), run here to completion rather than waiting for its schedule.
    rig.simulator.control(reqwest::Method::DELETE, "faults", None).await;
    for pass in 0.. {
        if rig.unfinished_attempts().await == 0 {
            break;
        }
        assert!(pass < 60, "attempts still unfinished after 60 sweep passes");
        rig.sweep_once().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let manifest: Vec<serde_json::Value> = std::fs::read_to_string(&manifest_path)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let ledger = rig.simulator.control(reqwest::Method::GET, "ledger", None).await;
    let mut succeeded: HashMap<String, Vec<String>> = HashMap::new();
    for intent in ledger["payment_intents"].as_array().unwrap() {
        if intent["status"] == "succeeded" {
            let order_id = intent["metadata"]["order_id"].as_str().unwrap_or_default().to_owned();
            succeeded.entry(order_id).or_default().push(intent["id"].as_str().unwrap().to_owned());
        }
    }
    let mut orders_db = rig.orders_db().await.expect("orders database");
    let rows: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT order_id, status, provider_payment_id FROM order_payments").fetch_all(&mut orders_db).await.unwrap();
    let recorded: HashMap<String, (String, Option<String>)> = rows.into_iter().map(|(id, status, intent)| (id, (status, intent))).collect();
    let mut dead_lettered_declines = 0;
    for planned in &manifest {
        let order_id = planned["order_id"].as_str().unwrap();
        let charges = succeeded.get(order_id).map_or(&[][..], Vec::as_slice);
        let (status, intent) = recorded.get(order_id).unwrap_or_else(|| panic!("order {order_id} lost: not in the consumers' table"));
        if planned["declining"].as_bool().unwrap() {
            assert!(charges.is_empty(), "declining order {order_id} charged: {charges:?}");
            assert!(status == "declined" || status == "rejected", "declining order {order_id} recorded {status}");
            dead_lettered_declines += u32::from(status == "rejected");
        } else {
            assert_eq!(charges.len(), 1, "order {order_id} must be charged exactly once, found {charges:?}");
            assert_eq!(status, "paid", "order {order_id}");
            assert_eq!(intent.as_deref(), Some(charges[0].as_str()), "order {order_id} records the intent that charged it");
        }
    }
    assert_eq!(succeeded.len(), manifest.iter().filter(|planned| !planned["declining"].as_bool().unwrap()).count(), "a charge for no order");
    let dead_letters = rig.vhost.queue_messages(&format!("{QUEUE}.dead"));
    assert!(u64::from(dead_lettered_declines) <= dead_letters, "every rejected order is in the dead-letter queue");

    // From yesterday: a run across midnight (UTC) charged on both days. The database is this
    // run's own, so the period holds nothing else.
    let yesterday = (chrono::Utc::now() - chrono::Duration::days(1)).date_naive().to_string();
    let report = command(rig.dir.path())
        .args(["--config", &rig.replica_config(), "report", "--from", &yesterday, "--to", "today", "--format", "json"])
        .output()
        .await
        .unwrap();
    assert!(
        report.status.success(),
        "the report for the period is not clean (exit {:?}):\n{}\n{}",
        report.status.code(),
        String::from_utf8_lossy(&report.stdout).chars().take(4_000).collect::<String>(),
        String::from_utf8_lossy(&report.stderr)
    );

    let counters: Vec<(String, i64)> =
        sqlx::query_as("SELECT name, value FROM consumer_counters ORDER BY name").fetch_all(&mut orders_db).await.unwrap();
    let deliveries: i64 = sqlx::query_scalar("SELECT coalesce(sum(deliveries), 0)::bigint FROM order_deliveries").fetch_one(&mut orders_db).await.unwrap();
    let slowest: f64 = sqlx::query_scalar("SELECT coalesce(extract(epoch FROM max(decided_at - placed_at)), 0)::float8 FROM order_payments")
        .fetch_one(&mut orders_db)
        .await
        .unwrap();
    let faults = rig.simulator.control(reqwest::Method::GET, "faults/fired", None).await;
    println!("chaos figures (seed {}):", settings.seed);
    println!("  orders {} (messages {}, published twice {}, declining {})", settings.orders, published["messages"], published["published_twice"], published["declining"]);
    println!("  consumer deliveries {deliveries} (broker redeliveries and retries included), dead letters {dead_letters}");
    for (name, count) in &figures.events {
        println!("  {name}: {count}");
    }
    println!("  provider faults fired: {faults}");
    for (name, value) in &counters {
        println!("  consumer {name}: {value}");
    }
    println!("  every order decided after {:.1} s; slowest order's time to its final answer {slowest:.1} s", all_decided_after.as_secs_f64());
}
