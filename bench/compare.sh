#!/usr/bin/env bash
# Two builds of chargeguard side by side, interleaved round by round, so that whatever else the
# machine does falls on both alike (BENCHMARKS.md, "Group commit"). Each round, on a fresh
# database of BENCH_TABLE_ROWS settled rows: new charges from BENCH_CONCURRENCY callers for
# BENCH_SECONDS (after a warm-up) on build A, then on build B, each with its own simulator and
# `serve` on its defaults; then pgbench's new-charge SQL with as many clients. Printed per run:
# charges/s, × that round's pgbench, p50/p99, and CPU per charge of PostgreSQL, the service, the
# simulator and the load generator; then the median of each and B / A.
#
#   bash bench/compare.sh REV_A [REV_B]    REV_B: the work tree when left out (about 6 minutes
#                                          after the builds, at the defaults)
#   BENCH_SIM_LATENCY_MS=20 bash bench/compare.sh HEAD~1   the same with the simulator's create at 20 ms
#   BENCH_ENV_B="CHARGEGUARD_DATABASE__GROUP_COMMIT__WAIT_MAX_US=1000" bash bench/compare.sh HEAD HEAD
#                                          one build, two settings: BENCH_ENV_A / BENCH_ENV_B are
#                                          added to the environment of that build's `serve`
#   BENCH_BIN_A=/tmp/cg-a [BENCH_BIN_B=/tmp/cg-b] bash bench/compare.sh
#                                          binaries already built: nothing is built, and B is A's
#                                          binary when BENCH_BIN_B is left out (one build, two
#                                          settings with BENCH_ENV_A / BENCH_ENV_B)
#
# A revision is built in a temporary git worktree into the same target/ (dependencies are
# reused; only chargeguard is compiled again), and its binary kept as target/compare/<rev>.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN_A=${BENCH_BIN_A:-}
BIN_B=${BENCH_BIN_B:-$BIN_A}
[ $# -ge 1 ] || [ -n "$BIN_A" ] || { echo "usage: bench/compare.sh REV_A [REV_B], or BENCH_BIN_A=… bash bench/compare.sh" >&2; exit 2; }
REV_A=${1:-}
REV_B=${2:-}
ENV_A=${BENCH_ENV_A:-}
ENV_B=${BENCH_ENV_B:-}
ROUNDS=${BENCH_ROUNDS:-3}
CONCURRENCY=${BENCH_CONCURRENCY:-16}
CONNECTIONS=${BENCH_CONNECTIONS:-4}
SECONDS_MEASURED=${BENCH_SECONDS:-10}
SECONDS_WARMUP=${BENCH_WARMUP_SECONDS:-3}
SIM_LATENCY_MS=${BENCH_SIM_LATENCY_MS:-0}
TABLE_ROWS=${BENCH_TABLE_ROWS:-100000}
OUT=${BENCH_OUT:-target/compare}
export PGHOST=${BENCH_PGHOST:-127.0.0.1} PGPORT=${BENCH_PGPORT:-5432} PGUSER=${BENCH_PGUSER:-postgres}
export RUST_LOG=${RUST_LOG:-warn}
DB=cg_bench_compare
SIM_ADDR=127.0.0.1:18311
GRPC_ADDR=127.0.0.1:18351
HTTP_ADDR=127.0.0.1:18380
SIM_API_KEY=sk_test_chargeguard
mkdir -p "$OUT"
rm -f "$OUT/runs.jsonl"
# shellcheck source=bench/common.sh
source bench/common.sh
# shellcheck source=bench/pgbench/new_charge_values.sh
source bench/pgbench/new_charge_values.sh

log() { printf '\n== %s\n' "$*" >&2; }

# build REV LABEL: target/compare/LABEL is chargeguard built from REV (the work tree when empty).
build() {
  local rev=$1 label=$2 tree
  if [ -z "$rev" ]; then
    cargo build --release --quiet
  else
    tree=$(mktemp -d)
    git worktree add --quiet --detach "$tree" "$rev"
    CARGO_TARGET_DIR="$PWD/target" cargo build --release --quiet --manifest-path "$tree/Cargo.toml"
    git worktree remove --force "$tree"
    # Cargo keys a workspace crate's fingerprint by its path inside the workspace, not by the
    # workspace's own path, and judges it by file times: the worktree's fingerprint (newer than
    # any file of the work tree) would make the work tree's next build look fresh and leave the
    # worktree's binary in target/release. Forgetting our crates' fingerprints makes that build
    # compile them again (the dependencies stay built).
    rm -rf target/release/.fingerprint/chargeguard-* target/release/.fingerprint/chargeguard_*
  fi
  cp target/release/chargeguard "$OUT/$label"
}

if [ -n "$BIN_A" ]; then
  label_a=a-$(basename "$BIN_A") label_b=b-$(basename "$BIN_B")
  log "binaries $BIN_A${ENV_A:+ ($ENV_A)} and $BIN_B${ENV_B:+ ($ENV_B)}, nothing built"
  cp "$BIN_A" "$OUT/$label_a"
  cp "$BIN_B" "$OUT/$label_b"
  [ "$BIN_A" != "$BIN_B" ] || [ "$ENV_A" != "$ENV_B" ] || echo "bench/compare.sh: one build and one setting on both sides (A / A)" >&2
else
  label_a=a-$(git rev-parse --short "$REV_A")
  if [ -n "$REV_B" ]; then label_b=b-$(git rev-parse --short "$REV_B"); else label_b=b-worktree; fi
  log "building $label_a${ENV_A:+ ($ENV_A)} and $label_b${ENV_B:+ ($ENV_B)}"
  build "$REV_A" "$label_a"
  if [ -n "$REV_B" ] && [ "$(git rev-parse "$REV_A")" = "$(git rev-parse "$REV_B")" ]; then
    cp "$OUT/$label_a" "$OUT/$label_b"
    [ "$ENV_A" != "$ENV_B" ] || echo "bench/compare.sh: one build and one setting on both sides (A / A)" >&2
  else
    # The work tree last, so that target/release/chargeguard is the work tree's again afterwards.
    build "$REV_B" "$label_b"
    if cmp -s "$OUT/$label_a" "$OUT/$label_b"; then
      echo "bench/compare.sh: $label_a and $label_b are the same binary" >&2
    fi
  fi
fi

sim_pid="" serve_pid=""
trap 'stop_all; psql -d postgres -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true' EXIT

fresh_database() { # binary
  seeded_database "$1" "$DB" "$TABLE_ROWS"
}

# run_build ROUND LABEL: one measured run of the binary LABEL; appends a line to runs.jsonl.
run_build() {
  local round=$1 label=$2 bin="$OUT/$2" pg0 serve0 sim0 settings
  if [ "$label" = "$label_a" ]; then settings=$ENV_A; else settings=$ENV_B; fi
  # Split on spaces on purpose: several VAR=value settings.
  # shellcheck disable=SC2086
  start_sim_and_serve "$bin" $(( CONCURRENCY > 8 ? CONCURRENCY : 8 )) "$label" $settings
  set_sim_latency "$SIM_LATENCY_MS"
  checkpoint
  CHARGEGUARD_BENCH_TOKEN=$token "$bin" bench charge --endpoint "http://$GRPC_ADDR" --concurrency "$CONCURRENCY" \
    --connections "$CONNECTIONS" --duration-seconds "$SECONDS_WARMUP" >/dev/null
  curl -sf -o "$OUT/metrics.before" "http://$HTTP_ADDR/metrics"
  pg0=$(postgres_ticks) serve0=$(pid_ticks "$serve_pid") sim0=$(pid_ticks "$sim_pid")
  /usr/bin/time -f '%U %S' -o "$OUT/client.cpu" env CHARGEGUARD_BENCH_TOKEN="$token" "$bin" bench charge \
    --endpoint "http://$GRPC_ADDR" --concurrency "$CONCURRENCY" --connections "$CONNECTIONS" \
    --duration-seconds "$SECONDS_MEASURED" --json-out "$OUT/charge.json" >/dev/null
  local pg1 serve1 sim1
  pg1=$(postgres_ticks) serve1=$(pid_ticks "$serve_pid") sim1=$(pid_ticks "$sim_pid")
  curl -sf -o "$OUT/metrics.after" "http://$HTTP_ADDR/metrics"
  printf '{"round": %s, "build": "%s", "postgres_ticks": %s, "service_ticks": %s, "simulator_ticks": %s, "client_seconds": %s, "stages": %s, "charge": %s}\n' \
    "$round" "$label" $(( pg1 - pg0 )) $(( serve1 - serve0 )) $(( sim1 - sim0 )) \
    "$(awk '{print $1 + $2}' "$OUT/client.cpu")" "$(stage_means "$OUT/metrics.before" "$OUT/metrics.after")" \
    "$(cat "$OUT/charge.json")" >>"$OUT/runs.jsonl"
  stop_all
}

run_pgbench() { # round
  local pg0
  # Warmed up after a checkpoint, as each build's run is.
  checkpoint
  pgbench -n -M prepared -c "$CONCURRENCY" -j 2 -T "$SECONDS_WARMUP" -f bench/pgbench/new_charge.sql \
    "${PGBENCH_VALUES[@]}" "$DB" >/dev/null 2>&1
  pg0=$(postgres_ticks)
  /usr/bin/time -f '%U %S' -o "$OUT/client.cpu" pgbench -n -M prepared -c "$CONCURRENCY" -j 2 -T "$SECONDS_MEASURED" \
    -f bench/pgbench/new_charge.sql "${PGBENCH_VALUES[@]}" "$DB" >"$OUT/pgbench.log" 2>&1
  printf '{"round": %s, "build": "pgbench", "postgres_ticks": %s, "client_seconds": %s, "transactions": %s, "seconds": %s}\n' \
    "$1" $(( $(postgres_ticks) - pg0 )) "$(awk '{print $1 + $2}' "$OUT/client.cpu")" \
    "$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$OUT/pgbench.log")" "$SECONDS_MEASURED" >>"$OUT/runs.jsonl"
}

for round in $(seq 1 "$ROUNDS"); do
  log "round $round of $ROUNDS: $label_a, $label_b, pgbench ($CONCURRENCY callers, simulator at $SIM_LATENCY_MS ms)"
  fresh_database "$OUT/$label_b"
  # A and B alternate who goes first, so that neither always meets the fresher table.
  if [ $(( round % 2 )) = 1 ]; then order="$label_a $label_b"; else order="$label_b $label_a"; fi
  for label in $order; do run_build "$round" "$label"; done
  run_pgbench "$round"
done

python3 - "$OUT/runs.jsonl" "$label_a" "$label_b" "$(getconf CLK_TCK)" <<'PY'
import json, statistics, sys
path, label_a, label_b, hz = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
runs = [json.loads(line) for line in open(path)]
pgbench = {run["round"]: run["transactions"] / run["seconds"] for run in runs if run["build"] == "pgbench"}
rows = {label_a: [], label_b: []}
print(f"{'round':>5} {'build':18} {'charges/s':>9} {'x pgbench':>9} {'p50 ms':>7} {'p99 ms':>7}   CPU µs/charge: {'pg':>5} {'service':>7} {'sim':>5} {'client':>6} {'total':>6}")
for run in runs:
    round_ = run["round"]
    if run["build"] == "pgbench":
        per = lambda value: value / (run["transactions"]) * 1e6
        pg, client = per(run["postgres_ticks"] / hz), per(run["client_seconds"])
        print(f"{round_:>5} {'pgbench':18} {pgbench[round_]:9.0f} {1:9.2f} {'':>7} {'':>7}   {'':14}{pg:5.0f} {'':>7} {'':>5} {client:6.0f} {pg + client:6.0f}")
        continue
    charge = run["charge"]["chargeguard_bench"]
    ok = charge["ok"]
    per = lambda value: value / ok * 1e6
    row = {
        "rate": charge["ok_per_second"], "ratio": charge["ok_per_second"] / pgbench[round_] if round_ in pgbench else float("nan"),
        "p50": charge["latency_ms"]["p50"], "p99": charge["latency_ms"]["p99"],
        "pg": per(run["postgres_ticks"] / hz), "service": per(run["service_ticks"] / hz),
        "sim": per(run["simulator_ticks"] / hz), "client": per(run["client_seconds"]), "errors": charge["errors"],
    }
    row["total"] = row["pg"] + row["service"] + row["sim"] + row["client"]
    rows[run["build"]].append(row)
    print(f"{round_:>5} {run['build']:18} {row['rate']:9.0f} {row['ratio']:9.2f} {row['p50']:7.2f} {row['p99']:7.2f}   {'':14}{row['pg']:5.0f} {row['service']:7.0f} {row['sim']:5.0f} {row['client']:6.0f} {row['total']:6.0f}" + (f"  ({row['errors']} errors)" if row["errors"] else ""))
print("\nmedians")
keys = ["rate", "ratio", "p50", "p99", "pg", "service", "sim", "client", "total"]
medians = {label: {key: statistics.median(row[key] for row in rows[label]) for key in keys} for label in rows if rows[label]}
for label, m in medians.items():
    print(f"{'':>5} {label:18} {m['rate']:9.0f} {m['ratio']:9.2f} {m['p50']:7.2f} {m['p99']:7.2f}   {'':14}{m['pg']:5.0f} {m['service']:7.0f} {m['sim']:5.0f} {m['client']:6.0f} {m['total']:6.0f}")
stages = {label: {} for label in rows}
for run in runs:
    if run.get("stages"):
        # The whole call as the load generator saw it, for the stages to be read against.
        mean = run["charge"]["chargeguard_bench"]["latency_ms"]["mean"]
        stages[run["build"]].setdefault("charge (client's mean)", []).append(mean)
    for key, value in run.get("stages", {}).items():
        stages[run["build"]].setdefault(key, []).append(value)
if any(stages.values()):
    print("\nwhere a charge's time goes in the service (medians of the runs' means; rows per statement, else ms)")
    for label, by_key in stages.items():
        for key in sorted(by_key):
            print(f"{'':>5} {label:18} {key:28} {statistics.median(by_key[key]):8.2f}")
if len(medians) == 2:
    a, b = medians[label_a], medians[label_b]
    print(f"{'':>5} {'B / A':18} {b['rate'] / a['rate']:9.2f} {'':>9} {b['p50'] / a['p50']:7.2f} {b['p99'] / a['p99']:7.2f}   {'':14}{b['pg'] / a['pg']:5.2f} {b['service'] / a['service']:7.2f} {b['sim'] / a['sim']:5.2f} {b['client'] / a['client']:6.2f} {b['total'] / a['total']:6.2f}")
PY
