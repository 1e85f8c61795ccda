# Helpers sourced by the bench scripts (bash): CPU time read from /proc, the service's config,
# waiting for an HTTP endpoint, the simulator's create latency.
#
# postgres_ticks: clock ticks of PostgreSQL — its live processes and the children it has reaped
# (backends that exited during a run still count). A backend reaped between the two reads
# would be in neither, so the reaped children's sum is read before and after the live
# processes, and the reading taken again until no reap fell between. (Two pgbench rows of 15
# in bench/compare.sh read a fifth of PostgreSQL's usual CPU; this race is one possible cause,
# not a confirmed one.)
postgres_ticks() {
  local postmaster reaped reaped_after live
  # The oldest process named postgres is the postmaster; fields 16-17 are its reaped children's.
  postmaster=$(pgrep -o -x postgres || true)
  [ -n "$postmaster" ] || { echo 0; return; }
  for _ in $(seq 1 50); do
    reaped=$(awk '{print $16 + $17}' "/proc/$postmaster/stat")
    live=0
    for pid in $(pgrep -x postgres || true); do
      [ -r "/proc/$pid/stat" ] && live=$(( live + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0) ))
    done
    reaped_after=$(awk '{print $16 + $17}' "/proc/$postmaster/stat")
    [ "$reaped" = "$reaped_after" ] && break
  done
  echo $(( reaped_after + live ))
}
# pid_ticks PID: clock ticks (user + system) of one process, 0 when there is none.
pid_ticks() { if [ -n "$1" ] && [ -r "/proc/$1/stat" ]; then awk '{print $14 + $15}' "/proc/$1/stat"; else echo 0; fi; }

# checkpoint: every row that writes starts right after a checkpoint (and then warms up), so
# that no checkpoint starts in the middle of one row and not of the row it is compared with.
# From the moment a checkpoint starts, the first change to each page writes the whole page into
# the WAL (full_page_writes), so its commits carry more: run 17 (BENCHMARKS.md) had the one that
# max_wal_size set off start at the beginning of the service's row at 16, side by side, and its
# pgbench row none. One row writes far less than that threshold, and CHECKPOINT restarts
# checkpoint_timeout's count, so no other checkpoint starts during a row.
checkpoint() { psql -d postgres -qAtc 'CHECKPOINT' >/dev/null; }
# wal_totals: WAL written so far (pg_stat_wal): bytes and full-page images, space-separated.
wal_totals() { psql -d postgres -qAtc "SELECT wal_bytes::bigint || ' ' || wal_fpi FROM pg_stat_wal"; }

# serve_config BIN TOKEN CONNECTIONS: the benchmarks' `serve` configuration on stdout, for
# GRPC_ADDR, HTTP_ADDR and SIM_ADDR, with TOKEN (hashed by BIN) as the one consumer's.
serve_config() {
  cat <<TOML
[server]
grpc_listen = "$GRPC_ADDR"
http_listen = "$HTTP_ADDR"

[database]
connections_max = $3

[provider]
base_url = "http://$SIM_ADDR/"

[[consumers]]
name = "bench"
token_sha256 = "$(printf '%s' "$2" | "$1" hash-token)"
# The load generator is the one consumer: the per-consumer limits (500/s by default) would
# measure themselves, not the service.
requests_per_second_max = 100000
burst_max = 100000
calls_in_flight_max = 100000
TOML
}

# wait_http URL [TRIES]: until URL answers 2xx, polling every 0.1 s, at most TRIES times (100 by
# default); the script stops with a message when nothing answers.
wait_http() {
  for _ in $(seq 1 "${2:-100}"); do
    curl -sf -o /dev/null "$1" && return 0
    sleep 0.1
  done
  echo "bench/$(basename "$0"): nothing answered on $1" >&2
  exit 1
}

# set_sim_latency MS: every create at the simulator on SIM_ADDR takes MS more (0: no fault).
set_sim_latency() {
  if [ "$1" = 0 ]; then
    curl -sf -X DELETE "http://$SIM_ADDR/_sim/faults" >/dev/null
  else
    curl -sf -X POST "http://$SIM_ADDR/_sim/faults" -H 'content-type: application/json' \
      -d "{\"target\":\"create_payment_intent\",\"spec\":{\"kind\":{\"latency\":$1},\"trigger\":{\"probability\":1.0}}}" >/dev/null
  fi
}

# stage_means BEFORE AFTER: from two scrapes of /metrics (files), one JSON object of what the
# measured run added, per label: mean rows per group-commit statement, mean statement (with its
# commit) and mean caller's wait in ms by `statement`, and the mean provider round in ms by
# `step`, and the mean gRPC call inside the service in ms by `method` (`request_seconds:Payments/Charge`)
# — where a charge's time goes inside the service. {} from a build without the metrics.
stage_means() {
  python3 - "$1" "$2" <<'PY'
import json, re, sys
def read(path):
    values = {}
    for line in open(path):
        match = re.match(r'^(chargeguard_(?:group_commit_\w+|provider_round_seconds|grpc_request_seconds)_(?:sum|count))\{([^}]*)\} (\S+)$', line)
        if match:
            values[(match[1], match[2])] = float(match[3])
    return values
before, after = read(sys.argv[1]), read(sys.argv[2])
delta = {key: value - before.get(key, 0.0) for key, value in after.items()}
# Summed over the labels a stage is not read by (a call's status code).
sums, counts = {}, {}
for (name, labels), total in delta.items():
    if not name.endswith("_sum"):
        continue
    label = re.search(r'(?:statement|step|method)="(?:chargeguard\.v1\.)?([^"]*)"', labels)
    metric = name[len("chargeguard_"):-4].replace("group_commit_", "").replace("grpc_", "")
    key = f"{metric}:{label[1] if label else ''}"
    sums[key] = sums.get(key, 0.0) + total
    counts[key] = counts.get(key, 0.0) + delta.get((name[:-4] + "_count", labels), 0.0)
means = {}
for key, total in sums.items():
    if counts[key] > 0:
        means[key] = total / counts[key] * (1.0 if key.startswith("batch_rows") else 1e3)
print(json.dumps(means, sort_keys=True))
PY
}

# seeded_database BIN DB ROWS: DB dropped and created again, migrated by BIN, and ROWS settled
# attempts seeded into it (PGHOST, PGPORT and PGUSER name the server).
seeded_database() {
  psql -d postgres -qc "DROP DATABASE IF EXISTS $2 WITH (FORCE)" -c "CREATE DATABASE $2" >/dev/null
  CHARGEGUARD_DATABASE__URL="postgres://$PGUSER@$PGHOST:$PGPORT/$2" "$1" migrate >/dev/null
  CHARGEGUARD_DATABASE__URL="postgres://$PGUSER@$PGHOST:$PGPORT/$2" "$1" bench seed --settled "$3" >/dev/null 2>&1
}

# stop_all: stops the simulator and the service this script started (sim_pid, serve_pid), and
# waits for each to exit (a service's backends flush their statistics as they exit).
stop_all() {
  for pid in $serve_pid $sim_pid; do
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  sim_pid="" serve_pid=""
}

# start_sim_and_serve BIN CONNECTIONS LABEL [VAR=value ...]: BIN's simulator on SIM_ADDR and its
# `serve` (serve_config with CONNECTIONS pooled connections, the sweep off, the extra settings
# added to its environment) on the database DB, each ready; logs $OUT/sim-LABEL.log and
# $OUT/serve-LABEL.log. Sets sim_pid, serve_pid and token (the load generator's).
# The benchmarks' simulator keeps this many objects and idempotency keys: at 0 ms a row creates
# ~50,000 a second, past the default 100,000 objects within its warm-up (every measured call of
# latency.sh's simulator-alone row then failed).
SIM_LIMITS=(--objects-max 4000000 --idempotency-keys-max 4000000)

# start_sim BIN LOG: BIN's simulator on SIM_ADDR with those limits, appending to LOG, ready; one
# this script started before (sim_pid) is stopped first. Sets sim_pid.
start_sim() {
  local bin=$1 log=$2
  if [ -n "$sim_pid" ]; then
    kill -TERM "$sim_pid"
    wait "$sim_pid" || true
  fi
  "$bin" stripe-sim --listen "$SIM_ADDR" --api-key "$SIM_API_KEY" "${SIM_LIMITS[@]}" >>"$log" 2>&1 &
  sim_pid=$!
  wait_http "http://$SIM_ADDR/_sim/clock"
}

start_sim_and_serve() {
  local bin=$1 connections=$2 label=$3
  shift 3
  : >"$OUT/sim-$label.log"
  start_sim "$bin" "$OUT/sim-$label.log"
  token=$(od -An -tx1 -N24 /dev/urandom | tr -d ' \n')
  serve_config "$bin" "$token" "$connections" >"$OUT/serve.toml"
  env CHARGEGUARD_DATABASE__URL="postgres://$PGUSER@$PGHOST:$PGPORT/$DB" CHARGEGUARD_PROVIDER__API_KEY="$SIM_API_KEY" \
    CHARGEGUARD_SWEEP__ENABLED=false "$@" "$bin" --config "$OUT/serve.toml" serve --no-migrate >"$OUT/serve-$label.log" 2>&1 &
  serve_pid=$!
  wait_http "http://$HTTP_ADDR/readyz"
}
