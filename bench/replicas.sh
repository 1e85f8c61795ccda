#!/usr/bin/env bash
# Scale-out: new charges with 1, 2 and 3 `serve` replicas on one PostgreSQL database, beside
# pgbench running the service's new-charge SQL at the same total concurrency, in one run
# (README "Benchmarks", BENCHMARKS.md "Replicas").
#
#   bench/replicas.sh                    15 s per row after 3 s of warm-up
#   BENCH_SECONDS=5 bench/replicas.sh    a quick look
#
# Each replica gets its own load generator (`chargeguard bench charge`) with an equal share of
# BENCH_CONCURRENCY (18: 18, 9+9, 6+6+6), the way consumers spread their calls; the figure is
# their sum. Everything runs on this machine's cores: the replicas, their load generators, the
# simulator and PostgreSQL share them, which is what the figures measure.
set -euo pipefail
cd "$(dirname "$0")/.."

CONCURRENCY=${BENCH_CONCURRENCY:-18}
SECONDS_MEASURED=${BENCH_SECONDS:-15}
SECONDS_WARMUP=${BENCH_WARMUP_SECONDS:-3}
PGHOST=${BENCH_PGHOST:-127.0.0.1}
PGPORT=${BENCH_PGPORT:-5432}
PGUSER=${BENCH_PGUSER:-postgres}
SIM_ADDR=${BENCH_SIM_ADDR:-127.0.0.1:18211}
PORT_BASE=${BENCH_PORT_BASE:-18250}
OUT=${BENCH_OUT:-target/bench-replicas}
DB=cg_bench_replicas
SIM_API_KEY=sk_test_chargeguard
BIN=target/release/chargeguard
export PGHOST PGPORT PGUSER
export RUST_LOG=${RUST_LOG:-warn}
mkdir -p "$OUT"
rm -f "$OUT"/*

log() { printf '\n== %s\n' "$*"; }
fail() { echo "bench/replicas.sh: $*" >&2; exit 1; }
# shellcheck source=bench/common.sh
source bench/common.sh
db_url() { echo "postgres://$PGUSER@$PGHOST:$PGPORT/$1"; }
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  psql -d postgres -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT
json_field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(list(d.values())[0][sys.argv[2]])' "$1" "$2"; }

log "building release"
cargo build --release --quiet
command -v pgbench >/dev/null || fail "pgbench is missing"
pg_isready -h "$PGHOST" -p "$PGPORT" -q || fail "PostgreSQL is not running on $PGHOST:$PGPORT (bash .ci/run starts it)"
psql -d postgres -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null
psql -d postgres -qc "CREATE DATABASE $DB" >/dev/null
CHARGEGUARD_DATABASE__URL=$(db_url $DB) "$BIN" migrate >/dev/null

"$BIN" stripe-sim --listen "$SIM_ADDR" --api-key "$SIM_API_KEY" "${SIM_LIMITS[@]}" >"$OUT/sim.log" 2>&1 &
pids+=($!)
wait_http "http://$SIM_ADDR/_sim/clock" 200

token=$(od -An -tx1 -N24 /dev/urandom | tr -d ' \n')

# pgbench: the service's new-charge SQL with the constants the service binds, same concurrency.
source bench/pgbench/new_charge_values.sh
log "pgbench new-charge SQL, $CONCURRENCY clients"
pgbench -n -M prepared -c "$CONCURRENCY" -j 2 -T "$SECONDS_WARMUP" -f bench/pgbench/new_charge.sql "${PGBENCH_VALUES[@]}" $DB >/dev/null 2>&1
pgbench -n -M prepared -c "$CONCURRENCY" -j 2 -T "$SECONDS_MEASURED" -f bench/pgbench/new_charge.sql "${PGBENCH_VALUES[@]}" $DB >"$OUT/pgbench.log" 2>&1
pgbench_tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$OUT/pgbench.log")
echo "tps $pgbench_tps"

rows=()
for replicas in 1 2 3; do
  log "$replicas replica(s), $CONCURRENCY callers spread over them"
  serve_pids=()
  for index in $(seq 1 "$replicas"); do
    grpc="127.0.0.1:$(( PORT_BASE + 2 * index ))"
    http="127.0.0.1:$(( PORT_BASE + 2 * index + 1 ))"
    # The benchmarks' one serve config (bench/common.sh) at this replica's addresses, its
    # share of the pool, and the sweep off.
    {
      GRPC_ADDR=$grpc HTTP_ADDR=$http serve_config "$BIN" "$token" $(( (CONCURRENCY + replicas - 1) / replicas ))
      printf '\n[sweep]\nenabled = false\nconcurrency_max = 1\n'
    } >"$OUT/serve-$replicas-$index.toml"
    CHARGEGUARD_DATABASE__URL=$(db_url $DB) CHARGEGUARD_PROVIDER__API_KEY=$SIM_API_KEY \
      "$BIN" --config "$OUT/serve-$replicas-$index.toml" serve --no-migrate >"$OUT/serve-$replicas-$index.log" 2>&1 &
    serve_pids+=($!)
    pids+=($!)
    wait_http "http://$http/readyz" 200
  done
  load_pids=()
  for index in $(seq 1 "$replicas"); do
    CHARGEGUARD_BENCH_TOKEN=$token "$BIN" bench charge --endpoint "http://127.0.0.1:$(( PORT_BASE + 2 * index ))" \
      --label "replicas-$replicas-$index" --concurrency $(( CONCURRENCY / replicas )) --connections 2 \
      --key-prefix "r$replicas-$index-" --duration-seconds "$SECONDS_MEASURED" --warmup-seconds "$SECONDS_WARMUP" \
      --json-out "$OUT/load-$replicas-$index.json" >/dev/null &
    load_pids+=($!)
  done
  for pid in "${load_pids[@]}"; do wait "$pid"; done
  total=0
  for index in $(seq 1 "$replicas"); do
    rate=$(json_field "$OUT/load-$replicas-$index.json" ok_per_second)
    total=$(python3 -c "print(round($total + $rate, 1))")
  done
  echo "new charges/s $total"
  rows+=("$replicas $total")
  for pid in "${serve_pids[@]}"; do kill -TERM "$pid"; wait "$pid" || true; done
done

log "new charges against pgbench's new-charge SQL ($CONCURRENCY clients, $(nproc) cores)"
printf '%-9s %14s %10s\n' replicas "charges/s" "× pgbench"
printf '%-9s %14s %10s\n' pgbench "$pgbench_tps" "1.00"
for row in "${rows[@]}"; do
  set -- $row
  printf '%-9s %14s %10s\n' "$1" "$2" "$(python3 -c "print(f'{$2 / $pgbench_tps:.2f}')")"
done
