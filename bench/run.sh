#!/usr/bin/env bash
# chargeguard's Charge against the PostgreSQL limit, side by side, on this machine (BENCHMARKS.md).
#
#   bench/run.sh                     the full run, the release build included, in at most
#                                    BENCH_BUDGET_SECONDS (13½ minutes)
#   BENCH_SCALE=small bench/run.sh   seconds-long phases, to check the script itself (the test
#                                    suite runs it so, with BENCH_BIN: its own build, nothing built)
#
# From a clean checkout: builds release, makes sure PostgreSQL runs, creates fresh benchmark
# databases, starts the Stripe simulator and `chargeguard serve` as their own processes (all on
# 127.0.0.1), then measures, in this order:
#   1. pgbench, the service's new-charge SQL (bench/pgbench/new_charge.sql) at the concurrency;
#   2. pgbench, the duplicate path's select-by-key (bench/pgbench/by_key.sql);
#   3. `chargeguard bench charge`, new operations, simulator at zero added latency;
#   4. the same, every call a duplicate of an already-charged operation (decided outcomes are
#      answered from memory: charge.outcome_cache_ttl_ms at its default);
#   5. the same as 3 with the simulator's latency set to BENCH_SIM_LATENCY_MS, then the simulator
#      alone at that setting (creates straight to it, same concurrency: its own latency), then
#      pgbench's new-charge SQL at the rate the service reached (its own latency at that load);
#   6. gRPC health checks on the same server and connections: the ceiling of any unary call here
#      (no database, no provider), which bounds what 3 and 4 could reach on this machine; then
#      creates straight to the simulator at 0 ms: with 6, the CPU a charge costs outside the
#      database (the "non-database floor" of the group commit table);
#   7. the service's peak RSS over 3-6 (VmHWM); then 4 again on a service started with the
#      outcome cache off (every duplicate reads the database), side by side;
#   7b. group commit side by side (issue 21), at each concurrency of
#      BENCH_GROUP_COMMIT_CONCURRENCY ("16 64"; empty skips it): pgbench's new-charge SQL with
#      that many clients, then new charges on a service with database.group_commit.enabled true,
#      then false (pool = that many connections for both), and at BENCH_CONCURRENCY each service
#      again with the simulator at BENCH_SIM_LATENCY_MS and, after on, the simulator alone at it;
#      each service's peak RSS; pgbench and on in BENCH_SIDE_BY_SIDE_ROUNDS interleaved rounds
#      (3; 1 at small scale), off in the first, the summary reading the rounds' medians;
#   8. (unless BENCH_SWEEP=0) the sweep over BENCH_STUCK_ROWS stuck rows in a table of BENCH_SWEEP_ROWS_SMALL rows, then
#      of BENCH_SWEEP_ROWS_LARGE rows or the largest that fits the time left (it says which):
#      the claim query alone (`chargeguard bench claim`), and `chargeguard sweep --once` when
#      this build has it;
# then prints the figures, the service/pgbench ratios and the targets, and stops by itself.
# Every value below can be set in the environment. Results: $BENCH_OUT/summary.{txt,json}.
set -euo pipefail
cd "$(dirname "$0")/.."
started_at=$(date +%s)

scale=${BENCH_SCALE:-full}
if [ "$scale" = small ]; then
  small_defaults=1
else
  small_defaults=0
fi
pick() { if [ "$small_defaults" = 1 ]; then echo "$2"; else echo "$1"; fi; }

CONCURRENCY=${BENCH_CONCURRENCY:-16}
CONNECTIONS=${BENCH_CONNECTIONS:-4}
SECONDS_MEASURED=${BENCH_SECONDS:-$(pick 15 3)}
SECONDS_WARMUP=${BENCH_WARMUP_SECONDS:-$(pick 3 1)}
SIM_LATENCY_MS=${BENCH_SIM_LATENCY_MS:-20}
PRIME_KEYS=${BENCH_PRIME_KEYS:-$(pick 2000 200)}
CHARGE_TABLE_ROWS=${BENCH_CHARGE_TABLE_ROWS:-$(pick 100000 10000)}
STUCK_ROWS=${BENCH_STUCK_ROWS:-$(pick 10000 1000)}
SWEEP_ROWS_SMALL=${BENCH_SWEEP_ROWS_SMALL:-$(pick 1000000 100000)}
SWEEP_ROWS_LARGE=${BENCH_SWEEP_ROWS_LARGE:-$(pick 10000000 300000)}
SWEEP_BATCH=${BENCH_SWEEP_BATCH:-100}
SWEEP=${BENCH_SWEEP:-1}
GROUP_COMMIT_CONCURRENCY=${BENCH_GROUP_COMMIT_CONCURRENCY-16 64}
SIDE_BY_SIDE_ROUNDS=${BENCH_SIDE_BY_SIDE_ROUNDS:-$(pick 3 1)}
# The whole run, the build included, stays under this: the large sweep table shrinks to fit what
# is left. From an empty target/ the release build takes 4½ minutes on 2 idle cores.
BUDGET_SECONDS=${BENCH_BUDGET_SECONDS:-810}
PGHOST=${BENCH_PGHOST:-127.0.0.1}
PGPORT=${BENCH_PGPORT:-5432}
PGUSER=${BENCH_PGUSER:-postgres}
SIM_ADDR=${BENCH_SIM_ADDR:-127.0.0.1:18111}
GRPC_ADDR=${BENCH_GRPC_ADDR:-127.0.0.1:18051}
HTTP_ADDR=${BENCH_HTTP_ADDR:-127.0.0.1:18080}
OUT=${BENCH_OUT:-target/bench-run}
KEEP_DATABASES=${BENCH_KEEP_DATABASES:-0}
CHARGE_DB=cg_bench_charge
SWEEP_DB=cg_bench_sweep
SIM_API_KEY=sk_test_chargeguard
# The binary measured: this checkout's release build, or BENCH_BIN (then nothing is built).
BIN=${BENCH_BIN:-target/release/chargeguard}

export PGHOST PGPORT PGUSER
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.log "$OUT"/*.txt "$OUT"/pgbench-at-rate.*
export RUST_LOG=${RUST_LOG:-warn}

log() { printf '\n== [%4ds] %s\n' "$(( $(date +%s) - started_at ))" "$*"; }
fail() { echo "bench/run.sh: $*" >&2; exit 1; }
elapsed() { echo $(( $(date +%s) - started_at )); }
db_url() { echo "postgres://$PGUSER@$PGHOST:$PGPORT/$1"; }

# Processes this script started, stopped by their own ids on any exit.
sim_pid=""
serve_pid=""
cleanup() {
  for pid in $serve_pid $sim_pid; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  if [ "$KEEP_DATABASES" != 1 ] && command -v psql >/dev/null 2>&1; then
    for db in $CHARGE_DB $SWEEP_DB; do
      psql -d postgres -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
    done
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ensure_postgres() {
  if pg_isready -h "$PGHOST" -p "$PGPORT" -q 2>/dev/null; then return; fi
  if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    log "installing PostgreSQL"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  local version
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  log "starting PostgreSQL $version"
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  for _ in $(seq 1 60); do pg_isready -h "$PGHOST" -p "$PGPORT" -q && break; sleep 1; done
  pg_isready -h "$PGHOST" -p "$PGPORT" -q || fail "PostgreSQL did not start on $PGHOST:$PGPORT"
}

fresh_database() {
  psql -d postgres -qc "DROP DATABASE IF EXISTS $1 WITH (FORCE)" >/dev/null
  psql -d postgres -qc "CREATE DATABASE $1" >/dev/null
  CHARGEGUARD_DATABASE__URL=$(db_url "$1") "$BIN" migrate >/dev/null
}

port_free() {
  ! (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null
}

json_field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(list(d.values())[0][sys.argv[2]])' "$1" "$2"; }

# --- build and services ------------------------------------------------------------------------
build_started=$(date +%s)
if [ -n "${BENCH_BIN:-}" ]; then
  log "measuring $BIN (BENCH_BIN): nothing built"
  [ -x "$BIN" ] || fail "BENCH_BIN=$BIN is not an executable"
else
  log "building release"
  cargo build --release --quiet
fi
build_seconds=$(( $(date +%s) - build_started ))
measuring_started=$(date +%s)

command -v pgbench >/dev/null 2>&1 || fail "pgbench is missing (it comes with the postgresql server package)"
command -v python3 >/dev/null 2>&1 || fail "python3 is missing (it prints the summary)"
command -v curl >/dev/null 2>&1 || fail "curl is missing (it talks to the simulator's controls)"
ensure_postgres
for addr in "$SIM_ADDR" "$GRPC_ADDR" "$HTTP_ADDR"; do
  port_free "$addr" || fail "$addr is in use; set BENCH_SIM_ADDR / BENCH_GRPC_ADDR / BENCH_HTTP_ADDR"
done

log "fresh database $CHARGE_DB with $CHARGE_TABLE_ROWS settled rows"
fresh_database $CHARGE_DB
CHARGEGUARD_DATABASE__URL=$(db_url $CHARGE_DB) "$BIN" bench seed --settled "$CHARGE_TABLE_ROWS" \
  --json-out "$OUT/seed-charge.json" >/dev/null

# --- pgbench: the limit --------------------------------------------------------------------------
# The constants the service binds for a new charge of `chargeguard bench charge`.
# shellcheck source=bench/pgbench/new_charge_values.sh
source bench/pgbench/new_charge_values.sh
# shellcheck source=bench/common.sh
source bench/common.sh
# Where one row's CPU went: `cpu_begin`, run the row under `timed` (which records the client's
# own CPU), `cpu_end label`. Per-call figures are in summary.py (whole run, warm-up included).
# The WAL written during the row comes with it (bytes and full-page images).
cpu_begin() {
  read -r cpu_wal_bytes0 cpu_wal_fpi0 < <(wal_totals)
  cpu_pg0=$(postgres_ticks); cpu_serve0=$(pid_ticks "$serve_pid"); cpu_sim0=$(pid_ticks "$sim_pid"); cpu_t0=$(date +%s.%N)
}
cpu_end() { # label
  local wal_bytes wal_fpi
  read -r wal_bytes wal_fpi < <(wal_totals)
  printf '{"postgres_ticks": %s, "service_ticks": %s, "simulator_ticks": %s, "client_seconds": %s, "wall_seconds": %s, "ticks_per_second": %s, "wal_bytes": %s, "wal_fpi": %s}\n' \
    $(( $(postgres_ticks) - cpu_pg0 )) $(( $(pid_ticks "$serve_pid") - cpu_serve0 )) $(( $(pid_ticks "$sim_pid") - cpu_sim0 )) \
    "$(cat "$OUT/client-cpu.tmp" 2>/dev/null || echo null)" "$(python3 -c 'import sys, time; print(round(time.time() - float(sys.argv[1]), 3))' "$cpu_t0")" "$(getconf CLK_TCK)" \
    $(( wal_bytes - cpu_wal_bytes0 )) $(( wal_fpi - cpu_wal_fpi0 )) >"$OUT/cpu-$1.json"
  rm -f "$OUT/client-cpu.tmp"
}
# Runs a client command and keeps its own CPU seconds (user + system) for cpu_end.
timed() {
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -f '%U %S' -o "$OUT/client-cpu.raw" "$@"
    awk '{print $1 + $2}' "$OUT/client-cpu.raw" >"$OUT/client-cpu.tmp"
  else
    "$@"
  fi
}

pgbench_run() { # label script seconds [extra args]
  local label=$1 script=$2 seconds=$3
  shift 3
  cpu_begin
  timed pgbench -n -M prepared -c "$CONCURRENCY" -j 2 -T "$seconds" -f "$script" "$@" $CHARGE_DB \
    >"$OUT/pgbench-$label.log" 2>&1 || { cat "$OUT/pgbench-$label.log" >&2; fail "pgbench $label failed"; }
  cpu_end "pgbench-$label"
}
pgbench_tps() { sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$OUT/pgbench-$1.log"; }
pgbench_latency() { sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' "$OUT/pgbench-$1.log"; }

log "pgbench new-charge SQL, $CONCURRENCY clients, ${SECONDS_WARMUP}s warm-up + ${SECONDS_MEASURED}s"
checkpoint
pgbench_run new-warmup bench/pgbench/new_charge.sql "$SECONDS_WARMUP" "${PGBENCH_VALUES[@]}"
pgbench_run new bench/pgbench/new_charge.sql "$SECONDS_MEASURED" "${PGBENCH_VALUES[@]}"
echo "tps $(pgbench_tps new), latency average $(pgbench_latency new) ms"

log "pgbench select-by-key, $CONCURRENCY clients"
BY_KEY_VALUES=(-D consumer=bench-seed -D "rows=$CHARGE_TABLE_ROWS")
checkpoint
pgbench_run by-key-warmup bench/pgbench/by_key.sql "$SECONDS_WARMUP" "${BY_KEY_VALUES[@]}"
pgbench_run by-key bench/pgbench/by_key.sql "$SECONDS_MEASURED" "${BY_KEY_VALUES[@]}"
echo "tps $(pgbench_tps by-key), latency average $(pgbench_latency by-key) ms"

# --- the service -----------------------------------------------------------------------------------
log "starting the simulator on $SIM_ADDR and chargeguard on $GRPC_ADDR"
# A fresh simulator for every service run, as compare.sh and latency.sh start theirs. It keeps
# every object it made (~5 KB of memory each with its idempotency entry and search snapshot;
# 7.7 KB in run 32), and one simulator for the whole run had made over 300,000 intents by the
# side by side (~225,000 of them in the row that measures the simulator by itself), growing by
# ~400 MB a row while the rows ran: its CPU per charge rose from 70 µs in the first row to
# 105-119 µs in the side by side (run 32), a cost of the stand-in's ledger on the cores the
# service shares, which pgbench never pays and Stripe never puts on ours (BENCHMARKS.md,
# twenty-third round). start_sim (bench/common.sh) stops the previous one first.

token=$(od -An -tx1 -N24 /dev/urandom | tr -d ' \n')
serve_config "$BIN" "$token" "$CONCURRENCY" >"$OUT/serve.toml"
service_env=(
  CHARGEGUARD_DATABASE__URL="$(db_url $CHARGE_DB)"
  CHARGEGUARD_PROVIDER__API_KEY="$SIM_API_KEY"
  # Nothing is due in this database; the sweep stays out of the charge figures.
  CHARGEGUARD_SWEEP__ENABLED=false
)
start_service() { # log-name [extra VAR=value ...]
  local log_name=$1
  shift
  start_sim "$BIN" "$OUT/sim.log"
  env "${service_env[@]}" "$@" "$BIN" --config "$OUT/serve.toml" serve --no-migrate >"$OUT/$log_name.log" 2>&1 &
  serve_pid=$!
  wait_http "http://$HTTP_ADDR/readyz"
}
stop_service() {
  kill -TERM "$serve_pid"
  wait "$serve_pid" || true
  serve_pid=""
}
start_service serve

bench_charge() { # label [extra args]
  local label=$1
  shift
  checkpoint
  cpu_begin
  timed env CHARGEGUARD_BENCH_TOKEN="$token" "$BIN" bench charge --endpoint "http://$GRPC_ADDR" --label "$label" \
    --concurrency "$CONCURRENCY" --connections "$CONNECTIONS" --duration-seconds "$SECONDS_MEASURED" \
    --warmup-seconds "$SECONDS_WARMUP" --json-out "$OUT/service-$label.json" "$@" | grep -v '^{'
  cpu_end "service-$label"
}

log "chargeguard new charges, simulator at 0 ms"
set_sim_latency 0
bench_charge new
log "chargeguard duplicates ($PRIME_KEYS operations charged first)"
bench_charge duplicate --duplicate-percent 100 --prime-keys "$PRIME_KEYS"
log "chargeguard new charges, simulator at $SIM_LATENCY_MS ms"
set_sim_latency "$SIM_LATENCY_MS"
bench_charge new-latency
# The simulator's own latency at this setting and concurrency (its timer and handling add to the
# configured figure): creates sent straight to it through chargeguard's provider client.
log "the simulator alone at $SIM_LATENCY_MS ms, $CONCURRENCY callers"
CHARGEGUARD_BENCH_PROVIDER_API_KEY=$SIM_API_KEY "$BIN" bench charge --provider-url "http://$SIM_ADDR/" \
  --label provider-latency --concurrency "$CONCURRENCY" --connections "$CONNECTIONS" \
  --duration-seconds "$SECONDS_MEASURED" --warmup-seconds "$SECONDS_WARMUP" \
  --json-out "$OUT/service-provider-latency.json" | grep -v '^{'
set_sim_latency 0

# The same SQL at the rate the service just reached, one transaction logged per line: how much of
# the service's latency above the simulator's is PostgreSQL's own commit time at that load.
rate=$(json_field "$OUT/service-new-latency.json" ok_per_second)
log "pgbench new-charge SQL at the service's rate ($rate/s)"
checkpoint
pgbench_run new-at-rate-warmup bench/pgbench/new_charge.sql "$SECONDS_WARMUP" "${PGBENCH_VALUES[@]}" -R "$rate"
pgbench_run new-at-rate bench/pgbench/new_charge.sql "$SECONDS_MEASURED" "${PGBENCH_VALUES[@]}" \
  -R "$rate" -l --log-prefix="$OUT/pgbench-at-rate"

log "gRPC health checks on the same connections (the ceiling of a unary call here)"
bench_charge grpc-ceiling --health-check

# What a charge costs outside the database at the least: the call above (gRPC in and out) plus a
# create sent straight to the simulator at 0 ms through chargeguard's provider client. Their CPU
# per call, summed, is the floor no batching of SQL can go under (summary: "non-database floor").
log "the simulator alone at 0 ms, $CONCURRENCY callers (the provider call's own CPU)"
cpu_begin
timed env CHARGEGUARD_BENCH_PROVIDER_API_KEY=$SIM_API_KEY "$BIN" bench charge --provider-url "http://$SIM_ADDR/" \
  --label provider-floor --concurrency "$CONCURRENCY" --connections "$CONNECTIONS" \
  --duration-seconds "$SECONDS_MEASURED" --warmup-seconds "$SECONDS_WARMUP" \
  --json-out "$OUT/service-provider-floor.json" | grep -v '^{'
cpu_end service-provider-floor

peak_rss_kib=$(awk '/^VmHWM:/ {print $2}' "/proc/$serve_pid/status")
echo "service peak RSS: $peak_rss_kib KiB"
stop_service

# Side by side with row 4: the same duplicates when each one reads the database.
log "chargeguard duplicates, outcome cache off ($PRIME_KEYS other operations charged first)"
start_service serve-uncached CHARGEGUARD_CHARGE__OUTCOME_CACHE_TTL_MS=0
bench_charge duplicate-uncached --duplicate-percent 100 --prime-keys "$PRIME_KEYS"
stop_service

# --- group commit side by side (issue 21) ---------------------------------------------------------
# One service per switch and concurrency, each with as many pooled connections as callers (what
# pgbench gets): the gain of group commit is measured here, not claimed. Two rows of one
# configuration minutes apart move by up to ±20 % on this shared machine, as much as the whole
# distance of the ratio from 1.0, so pgbench and group commit on run in BENCH_SIDE_BY_SIDE_ROUNDS
# interleaved rounds (each round begins at a checkpoint) and the summary reads their median;
# off, whose gap is far wider than the drift, runs in the first round only. At BENCH_CONCURRENCY
# every round also measures the p99 target: the service on at the simulator's latency, then
# the simulator alone at that setting right after it.
round_suffix() { if [ "$1" -gt 1 ]; then echo "-r$1"; fi; }
for gc_concurrency in $GROUP_COMMIT_CONCURRENCY; do
  for gc_round in $(seq 1 "$SIDE_BY_SIDE_ROUNDS"); do
    r=$(round_suffix "$gc_round")
    log "group commit side by side at $gc_concurrency, round $gc_round of $SIDE_BY_SIDE_ROUNDS: pgbench new-charge SQL, ${SECONDS_WARMUP}s warm-up + ${SECONDS_MEASURED}s"
    checkpoint
    CONCURRENCY=$gc_concurrency pgbench_run "new-c$gc_concurrency$r-warmup" bench/pgbench/new_charge.sql \
      "$SECONDS_WARMUP" "${PGBENCH_VALUES[@]}"
    CONCURRENCY=$gc_concurrency pgbench_run "new-c$gc_concurrency$r" bench/pgbench/new_charge.sql \
      "$SECONDS_MEASURED" "${PGBENCH_VALUES[@]}"
    echo "tps $(pgbench_tps "new-c$gc_concurrency$r")"
    gc_switches="on off"
    [ "$gc_round" -gt 1 ] && gc_switches=on
    for gc_switch in $gc_switches; do
      gc_enabled=true
      [ "$gc_switch" = off ] && gc_enabled=false
      log "chargeguard new charges, group commit $gc_switch, $gc_concurrency callers, round $gc_round"
      start_service "serve-gc-$gc_switch-c$gc_concurrency$r" CHARGEGUARD_DATABASE__GROUP_COMMIT__ENABLED=$gc_enabled \
        CHARGEGUARD_DATABASE__CONNECTIONS_MAX="$gc_concurrency"
      CONCURRENCY=$gc_concurrency bench_charge "new-gc-$gc_switch-c$gc_concurrency$r"
      if [ "$gc_concurrency" = "$CONCURRENCY" ]; then
        set_sim_latency "$SIM_LATENCY_MS"
        bench_charge "new-latency-gc-$gc_switch$r"
        if [ "$gc_switch" = on ]; then
          CHARGEGUARD_BENCH_PROVIDER_API_KEY=$SIM_API_KEY "$BIN" bench charge --provider-url "http://$SIM_ADDR/" \
            --label "provider-latency-gc$r" --concurrency "$CONCURRENCY" --connections "$CONNECTIONS" \
            --duration-seconds "$SECONDS_MEASURED" --warmup-seconds "$SECONDS_WARMUP" \
            --json-out "$OUT/service-provider-latency-gc$r.json" | grep -v '^{'
        fi
        set_sim_latency 0
      fi
      printf '{"peak_rss": {"kib": %s}}\n' "$(awk '/^VmHWM:/ {print $2}' "/proc/$serve_pid/status")" \
        >"$OUT/rss-gc-$gc_switch-c$gc_concurrency$r.json"
      stop_service
    done
  done
done

# --- the sweep -------------------------------------------------------------------------------------
has_sweep=0
if "$BIN" sweep --help >/dev/null 2>&1; then has_sweep=1; fi
sweep_env=(
  CHARGEGUARD_DATABASE__URL="$(db_url $SWEEP_DB)"
  CHARGEGUARD_PROVIDER__API_KEY="$SIM_API_KEY"
  CHARGEGUARD_PROVIDER__BASE_URL="http://$SIM_ADDR/"
  CHARGEGUARD_DATABASE__CONNECTIONS_MAX="$CONCURRENCY"
  # One pass takes every stuck row (the option's limit is 10,000), as many in flight as the
  # charge runs had callers.
  CHARGEGUARD_SWEEP__BATCH_MAX="$(( STUCK_ROWS < 10000 ? STUCK_ROWS : 10000 ))"
  CHARGEGUARD_SWEEP__CONCURRENCY_MAX="$CONCURRENCY"
)

# A bulk-loaded table is timed at rest, as a production table is: vacuumed and analyzed (else
# autovacuum starts on it during the timings) and checkpointed (else the checkpointer is still
# writing the load out). Both sizes get the same treatment.
settle_seconds=0
settle_table() { # label
  local t0
  t0=$(date +%s)
  psql -d $SWEEP_DB -qc 'VACUUM (ANALYZE) payment_attempts' -c 'CHECKPOINT' >/dev/null
  settle_seconds=$(( $(date +%s) - t0 ))
  echo "vacuum, analyze and checkpoint of the $1 table: ${settle_seconds}s"
}

# Times the claim query over STUCK_ROWS fresh stuck rows, then (when this build has the
# subcommand) `chargeguard sweep --once` over another STUCK_ROWS, at the table's current size.
time_sweep() { # label
  local label=$1
  env "${sweep_env[@]}" "$BIN" bench seed --settle-unfinished --stuck "$STUCK_ROWS" \
    --json-out "$OUT/seed-$label-claim.json" >/dev/null
  env "${sweep_env[@]}" "$BIN" bench claim --batch-max "$SWEEP_BATCH" --rows-max "$STUCK_ROWS" \
    --json-out "$OUT/claim-$label.json" | grep -v '^{'
  if [ "$has_sweep" = 1 ]; then
    env "${sweep_env[@]}" "$BIN" bench seed --settle-unfinished --stuck "$STUCK_ROWS" \
      --json-out "$OUT/seed-$label-sweep.json" >/dev/null
    local t0 t1 due runs=0
    t0=$(date +%s.%N)
    # One pass takes at most sweep.batch_max rows: repeat until nothing is due (bounded).
    while [ $runs -lt 1000 ]; do
      env "${sweep_env[@]}" "$BIN" sweep --once >>"$OUT/sweep-$label.log" 2>&1
      runs=$((runs + 1))
      due=$(env "${sweep_env[@]}" "$BIN" bench seed --json-out "$OUT/due.json" >/dev/null; json_field "$OUT/due.json" due_now)
      [ "$due" = 0 ] && break
    done
    t1=$(date +%s.%N)
    python3 -c 'import json,sys; s=float(sys.argv[2])-float(sys.argv[1]); n=int(sys.argv[3]);
print(json.dumps({"chargeguard_bench_sweep": {"rows": n, "runs": int(sys.argv[4]), "elapsed_seconds": round(s,3), "ms_per_thousand_rows": round(s*1e6/n,3)}}))' \
      "$t0" "$t1" "$STUCK_ROWS" "$runs" >"$OUT/sweep-$label.json"
    echo "sweep --once: $STUCK_ROWS rows in $runs runs, $(json_field "$OUT/sweep-$label.json" elapsed_seconds) s"
  fi
}

sweep_rows_large=0
if [ "$SWEEP" = 1 ]; then
log "fresh database $SWEEP_DB: $SWEEP_ROWS_SMALL rows"
fresh_database $SWEEP_DB
env "${sweep_env[@]}" "$BIN" bench seed --settled "$SWEEP_ROWS_SMALL" --json-out "$OUT/seed-sweep-small.json" | grep -v '^{'
settle_table small
timings_started=$(elapsed)
time_sweep small
timings_seconds=$(( $(elapsed) - timings_started ))

# The large table, or the largest (in whole millions, or tenths at small scale) that the time left
# allows, judging by how fast the small one was seeded.
# Seeding plus settling, per row of the small table, is what growing the large one will cost.
seed_seconds=$(python3 -c 'import sys; print(float(sys.argv[1]) + float(sys.argv[2]))' \
  "$(json_field "$OUT/seed-sweep-small.json" elapsed_seconds)" "$settle_seconds")
step=$(( SWEEP_ROWS_SMALL >= 1000000 ? 1000000 : 100000 ))
# Reserve: the large table's timings (twice what the small ones took) and the summary.
reserve=$(( 20 + 2 * timings_seconds ))
left=$(( BUDGET_SECONDS - $(elapsed) - reserve ))
sweep_rows_large=$(python3 -c '
import sys
small, large, step, seconds, left = map(float, sys.argv[1:6])
rate = small / max(seconds, 0.1) * 0.8   # bigger index builds are slower per row
fits = small + max(left, 0) * rate
print(int(min(large, fits) // step * step))' \
  "$SWEEP_ROWS_SMALL" "$SWEEP_ROWS_LARGE" "$step" "$seed_seconds" "$left")
if [ "$sweep_rows_large" -gt "$SWEEP_ROWS_SMALL" ]; then
  log "growing $SWEEP_DB to $sweep_rows_large rows (asked for $SWEEP_ROWS_LARGE; ${left}s left for it)"
  env "${sweep_env[@]}" "$BIN" bench seed --settled $(( sweep_rows_large - SWEEP_ROWS_SMALL )) \
    --json-out "$OUT/seed-sweep-large.json" | grep -v '^{'
  settle_table large
  time_sweep large
else
  log "no time left for a larger sweep table (${left}s); only $SWEEP_ROWS_SMALL rows measured"
  sweep_rows_large=0
fi
else
  log "sweep skipped (BENCH_SWEEP=0)"
fi

set_sim_latency 0
kill -TERM "$sim_pid"
wait "$sim_pid" || true
sim_pid=""

# --- summary -------------------------------------------------------------------------------------
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then commit="$commit+uncommitted"; fi
{
  echo "scale=$scale"
  echo "commit=$commit"
  echo "host=$(hostname)"
  echo "cpu=$(nproc) x $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
  echo "memory_gib=$(awk '/MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo)"
  echo "kernel=$(uname -r)"
  echo "load_average_at_end=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "postgres=$(psql -d postgres -Atc 'SHOW server_version' | cut -d' ' -f1)"
  echo "postgres_settings=$(psql -d postgres -Atc "SELECT string_agg(name || '=' || setting || coalesce(unit, ''), ' ' ORDER BY name) FROM pg_settings WHERE name IN ('shared_buffers', 'synchronous_commit', 'fsync', 'wal_level', 'max_wal_size', 'max_connections')")"
  echo "concurrency=$CONCURRENCY"
  echo "connections=$CONNECTIONS"
  echo "seconds_measured=$SECONDS_MEASURED"
  echo "seconds_warmup=$SECONDS_WARMUP"
  echo "sim_latency_ms=$SIM_LATENCY_MS"
  echo "charge_table_rows=$CHARGE_TABLE_ROWS"
  echo "stuck_rows=$STUCK_ROWS"
  echo "sweep_batch=$SWEEP_BATCH"
  echo "sweep_rows_small=$SWEEP_ROWS_SMALL"
  echo "sweep=$SWEEP"
  echo "group_commit_concurrency=$GROUP_COMMIT_CONCURRENCY"
  echo "side_by_side_rounds=$SIDE_BY_SIDE_ROUNDS"
  echo "sweep_rows_large=$sweep_rows_large"
  echo "sweep_rows_large_asked=$SWEEP_ROWS_LARGE"
  echo "has_sweep=$has_sweep"
  echo "peak_rss_kib=$peak_rss_kib"
  echo "build_seconds=$build_seconds"
  echo "bench_bin=${BENCH_BIN:-}"
  echo "measuring_seconds=$(( $(date +%s) - measuring_started ))"
  echo "total_seconds=$(elapsed)"
} >"$OUT/run.env"
python3 bench/summary.py "$OUT" | tee "$OUT/summary.txt"
log "done; figures in $OUT/summary.txt and $OUT/summary.json"
