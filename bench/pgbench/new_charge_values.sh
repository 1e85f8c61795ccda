# The constants the service binds for a new charge of `chargeguard bench charge`, as pgbench
# variables for bench/pgbench/new_charge.sql. Sourced by bench/run.sh and bench/replicas.sh.
# shellcheck disable=SC2034
PGBENCH_VALUES=(
  -D consumer=pgbench -D currency=usd -D payment_method=pm_card_visa
  -D description=chargeguard-bench -D 'metadata={"bench":"pgbench"}'
  -D fingerprint=5f0c8a4c1d7e2b9a3f6e0d4c8b2a7f1e9d3c5b7a0e2f4d6c8b1a3e5f7d9c0b2a
  -D provider=stripe -D now=now -D succeeded=succeeded -D 'unfinished={pending,requires_action}'
  -D false=false
)
