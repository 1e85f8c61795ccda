#!/usr/bin/env bash
# New charges on a fresh database, and how the service read payment_attempts meanwhile (issue 21,
# BENCHMARKS.md "Group commit", ninth round). The other benchmarks seed and analyze their tables
# first; this one starts where a new deployment starts, with an empty table that ANALYZE has not
# seen, which is when the batch functions make the one plan each connection keeps.
#
#   bash bench/fresh_database.sh BIN [BIN ...]   e.g. target/compare/a-<rev> target/release/chargeguard
#
# Each binary in turn, BENCH_ROUNDS times (2), alternating: a new database, `chargeguard migrate`,
# its simulator and `serve` (bench/common.sh's configuration), BENCH_CONCURRENCY callers (16) for
# BENCH_SECONDS (8) after BENCH_WARMUP_SECONDS (2); then, once the service stopped (its backends
# flush their statistics as they exit), the table's sequential scans, the rows they read and the
# rows fetched through indexes, from pg_stat_user_tables.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bench/fresh_database.sh BIN [BIN ...]" >&2; exit 2; }
ROUNDS=${BENCH_ROUNDS:-2}
CONCURRENCY=${BENCH_CONCURRENCY:-16}
CONNECTIONS=${BENCH_CONNECTIONS:-4}
SECONDS_MEASURED=${BENCH_SECONDS:-8}
SECONDS_WARMUP=${BENCH_WARMUP_SECONDS:-2}
export PGHOST=${BENCH_PGHOST:-127.0.0.1} PGPORT=${BENCH_PGPORT:-5432} PGUSER=${BENCH_PGUSER:-postgres}
export RUST_LOG=${RUST_LOG:-warn}
DB=cg_bench_fresh
SIM_ADDR=127.0.0.1:18411
GRPC_ADDR=127.0.0.1:18451
HTTP_ADDR=127.0.0.1:18480
SIM_API_KEY=sk_test_chargeguard
OUT=${BENCH_OUT:-target/bench-fresh}
mkdir -p "$OUT"
# shellcheck source=bench/common.sh
source bench/common.sh

sim_pid="" serve_pid=""
trap 'stop_all; psql -d postgres -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true' EXIT

url="postgres://$PGUSER@$PGHOST:$PGPORT/$DB"
printf '%-40s %5s %10s %12s %16s %18s %12s\n' binary round charges/s "seq scans" "rows they read" "fetched by index" "rows written"
for round in $(seq 1 "$ROUNDS"); do
  for bin in "$@"; do
    psql -d postgres -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >/dev/null 2>&1
    CHARGEGUARD_DATABASE__URL=$url "$bin" migrate >/dev/null
    start_sim_and_serve "$bin" "$CONCURRENCY" fresh
    CHARGEGUARD_BENCH_TOKEN=$token "$bin" bench charge --endpoint "http://$GRPC_ADDR" \
      --concurrency "$CONCURRENCY" --connections "$CONNECTIONS" --duration-seconds "$SECONDS_MEASURED" \
      --warmup-seconds "$SECONDS_WARMUP" --json-out "$OUT/charge.json" >"$OUT/charge.log"
    stop_all
    rate=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(round(list(d.values())[0]["ok_per_second"]))' "$OUT/charge.json")
    reads=$(psql -d "$DB" -Atc "SELECT seq_scan, seq_tup_read, idx_tup_fetch, n_tup_ins FROM pg_stat_user_tables WHERE relname = 'payment_attempts'")
    IFS='|' read -r scans scanned fetched written <<<"$reads"
    printf '%-40s %5s %10s %12s %16s %18s %12s\n' "$bin" "$round" "$rate" "$scans" "$scanned" "$fetched" "$written"
  done
done
