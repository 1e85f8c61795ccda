#!/usr/bin/env bash
# The chaos test's long form (README "Chaos", BENCHMARKS.md "Chaos"): the same test as CI's
# `e2e::chaos`, with more orders and a kill every few seconds.
#
#   bench/chaos.sh                                  20,000 orders at 100/s, an event every 3 s
#   CHAOS_ORDERS=5000 CHAOS_KILL_EVERY_MS=1500 bench/chaos.sh
#
# Needs what the test suite needs (PostgreSQL server binaries, libfaketime, pgbouncer, RabbitMQ
# on 127.0.0.1:5672 with rabbitmqctl); `.ci/run` installs them. Prints the figures at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
export CG_CHAOS_ORDERS=${CHAOS_ORDERS:-20000}
export CG_CHAOS_RATE=${CHAOS_RATE:-100}
export CG_CHAOS_KILL_EVERY_MS=${CHAOS_KILL_EVERY_MS:-3000}
export CG_CHAOS_SEED=${CHAOS_SEED:-$(date +%s)}
# The example consumer is built by a plain `cargo test`, not by one filtered to a test binary.
cargo build --features failpoints --example order-consumer
cargo test --features failpoints --test it e2e::chaos -- --nocapture
