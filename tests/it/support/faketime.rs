//! Clocks that disagree, for real: libfaketime preloaded into a process moves its wall clock
//! (CLOCK_REALTIME) and leaves its monotonic clock alone, so its timers and timeouts still run
//! at the real pace. Two uses:
//!
//! - [`ClockOffset::apply`]: a child `chargeguard` process whose clock runs ahead or behind by a
//!   fixed offset (the environment `faketime -f +120m` sets, without the wrapper process that
//!   `faketime` forks, which would outlive a child killed on drop).
//! - [`FakeClockCluster`]: a private PostgreSQL cluster (initdb in a temporary directory, its
//!   own port) whose clock a test moves at runtime by rewriting a file, so that the database's
//!   `now()` keeps step with the simulator's clock while a replica drifts.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{Connection, PgConnection};

/// Names the cluster directories, with the test process's id after it (see
/// [`remove_leftovers`]).
const DIR_PREFIX: &str = "cg_it_faketime_";
/// How far a child's log timestamps may stray from the clock it was given (rounding; a slow
/// start on 2 shared cores is covered by reading the real time before and after).
const CHILD_CLOCK_SLACK: chrono::Duration = chrono::Duration::seconds(5);
/// How far the database's `now()` may be from the offset a test set (a slow, shared machine).
const OFFSET_CHECK_TOLERANCE: chrono::Duration = chrono::Duration::seconds(30);
/// pg_ctl's own bound on the server's start (`-t`), in seconds.
const START_WAIT_SECONDS: &str = "120";

/// How far a process's wall clock is moved from the real one, in whole seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockOffset {
    seconds: i64,
}

impl ClockOffset {
    /// The real clock: no libfaketime at all.
    pub const NONE: Self = Self { seconds: 0 };

    pub const fn minutes(minutes: i64) -> Self {
        Self { seconds: minutes * 60 }
    }

    /// `seconds` off the real clock (negative: behind it).
    pub const fn of_seconds(seconds: i64) -> Self {
        Self { seconds }
    }

    pub fn ahead_by(by: Duration) -> Self {
        Self { seconds: i64::try_from(by.as_secs()).expect("offset in range") }
    }

    pub fn seconds(self) -> i64 {
        self.seconds
    }

    /// libfaketime's relative offset. A number with no unit counts seconds, which sidesteps
    /// its one-unit rule (`+24h30m` would read as 24 minutes; `+88200` is 24 h 30 min).
    pub fn spec(self) -> String {
        format!("{:+}", self.seconds)
    }

    /// Checks `stamped`, an instant a child started at `started_at` (the real time just before)
    /// under this offset wrote with its own clock: a libfaketime that failed to load would leave
    /// a "skewed" child on the real clock, and a skew test passing for nothing.
    pub fn assert_read_by_child(self, stamped: DateTime<Utc>, started_at: DateTime<Utc>) {
        let offset = chrono::Duration::seconds(self.seconds);
        let earliest = started_at + offset - CHILD_CLOCK_SLACK;
        let latest = Utc::now() + offset + CHILD_CLOCK_SLACK;
        assert!(
            (earliest..=latest).contains(&stamped),
            "the child's clock reads {stamped}, not the real time {} s off",
            self.spec()
        );
    }

    /// Runs `command` with its wall clock moved by this offset (nothing for [`Self::NONE`]).
    pub fn apply(self, command: &mut tokio::process::Command) {
        if self == Self::NONE {
            return;
        }
        remove_stale_shared_memory();
        command
            .env("LD_PRELOAD", libfaketime())
            .env("FAKETIME", self.spec())
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    }
}

/// The preloadable library of Debian's `libfaketime` package (`.ci/run` installs it).
pub fn libfaketime() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let listed = Command::new("dpkg").args(["-L", "libfaketime"]).output();
        let listed = listed.map(|output| String::from_utf8_lossy(&output.stdout).into_owned());
        listed
            .unwrap_or_default()
            .lines()
            .find(|line| line.ends_with("/libfaketime.so.1"))
            .map(PathBuf::from)
            .expect("libfaketime is installed (apt-get install faketime libfaketime; .ci/run does)")
    })
}

/// The newest PostgreSQL server binaries on the machine (`/usr/lib/postgresql/<version>/bin`).
fn postgres_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let versions =
            std::fs::read_dir("/usr/lib/postgresql").expect("PostgreSQL server installed");
        let mut found: Vec<(u32, PathBuf)> = versions
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let version = entry.file_name().to_str()?.parse().ok()?;
                let bin = entry.path().join("bin");
                bin.join("initdb").exists().then_some((version, bin))
            })
            .collect();
        found.sort();
        found.pop().map(|(_, bin)| bin).expect("initdb under /usr/lib/postgresql/<version>/bin")
    })
}

pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0)
}

/// The server refuses to run as root: as root, its tools run as the `postgres` user.
pub fn as_server_user(program: PathBuf) -> Command {
    if is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn run(mut command: Command, what: &str) {
    let output = command.output().unwrap_or_else(|error| panic!("{what}: {error}"));
    assert!(
        output.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// libfaketime names its shared memory and semaphore after the pid of the first process that
/// loads it (`/dev/shm/faketime_shm_<pid>`, `sem.faketime_sem_<pid>`) and removes them when that
/// process exits normally. A killed one (the crash table kills replicas) leaves them behind,
/// owned by its user; a later process of another user (the cluster runs as postgres) that gets
/// the same pid then cannot create its own and fails to start. Before anything is started under
/// libfaketime, the entries of processes that no longer run are removed.
pub fn remove_stale_shared_memory() {
    let Ok(entries) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = ["faketime_shm_", "sem.faketime_sem_"]
            .iter()
            .find_map(|prefix| name.strip_prefix(prefix))
            .and_then(|pid| pid.parse::<u32>().ok());
        if let Some(pid) = pid
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Stops and removes the clusters of test processes that no longer run (killed before their
/// clusters' drop ran).
fn remove_leftovers() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(DIR_PREFIX) else {
            continue;
        };
        let pid: Option<u32> = rest.split('_').next().and_then(|pid| pid.parse().ok());
        if pid.is_none_or(|pid| Path::new(&format!("/proc/{pid}")).exists()) {
            continue;
        }
        stop_immediately(&entry.path().join("data"));
        let _ = std::fs::remove_dir_all(entry.path());
    }
}

/// `pg_ctl stop -m immediate`; a server that is not running makes it fail, which is fine.
fn stop_immediately(data_dir: &Path) {
    let mut pg_ctl = as_server_user(postgres_bin().join("pg_ctl"));
    pg_ctl.arg("-D").arg(data_dir).args(["-m", "immediate", "stop"]);
    let _ = pg_ctl.output();
}

#[derive(Debug, Clone, Copy)]
enum Commits {
    /// Acknowledged before the WAL is written (fast; a crash of the server may lose the last).
    Asynchronous,
    Synchronous,
}

/// A PostgreSQL cluster of one test, started under libfaketime; stopped (immediate) and removed
/// when dropped.
pub struct FakeClockCluster {
    dir: tempfile::TempDir,
    port: u16,
    /// What the timestamp file says now.
    offset: Mutex<ClockOffset>,
}

impl FakeClockCluster {
    /// initdb (trust auth), then start on a free port with the clock at the real time.
    pub async fn start() -> Self {
        tokio::task::spawn_blocking(|| Self::start_blocking(Commits::Asynchronous)).await.expect("cluster start task")
    }

    /// As [`Self::start`], with every commit in the WAL before it is acknowledged, so that an
    /// immediate restart ([`Self::restart_immediately`]) loses nothing a client was told was
    /// committed (the chaos test restarts the database under load).
    pub async fn start_durable() -> Self {
        tokio::task::spawn_blocking(|| Self::start_blocking(Commits::Synchronous)).await.expect("cluster start task")
    }

    /// `pg_ctl restart -m immediate`: every backend killed without a checkpoint, then crash
    /// recovery from the WAL, as after a power cut of the database's host (the OS's page cache
    /// survives it, which is why fsync stays off).
    pub async fn restart_immediately(&self) {
        // The restarted server keeps the options it was started with (postmaster.opts).
        let mut pg_ctl = self.pg_ctl_waiting();
        pg_ctl.args(["-m", "immediate", "restart"]);
        tokio::task::spawn_blocking(move || run(pg_ctl, "pg_ctl restart -m immediate"))
        .await
        .expect("cluster restart task");
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    fn start_blocking(commits: Commits) -> Self {
        static LEFTOVERS_REMOVED: OnceLock<()> = OnceLock::new();
        LEFTOVERS_REMOVED.get_or_init(remove_leftovers);
        remove_stale_shared_memory();
        let prefix = format!("{DIR_PREFIX}{}_", std::process::id());
        let dir = tempfile::Builder::new().prefix(&prefix).tempdir().expect("temporary directory");
        if is_root() {
            let mut chown = Command::new("chown");
            chown.arg("postgres:postgres").arg(dir.path());
            run(chown, "chown of the cluster directory");
        }
        let port = crate::ops::process::free_addr().port();
        let cluster = Self { dir, port, offset: Mutex::new(ClockOffset::NONE) };
        cluster.write_offset(ClockOffset::NONE);
        let mut initdb = as_server_user(postgres_bin().join("initdb"));
        initdb
            .arg("-D")
            .arg(cluster.data_dir())
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8"])
            .args(["--no-sync", "--no-instructions"]);
        run(initdb, "initdb");
        // Durability against the host's crash is not under test: a cluster lives for one test.
        // A durable cluster lives like a production one (the chaos test): commits in the WAL,
        // autovacuum keeping the planner's statistics.
        let (synchronous_commit, autovacuum) = match commits {
            Commits::Asynchronous => ("off", "off"),
            Commits::Synchronous => ("on", "on"),
        };
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -k {socket} -c fsync=off \
             -c synchronous_commit={synchronous_commit} -c full_page_writes=off -c autovacuum={autovacuum} \
             -c max_connections=200 -c shared_buffers=32MB",
            socket = cluster.dir.path().display(),
        );
        let mut pg_ctl = cluster.pg_ctl_waiting();
        pg_ctl.args(["-o", &options, "start"]);
        run(pg_ctl, "pg_ctl start");
        cluster
    }

    /// `pg_ctl` for this cluster's server, under libfaketime reading the cluster's timestamp
    /// file, logging to `server.log`, waiting up to `START_WAIT_SECONDS` for the server; the
    /// caller adds the action.
    fn pg_ctl_waiting(&self) -> Command {
        let mut pg_ctl = as_server_user(postgres_bin().join("pg_ctl"));
        pg_ctl
            .env("LD_PRELOAD", libfaketime())
            .env("FAKETIME_TIMESTAMP_FILE", self.timestamp_file())
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .arg("-D")
            .arg(self.data_dir())
            .arg("-l")
            .arg(self.dir.path().join("server.log"))
            .args(["-w", "-t", START_WAIT_SECONDS]);
        pg_ctl
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn timestamp_file(&self) -> PathBuf {
        self.dir.path().join("faketime")
    }

    fn write_offset(&self, offset: ClockOffset) {
        // Written whole, then renamed: the server reads the file on every clock call.
        let staged = self.dir.path().join("faketime.new");
        std::fs::write(&staged, offset.spec()).expect("timestamp file written");
        std::fs::rename(&staged, self.timestamp_file()).expect("timestamp file replaced");
        *self.offset.lock().unwrap() = offset;
    }

    /// `postgres://postgres@127.0.0.1:<port>/<database>`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    pub fn admin_url(&self) -> String {
        self.url("postgres")
    }

    pub fn offset(&self) -> ClockOffset {
        *self.offset.lock().unwrap()
    }

    /// Moves the database's clock forward by `by` (whole seconds) and checks that `now()` shows it.
    pub async fn advance(&self, by: Duration) {
        let seconds = self.offset().seconds + ClockOffset::ahead_by(by).seconds;
        self.set_offset(ClockOffset { seconds }).await;
    }

    pub async fn set_offset(&self, offset: ClockOffset) {
        self.write_offset(offset);
        let expected = Utc::now() + chrono::Duration::seconds(offset.seconds);
        let shown = self.now().await;
        assert!(
            (shown - expected).abs() < OFFSET_CHECK_TOLERANCE,
            "the database's clock did not move: now() = {shown}, expected about {expected}"
        );
    }

    /// The database's `now()`.
    pub async fn now(&self) -> DateTime<Utc> {
        let mut connection =
            PgConnection::connect(&self.admin_url()).await.expect("cluster accepts connections");
        let now = sqlx::query_scalar("SELECT now()").fetch_one(&mut connection).await.unwrap();
        let _ = connection.close().await;
        now
    }
}

impl Drop for FakeClockCluster {
    fn drop(&mut self) {
        // The directory goes with `dir` right after.
        stop_immediately(&self.data_dir());
    }
}
