#!/usr/bin/env bash
# PostgreSQL's CPU per inserted row for each form of the pending-row insert, side by side
# (issue 21, BENCHMARKS.md "Group commit"): the single-row function, one transaction a row; the
# old batch (unnest … CROSS JOIN LATERAL insert_pending_attempt, one call per row); the batch
# function insert_pending_first_attempts with PostgreSQL's default (custom) plans and with the
# generic plan it ships with; and a plain INSERT … SELECT, the least such a batch can cost. Then
# an insert batch and a finish batch of 4 charges as two transactions and as one; then the plain
# insert again without the four secondary indexes it maintains; last, the insert and finish of 4
# charges without those indexes, and again with every finish a HOT update (the bound of a schema
# change, for planning).
#
#   bash bench/batch_statements.sh          (about two minutes; needs a release build and pgbench)
#
# CPU is read from /proc for every postgres process (reaped backends included) around each run.
set -euo pipefail
cd "$(dirname "$0")/.."
export PGHOST=${BENCH_PGHOST:-127.0.0.1} PGPORT=${BENCH_PGPORT:-5432} PGUSER=${BENCH_PGUSER:-postgres}
SECONDS_EACH=${BENCH_SECONDS:-8}
DB=cg_bench_batch
BIN=target/release/chargeguard
[ -x "$BIN" ] || cargo build --release --quiet
# shellcheck source=bench/common.sh
source bench/common.sh
trap 'psql -d postgres -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true' EXIT
seeded_database "$BIN" "$DB" 100000
measure() { # label script clients rows-per-transaction
  local before after out transactions
  before=$(postgres_ticks)
  out=$(pgbench -n -M prepared -c "$3" -j 2 -T "$SECONDS_EACH" -f "bench/pgbench/batch/$2" "$DB" 2>&1)
  after=$(postgres_ticks)
  transactions=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out")
  [ -n "$transactions" ] && [ "$transactions" -gt 0 ] || { echo "$out" >&2; exit 1; }
  python3 -c 'import sys; label, ticks, rows, seconds, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]);
print(f"{label:58}{rows / seconds:10.0f} rows/s{ticks / hz / rows * 1e6:8.0f} µs of PostgreSQL CPU per row")' \
    "$1" $(( after - before )) $(( transactions * $4 )) "$SECONDS_EACH" "$(getconf CLK_TCK)"
}
measure "insert_pending_attempt alone, 1 row a transaction, 16 clients" single_function.sql 16 1
measure "unnest … LATERAL insert_pending_attempt, 4 rows, 4 clients" lateral_function_4.sql 4 4
measure "insert_pending_first_attempts (generic plan), 4 rows, 4 clients" first_attempts_4.sql 4 4
psql -d "$DB" -qc "ALTER FUNCTION insert_pending_first_attempts RESET plan_cache_mode"
measure "insert_pending_first_attempts (custom plans), 4 rows, 4 clients" first_attempts_4.sql 4 4
measure "plain INSERT … SELECT … ON CONFLICT DO NOTHING, 4 rows, 4 clients" plain_insert_4.sql 4 4
psql -d "$DB" -qc "ALTER FUNCTION insert_pending_first_attempts SET plan_cache_mode = force_generic_plan"
echo "per charge, insert and finish of 4 charges (PostgreSQL CPU per row above = per charge here):"
measure "  two transactions (today's insert batch, then finish batch)" insert_then_finish_4.sql 4 4
# The same two statements inside BEGIN … COMMIT (after the script's \set lines).
one_transaction=bench/pgbench/batch/.insert_and_finish_4_one_transaction.sql
trap 'rm -f "$one_transaction"; psql -d postgres -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true' EXIT
{ grep '^\\set' bench/pgbench/batch/insert_then_finish_4.sql; echo 'BEGIN;'
  grep -v -e '^\\set' -e '^--' bench/pgbench/batch/insert_then_finish_4.sql; echo 'COMMIT;'; } >"$one_transaction"
measure "  one transaction for both" "$(basename "$one_transaction")" 4 4
# Last, as it changes the table: what the secondary indexes that an insert maintains cost (the
# unique ones stay, the charge path needs them).
psql -d "$DB" -qc "DROP INDEX payment_attempts_created, payment_attempts_unfinished_created,
  payment_attempts_consumer_created, payment_attempts_unfinished_due"
measure "plain INSERT … SELECT, 4 rows, without 4 secondary indexes" plain_insert_4.sql 4 4
# Then what a schema whose finish is a HOT update could save (issue 21's planning): PostgreSQL
# writes an UPDATE's new version into no index only when no indexed column, and no column of a
# partial index's predicate, changes. A finish changes status (the predicate of the two
# "unfinished" indexes, dropped above) and sets provider_payment_id (indexed). The charge path
# needs all of these today, so this is the bound of a schema change, not something to run with.
hot_updates() {
  sleep 1 # backends flush their statistics at exit, at most a second after
  psql -d "$DB" -Atc "SELECT n_tup_upd || ' ' || n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'payment_attempts'"
}
hot_fraction() { # label, "updates hot" before, the same after
  python3 -c 'import sys; u0, h0 = map(int, sys.argv[2].split()); u1, h1 = map(int, sys.argv[3].split());
print(f"{sys.argv[1]:58}{(h1 - h0) / max(u1 - u0, 1) * 100:10.0f} % of its finishes were HOT updates")' "$@"
}
echo "per charge, insert and finish of 4 charges, without those 4 secondary indexes:"
before=$(hot_updates)
measure "  the finish still sets an indexed column" insert_then_finish_4.sql 4 4
hot_fraction "  (the same run)" "$before" "$(hot_updates)"
psql -d "$DB" -qc "DROP INDEX payment_attempts_provider_payment_id"
before=$(hot_updates)
measure "  and without provider_payment_id's index" insert_then_finish_4.sql 4 4
hot_fraction "  (the same run)" "$before" "$(hot_updates)"
