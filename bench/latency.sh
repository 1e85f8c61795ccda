#!/usr/bin/env bash
# The p99 row of bench/run.sh on its own, with where the service's added time goes
# (BENCHMARKS.md, "Group commit", eleventh round): on a fresh database of BENCH_TABLE_ROWS settled
# rows, new charges from BENCH_CONCURRENCY callers with the simulator's create at
# BENCH_SIM_LATENCY_MS; then the simulator alone at that setting through chargeguard's provider
# client. Prints both latency lines, the service's mean stages (rows per group-commit statement,
# statement and wait in ms, the provider round, the gRPC call) and each stage's quantiles read
# off its histogram buckets (an upper bound: the bucket's edge).
#
#   bash bench/latency.sh                                  (about a minute; needs a release build)
#   bash bench/latency.sh CHARGEGUARD_DATABASE__GROUP_COMMIT__ENABLED=false   extra settings for `serve`
#   BENCH_BIN=target/compare/a-REV bash bench/latency.sh   another build (bench/compare.sh keeps its builds there)
# Files: BENCH_OUT, by default target/bench-latency/<the extra settings, or "defaults">.
set -euo pipefail
cd "$(dirname "$0")/.."
export PGHOST=${BENCH_PGHOST:-127.0.0.1} PGPORT=${BENCH_PGPORT:-5432} PGUSER=${BENCH_PGUSER:-postgres}
export RUST_LOG=${RUST_LOG:-warn}
CONCURRENCY=${BENCH_CONCURRENCY:-16}
CONNECTIONS=${BENCH_CONNECTIONS:-4}
SECONDS_MEASURED=${BENCH_SECONDS:-15}
SECONDS_WARMUP=${BENCH_WARMUP_SECONDS:-3}
SIM_LATENCY_MS=${BENCH_SIM_LATENCY_MS:-20}
TABLE_ROWS=${BENCH_TABLE_ROWS:-100000}
# One directory per set of extra settings, so that a loop over settings keeps every run's files.
settings_slug=$(printf '%s' "${*:-defaults}" | tr -c 'A-Za-z0-9=._-' '_')
OUT=${BENCH_OUT:-target/bench-latency/$settings_slug}
BIN=${BENCH_BIN:-target/release/chargeguard}
DB=cg_bench_latency
SIM_ADDR=127.0.0.1:18411
GRPC_ADDR=127.0.0.1:18451
HTTP_ADDR=127.0.0.1:18480
SIM_API_KEY=sk_test_chargeguard
# shellcheck source=bench/common.sh
source bench/common.sh
mkdir -p "$OUT"
[ -x "$BIN" ] || cargo build --release --quiet

seeded_database "$BIN" "$DB" "$TABLE_ROWS"
sim_pid="" serve_pid=""
trap 'stop_all; psql -d postgres -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true' EXIT
start_sim_and_serve "$BIN" "$CONCURRENCY" latency "$@"
set_sim_latency "$SIM_LATENCY_MS"
curl -sf "http://$HTTP_ADDR/metrics" >"$OUT/before.prom"
echo "service, ${SIM_LATENCY_MS} ms at the simulator, $CONCURRENCY callers${*:+ ($*)}:"
CHARGEGUARD_BENCH_TOKEN="$token" "$BIN" bench charge --endpoint "http://$GRPC_ADDR" --label latency \
  --concurrency "$CONCURRENCY" --connections "$CONNECTIONS" --duration-seconds "$SECONDS_MEASURED" \
  --warmup-seconds "$SECONDS_WARMUP" --json-out "$OUT/service.json" | grep -E '^  (requests|latency)'
curl -sf "http://$HTTP_ADDR/metrics" >"$OUT/after.prom"
echo "the simulator alone:"
CHARGEGUARD_BENCH_PROVIDER_API_KEY=$SIM_API_KEY "$BIN" bench charge --provider-url "http://$SIM_ADDR/" \
  --label provider-latency --concurrency "$CONCURRENCY" --connections "$CONNECTIONS" \
  --duration-seconds "$SECONDS_MEASURED" --warmup-seconds "$SECONDS_WARMUP" \
  --json-out "$OUT/provider.json" | grep -E '^  (requests|latency)'
echo "the service's stages, means (rows, else ms):"
stage_means "$OUT/before.prom" "$OUT/after.prom" | python3 -c 'import json, sys; [print(f"  {k:40}{v:8.2f}") for k, v in sorted(json.load(sys.stdin).items())]'
echo "the service's stages, quantiles (at most, in s):"
python3 - "$OUT/before.prom" "$OUT/after.prom" <<'PY'
import collections, re, sys
def read(path):
    buckets = collections.defaultdict(dict)
    for line in open(path):
        match = re.match(r'^chargeguard_(\w+)_bucket\{(.*)\} (\S+)$', line)
        if not match:
            continue
        edge = re.search(r'le="([^"]+)"', match[2])[1]
        labels = re.sub(r',?le="[^"]+"', '', match[2])
        buckets[(match[1], labels)][float('inf') if edge == '+Inf' else float(edge)] = float(match[3])
    return buckets
before, after = read(sys.argv[1]), read(sys.argv[2])
for key, counts in sorted(after.items()):
    if not re.match(r'(group_commit_(statement|wait)|provider_round|grpc_request)_seconds', key[0]):
        continue
    added = {edge: count - before.get(key, {}).get(edge, 0.0) for edge, count in counts.items()}
    total = added[float('inf')]
    if total < 50:
        continue
    def quantile(q):
        return next(edge for edge in sorted(added) if added[edge] >= q * total)
    print(f"  {key[0]:34}{key[1][:44]:46}n={int(total):7}  p50 {quantile(.5)}  p90 {quantile(.9)}  p99 {quantile(.99)}  p99.9 {quantile(.999)}")
PY
