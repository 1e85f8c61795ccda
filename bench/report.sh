#!/usr/bin/env bash
# Measures `chargeguard report` over ATTEMPTS (default 100,000) charge attempts and as many
# provider objects, a fifth of them refunded (every tenth fully, every tenth + 3 partly, each
# refund also a refund attempt), plus seeded discrepancies: wall time and peak RSS (/usr/bin/time -v) of the
# CSV, JSON and HTML runs. Needs python3 and /usr/bin/time, and for the PostgreSQL store
# PostgreSQL on 127.0.0.1:5432 (trust, user postgres). Writes its figures to standard output;
# BENCHMARKS.md records a run.
#
#   bash bench/report.sh [--store postgres|sqlite]
#
# --store sqlite (default postgres): the embedded store, a fresh SQLite file in a temporary
# directory, seeded with the same rows through python3's sqlite3 module.
set -euo pipefail
cd "$(dirname "$0")/.."

STORE=postgres
while [ $# -gt 0 ]; do
    case "$1" in
        --store) STORE=${2:?--store needs postgres or sqlite}; shift 2 ;;
        --store=*) STORE=${1#--store=}; shift ;;
        *) echo "unknown argument $1 (usage: $0 [--store postgres|sqlite])" >&2; exit 2 ;;
    esac
done
case "$STORE" in
    postgres|sqlite) ;;
    *) echo "--store must be postgres or sqlite, not $STORE" >&2; exit 2 ;;
esac

ATTEMPTS=${ATTEMPTS:-100000}
# FORMATS="csv" runs fewer formats (default: csv json html).
MISSING=${MISSING:-100}
PORT=${PORT:-12131}
DB=cg_bench_report
ADMIN_URL=postgres://postgres@127.0.0.1:5432/postgres
WORK=$(mktemp -d)

# BIN=path/to/chargeguard measures a binary already built (figures from a debug build are not
# comparable with a release build's time, only its memory).
if [ -z "${BIN:-}" ]; then
    cargo build --release --quiet
    BIN=target/release/chargeguard
fi

if [ "$STORE" = postgres ]; then
    psql -q "$ADMIN_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"
    export CHARGEGUARD_DATABASE__URL=postgres://postgres@127.0.0.1:5432/$DB
else
    export CHARGEGUARD_DATABASE__URL=sqlite://$WORK/bench.sqlite
fi
echo "store $STORE"
export CHARGEGUARD_PROVIDER__API_KEY=sk_test_chargeguard
export CHARGEGUARD_PROVIDER__BASE_URL=http://127.0.0.1:$PORT/
"$BIN" migrate >/dev/null

# Room for every object (the default bound is 100,000 objects).
"$BIN" stripe-sim --listen 127.0.0.1:$PORT --objects-max $((ATTEMPTS * 2 + 10000)) \
    --search-lag-seconds 0 >"$WORK/sim.log" 2>&1 &
SIM_PID=$!
trap 'kill $SIM_PID 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 50); do
    curl -sf "http://127.0.0.1:$PORT/_sim/clock" >/dev/null && break
    sleep 0.1
done

seed_started=$(date +%s)
START=$(python3 bench/report_seed.py --port "$PORT" --attempts "$ATTEMPTS")
echo "seeded $ATTEMPTS provider objects in $(( $(date +%s) - seed_started )) s (sim time from $START)"

# The attempts, on the objects' timeline: 100 per 605 s of sim time, a week in all; plus
# MISSING succeeded attempts the provider never saw.
if [ "$STORE" = sqlite ]; then
    # The same rows as the PostgreSQL statements below: ids md5('bench-' || i) as 16 bytes,
    # instants in integer microseconds.
    python3 - "$WORK/bench.sqlite" "$ATTEMPTS" "$MISSING" "$START" <<'PY'
import hashlib, sqlite3, sys
path, attempts, missing, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
md5 = lambda text: hashlib.md5(text.encode()).digest()
at = lambda i: (start + (i // 100) * 605) * 1_000_000 + (i % 100) * 10_000
db = sqlite3.connect(path)
db.executemany(
    """INSERT INTO payment_attempts (id, consumer, operation_key, kind, amount_minor, currency,
           payment_method, fingerprint, status, provider, provider_status, idempotency_key,
           key_window_started_at, next_check_at, created_at, updated_at)
       VALUES (?, 'bench', ?, 'charge', 1000, 'usd', 'pm_card_visa', 'bench', 'succeeded',
           'stripe', 'succeeded', ?, ?, ?, ?, ?)""",
    ((md5(f"bench-{i}"), f"bench-{i}", f"bench-key-{i}", at(i), at(i), at(i), at(i))
     for i in range(attempts + missing)))
db.executemany(
    """INSERT INTO payment_attempts (id, consumer, operation_key, kind, parent_attempt_id,
           amount_minor, currency, payment_method, fingerprint, status, provider,
           provider_status, idempotency_key, key_window_started_at, next_check_at, created_at,
           updated_at)
       VALUES (?, 'bench', ?, 'refund', ?, ?, 'usd', 'pm_card_visa', 'bench', 'succeeded',
           'stripe', 'succeeded', ?, ?, ?, ?, ?)""",
    ((md5(f"bench-refund-{i}"), f"bench-{i}:refund-1", md5(f"bench-{i}"),
      1000 if i % 10 == 0 else 300, f"bench-refund-key-{i}",
      at(i) + 1000, at(i) + 1000, at(i) + 1000, at(i) + 1000)
     for i in range(attempts) if i % 10 in (0, 3)))
db.commit()
db.execute("ANALYZE")
db.close()
PY
else
psql -q "$CHARGEGUARD_DATABASE__URL" <<SQL
INSERT INTO payment_attempts (id, consumer, operation_key, kind, amount_minor, currency,
    payment_method, fingerprint, status, provider, provider_status, idempotency_key,
    key_window_started_at, next_check_at, created_at, updated_at)
SELECT md5('bench-' || i)::uuid, 'bench', 'bench-' || i, 'charge', 1000, 'usd', 'pm_card_visa',
       'bench', 'succeeded', 'stripe', 'succeeded', 'bench-key-' || i, at, at, at, at
FROM generate_series(0, $ATTEMPTS + $MISSING - 1) AS i,
     LATERAL (SELECT to_timestamp($START + (i / 100) * 605 + (i % 100) * 0.01) AS at) AS timeline;
-- The refund attempts of the refunds report_seed.py made (same rule: i % 10 = 0 fully, = 3 for
-- 300), succeeded and claimed by the refunds' metadata.
INSERT INTO payment_attempts (id, consumer, operation_key, kind, parent_attempt_id, amount_minor,
    currency, payment_method, fingerprint, status, provider, provider_status, idempotency_key,
    key_window_started_at, next_check_at, created_at, updated_at)
SELECT md5('bench-refund-' || i)::uuid, 'bench', 'bench-' || i || ':refund-1', 'refund',
       md5('bench-' || i)::uuid, CASE WHEN i % 10 = 0 THEN 1000 ELSE 300 END, 'usd',
       'pm_card_visa', 'bench', 'succeeded', 'stripe', 'succeeded', 'bench-refund-key-' || i,
       at, at, at, at
FROM generate_series(0, $ATTEMPTS - 1) AS i,
     LATERAL (SELECT to_timestamp($START + (i / 100) * 605 + (i % 100) * 0.01 + 0.001) AS at) AS timeline
WHERE i % 10 IN (0, 3);
ANALYZE payment_attempts;
SQL
fi

FROM=$(date -u -d "@$((START - 60))" +%Y-%m-%dT%H:%M:%SZ)
TO=$(date -u -d "@$((START + ATTEMPTS / 100 * 605 + 3600))" +%Y-%m-%dT%H:%M:%SZ)
echo "period $FROM .. $TO"
for format in ${FORMATS:-csv json html}; do
    set +e
    /usr/bin/time -v "$BIN" report --from "$FROM" --to "$TO" --format $format \
        --output "$WORK/report.$format" 2>"$WORK/time.$format"
    code=$?
    set -e
    field() { grep "$1" "$WORK/time.$format" | awk '{print $NF}'; }
    size=$(stat -c %s "$WORK/report.$format")
    echo "format=$format exit=$code wall=$(field 'Elapsed (wall clock)') user_s=$(field 'User time') \
sys_s=$(field 'System time') peak_rss_kib=$(field 'Maximum resident set size') output_bytes=$size"
    # The staging phase (provider listing, join, summary pass), from the report's own log.
    grep -o 'report prepared.*' "$WORK/time.$format" | sed 's/\x1b\[[0-9;]*m//g' || true
    grep -E '^  (double_charge|missing_at_provider|orphan|amount_mismatch|refund_mismatch|orphan_refund|refunded_beyond_record|matched) |ours refunded' "$WORK/time.$format" || true
done
