#!/usr/bin/env bash
# Instructions per new charge in the service (issue 21), group commit on and off: `chargeguard
# serve` under valgrind's callgrind while `chargeguard bench charge --requests N` sends a fixed
# number of new charges; instruction counts are repeatable where time on a shared machine is not
# (this machine's VM exposes no hardware counters, so `perf stat -e instructions` cannot count).
#
#   bash bench/callgrind.sh            # BENCH_CALLGRIND_REQUESTS=2000, 16 callers
#   BENCH_BIN=target/compare/a-REV bash bench/callgrind.sh   another build (bench/compare.sh keeps its builds there)
#
# Per charge = (instructions of a run with N charges - those of a run that starts, becomes
# ready and stops with none) / N. Runs: idle, on, off, then the simulator alone the same way
# (sim-idle, sim: `chargeguard stripe-sim` under callgrind, N creates sent straight to it by
# `bench charge --provider-url`, as bench/run.sh's simulator-alone row does), since the
# simulator shares the cores with the service in every benchmark (BENCH_CALLGRIND_SUMMARY_ONLY=1
# only prints the figures of the last runs again). Callgrind counts user-space instructions only:
# the kernel's share (socket writes, wake-ups) is in bench/run.sh's CPU table, not here. Needs the release build, PostgreSQL on
# 127.0.0.1:5432 and valgrind. Results: $OUT/callgrind.json and the callgrind.out.* files.
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS=${BENCH_CALLGRIND_REQUESTS:-2000}
CONCURRENCY=${BENCH_CONCURRENCY:-16}
OUT=${BENCH_OUT:-target/bench-callgrind}
BIN=${BENCH_BIN:-target/release/chargeguard}
DB=cg_bench_callgrind
SIM_ADDR=127.0.0.1:18211
SIM_ALONE_ADDR=127.0.0.1:18212
GRPC_ADDR=127.0.0.1:18151
HTTP_ADDR=127.0.0.1:18180
SIM_API_KEY=sk_test_chargeguard
# shellcheck source=bench/common.sh
source bench/common.sh
export PGHOST=127.0.0.1 PGPORT=5432 PGUSER=postgres RUST_LOG=warn
SUMMARY_ONLY=${BENCH_CALLGRIND_SUMMARY_ONLY:-0}
mkdir -p "$OUT"
[ "$SUMMARY_ONLY" = 1 ] || rm -f "$OUT"/callgrind.out.* "$OUT"/*.log

sim_pid="" serve_pid="" sim_alone_pid=""
cleanup() {
  for pid in $serve_pid $sim_pid $sim_alone_pid; do kill -TERM "$pid" 2>/dev/null || true; done
  psql -d postgres -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT

if [ "$SUMMARY_ONLY" != 1 ]; then
psql -d postgres -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >/dev/null
CHARGEGUARD_DATABASE__URL="postgres://postgres@127.0.0.1:5432/$DB" "$BIN" migrate >/dev/null
"$BIN" stripe-sim --listen "$SIM_ADDR" --api-key "$SIM_API_KEY" >"$OUT/sim.log" 2>&1 &
sim_pid=$!
wait_http "http://$SIM_ADDR/_sim/clock" 1200

fi

token=$(od -An -tx1 -N24 /dev/urandom | tr -d ' \n')
serve_config "$BIN" "$token" "$CONCURRENCY" >"$OUT/serve.toml"

# run label group-commit requests: instructions of the whole serve process
run() {
  local label=$1 enabled=$2 requests=$3
  env CHARGEGUARD_DATABASE__URL="postgres://postgres@127.0.0.1:5432/$DB" CHARGEGUARD_PROVIDER__API_KEY=$SIM_API_KEY \
    CHARGEGUARD_SWEEP__ENABLED=false \
    CHARGEGUARD_DATABASE__GROUP_COMMIT__ENABLED="$enabled" \
    valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.out.$label" \
    "$BIN" --config "$OUT/serve.toml" serve --no-migrate >"$OUT/serve-$label.log" 2>&1 &
  serve_pid=$!
  wait_http "http://$HTTP_ADDR/readyz" 1200
  if [ "$requests" -gt 0 ]; then
    CHARGEGUARD_BENCH_TOKEN="$token" "$BIN" bench charge --endpoint "http://$GRPC_ADDR" --label "$label" \
      --concurrency "$CONCURRENCY" --connections 4 --requests "$requests" --warmup-seconds 0 \
      --key-prefix "callgrind-$label-" --json-out "$OUT/load-$label.json" | grep -v '^{' | head -3 >&2
  fi
  kill -TERM "$serve_pid"
  wait "$serve_pid" || true
  serve_pid=""
}

# run_simulator label requests: instructions of a simulator process sent that many creates
run_simulator() {
  local label=$1 requests=$2
  valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.out.$label" \
    "$BIN" stripe-sim --listen "$SIM_ALONE_ADDR" --api-key "$SIM_API_KEY" >"$OUT/$label.log" 2>&1 &
  sim_alone_pid=$!
  wait_http "http://$SIM_ALONE_ADDR/_sim/clock" 1200
  if [ "$requests" -gt 0 ]; then
    CHARGEGUARD_BENCH_PROVIDER_API_KEY=$SIM_API_KEY "$BIN" bench charge --provider-url "http://$SIM_ALONE_ADDR/" \
      --label "$label" --concurrency "$CONCURRENCY" --connections 4 --requests "$requests" --warmup-seconds 0 \
      --key-prefix "callgrind-$label-" --json-out "$OUT/load-$label.json" | grep -v '^{' | head -3 >&2
  fi
  kill -TERM "$sim_alone_pid"
  wait "$sim_alone_pid" || true
  sim_alone_pid=""
}

if [ "$SUMMARY_ONLY" != 1 ]; then
  run idle true 0
  run on true "$REQUESTS"
  run off false "$REQUESTS"
  run_simulator sim-idle 0
  run_simulator sim "$REQUESTS"
fi
python3 - "$REQUESTS" "$OUT" <<'PY'
import json, os, sys
n, out = int(sys.argv[1]), sys.argv[2]
def summary(label):
    with open(os.path.join(out, f"callgrind.out.{label}")) as f:
        return next(int(line.split()[1]) for line in f if line.startswith("summary: "))
idle, on, off = summary("idle"), summary("on"), summary("off")
sim_idle, sim = summary("sim-idle"), summary("sim")
def ok(label):
    with open(os.path.join(out, f"load-{label}.json")) as f:
        report = next(iter(json.load(f).values()))
    return report["ok"] if "ok" in report else sum(report["outcomes"].values())
result = {"requests": n, "instructions_idle": idle, "instructions_on": on, "instructions_off": off,
          "ok_on": ok("on"), "ok_off": ok("off"),
          "per_charge_on": (on - idle) / n, "per_charge_off": (off - idle) / n,
          "instructions_simulator_idle": sim_idle, "instructions_simulator": sim, "ok_simulator": ok("sim"),
          "per_create_simulator": (sim - sim_idle) / n}
print(json.dumps(result, indent=1))
print(f"instructions per new charge in the service: group commit on {result['per_charge_on']:,.0f}, "
      f"off {result['per_charge_off']:,.0f} (on / off {result['per_charge_on'] / result['per_charge_off']:.2f})")
print(f"instructions per create in the simulator: {result['per_create_simulator']:,.0f}")
with open(os.path.join(out, "callgrind.json"), "w") as f:
    json.dump(result, f, indent=1)
PY
