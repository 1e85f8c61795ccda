#!/usr/bin/env bash
# Checks model/chargeguard.pml with spin: safety (assertions, exhaustive) and liveness
# (acceptance cycles under weak fairness). CI runs the default bound through
# `cargo test --features failpoints --test it model::`; --large is the bound checked by hand
# (figures in model/README.md). --prefix shows the double charge of the code before issue 14.
#
#   model/check.sh            N=2 FAULTS=1 TMAX=5 safety, N=1 liveness   (~30 s)
#   model/check.sh --large    N=3 FAULTS=1 TMAX=5 safety, N=2 FAULTS=1 liveness (minutes, GBs)
#   model/check.sh --prefix   the pre-fix clock model: spin's trail of the second charge
#   model/check.sh --two-faults   two faults per run: N=2 FAULTS=2 TMAX=5 safety, N=1 FAULTS=2
#                             liveness (about 10 minutes; ~9.2 GB, so MEMORY_MB defaults to 12288 here)
#   model/check.sh --two-faults-liveness   two faults per run with two deliveries: N=2 FAULTS=2
#                             TMAX=5 liveness, exhaustive (about 17 minutes; ~18.1 GB, so
#                             MEMORY_MB defaults to 19456 here: a 24 GB machine)
#   model/check.sh --bitstate     two faults per run with three deliveries: N=3 FAULTS=2 TMAX=5
#                             safety by bitstate hashing (4 GB of bits; about 35 minutes)
set -euo pipefail
model=$(cd "$(dirname "$0")" && pwd)/chargeguard.pml
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

# MEMLIM (MB) stops a search that outgrows the machine instead of swapping; COLLAPSE trades
# time for memory at the large bound.
memory_mb=${MEMORY_MB:-8192}

# A bitstate search (spin's supertrace) is for a bound whose states do not fit in memory however
# compressed: each state is a few bits of a 2^BITSTATE_LOG2_BITS-bit array, so the search always
# ends, but two states that hash alike count as one and the second's successors may go
# unvisited. pan's hash factor (bits per state stored) says how likely that was: above 100 the
# search is as good as exhaustive; lower, it is a large sample, not a proof.
check() { # search (safety, liveness or bitstate: safety by bitstate hashing), spin -D… defines
  local search=$1
  shift
  local spin_flags=(-a) gcc_flags=(-O2 -w -DNFAIR=4) pan_flags=(-m1000000)
  case "$search" in
    liveness)
      spin_flags+=(-DLIVENESS)
      gcc_flags+=("-DMEMLIM=$memory_mb" -DCOLLAPSE)
      pan_flags+=(-a -f)
      ;;
    safety) gcc_flags+=(-DSAFETY "-DMEMLIM=$memory_mb" -DCOLLAPSE) ;;
    bitstate)
      gcc_flags+=(-DSAFETY -DBITSTATE)
      pan_flags+=("-w${BITSTATE_LOG2_BITS:-35}")
      ;;
  esac
  spin "${spin_flags[@]}" "$@" "$model" >/dev/null
  gcc "${gcc_flags[@]}" -o pan pan.c
  echo "== $search ($*)"
  local started=$SECONDS
  ./pan "${pan_flags[@]}" | tee pan.out |
    grep -E 'violated|acceptance cycle|errors:|states, stored|hash factor|depth too small|MEMLIM|out of memory' || true
  echo "   wall clock $((SECONDS - started)) s"
  # A search cut short by memory or depth proves nothing, even with no error found.
  if grep -qE 'MEMLIM|depth too small|out of memory' pan.out; then
    echo "   incomplete search" >&2
    return 1
  fi
  grep -q 'errors: 0' pan.out
}

case "${1:-}" in
  --prefix)
    cp "$model" .
    spin -a -DPREFIX_CLOCK -DNO_RETENTION_ASSERT chargeguard.pml >/dev/null
    gcc -O2 -w -DSAFETY -o pan pan.c
    ./pan -m1000000 | grep -E 'violated|errors:|states, stored' || true
    # The trail replayed, without the assignments to a round's scratch variables.
    spin -t -p -DPREFIX_CLOCK -DNO_RETENTION_ASSERT chargeguard.pml |
      grep -vE '^\s+[a-z_]+ = ' | grep -vE '\[(else|\(1\))\]$'
    ;;
  --two-faults)
    # Its safety search holds ~9.2 GB.
    memory_mb=${MEMORY_MB:-12288}
    check safety -DN=2 -DFAULTS=2 -DTMAX=5
    check liveness -DN=1 -DFAULTS=2 -DTMAX=5
    ;;
  --two-faults-liveness)
    # 251,314,590 states stored in ~18.1 GB (model/README.md).
    memory_mb=${MEMORY_MB:-19456}
    check liveness -DN=2 -DFAULTS=2 -DTMAX=5
    ;;
  --bitstate)
    # N=3 with two faults stored more than 1.35e8 states before 8 GB ran out (model/README.md).
    check bitstate -DN=3 -DFAULTS=2 -DTMAX=5
    ;;
  --large)
    check safety -DN=3 -DFAULTS=1 -DTMAX=5
    check liveness -DN=2 -DFAULTS=1 -DTMAX=5
    ;;
  "")
    check safety
    check liveness -DN=1
    ;;
  *)
    echo "usage: model/check.sh [--large | --prefix | --two-faults | --two-faults-liveness | --bitstate]" >&2
    exit 2
    ;;
esac
