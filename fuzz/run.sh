#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 60) and prints, per target, executions, coverage
# and crashes. Needs cargo-fuzz (`cargo install cargo-fuzz`); on a stable toolchain
# RUSTC_BOOTSTRAP=1 lets it pass its -Z flags, and `-s none` builds without a sanitizer (a
# sanitizer needs nightly's std). A crash is saved under fuzz/artifacts/<target>/: copy it to
# fuzz/regressions/<target>/ so `cargo test --lib fuzzing` keeps it fixed.
#
#   fuzz/run.sh            # all targets, 60 s each
#   SECONDS_PER_TARGET=10 fuzz/run.sh webhook config
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${SECONDS_PER_TARGET:-60}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(webhook charge_request refund_request operation config simulator_form)
fi
export RUSTC_BOOTSTRAP=1
log_dir="$(mktemp -d)"
printf '%-16s %12s %10s %8s %8s %8s\n' target executions exec/s cov features crashes
for target in "${targets[@]}"; do
  log="$log_dir/$target.log"
  # Inputs the run finds go to a scratch corpus: the repository keeps only the seeds.
  scratch="$log_dir/corpus-$target"
  mkdir -p "$scratch" "fuzz/artifacts/$target"
  status=0
  cargo fuzz run --dev -s none "$target" "$scratch" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="fuzz/artifacts/$target/" >"$log" 2>&1 || status=$?
  executions=$(grep -o 'stat::number_of_executed_units:[[:space:]]*[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  per_second=$(grep -o 'stat::average_exec_per_sec:[[:space:]]*[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(echo "$last" | grep -o 'cov: [0-9]*' | grep -o '[0-9]*' || echo "?")
  features=$(echo "$last" | grep -o 'ft: [0-9]*' | grep -o '[0-9]*' || echo "?")
  crashes=$(find "fuzz/artifacts/$target" -type f \( -name 'crash-*' -o -name 'oom-*' -o -name 'timeout-*' \) | wc -l)
  printf '%-16s %12s %10s %8s %8s %8s\n' "$target" "$executions" "$per_second" "$cov" "$features" "$crashes"
  if [ "$status" -ne 0 ] && [ "$crashes" -eq 0 ]; then
    echo "  $target failed to run (exit $status); see $log" >&2
    tail -20 "$log" >&2
  fi
done
echo "logs: $log_dir"
