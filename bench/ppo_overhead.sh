#!/usr/bin/env bash
# Share of a PPO step's wall time spent outside the workers' compute (scheduling, ZeroMQ
# transport, driver-side reward and advantage math, waiting), for the tiny and ~100M
# presets. Each worker times its operation handlers (reply arg compute_s); the driver adds
# the critical path per phase (generate; the slowest scoring group; each train update's
# slower trainer; the weight sync) and logs worker_compute_s and overhead_share per step.
# Usage: bench/ppo_overhead.sh [BUILD_DIR]   (prints a table; reads runs under bench-runs/)
set -euo pipefail
cd "$(dirname "$0")/.."
rlhf=${1:-build}/cli/rlhf
out=bench-runs/ppo_overhead
mkdir -p "$out"
export OMP_NUM_THREADS=1

models() {  # preset -> $out/<preset>, $out/<preset>-value
  [ -f "$out/$1/config.json" ] || $rlhf init-model --preset "$1" --out "$out/$1" >/dev/null
  [ -f "$out/$1-value/config.json" ] ||
    $rlhf init-model --preset "$1" --value-head --seed 7 --out "$out/$1-value" >/dev/null
}

run() {  # name preset steps extra-args...
  local name=$1 preset=$2 steps=$3
  shift 3
  models "$preset"
  $rlhf run examples/ppo_tiny.json --set name="$name" --set logger.run_dir="$out" \
    --set actor.model="$out/$preset" --set critic.model="$out/$preset-value" \
    --set reward.rule= --set reward.model="$out/$preset-value" \
    --set train.max_steps="$steps" "$@" >"$out/$name.log" 2>&1
  /usr/bin/python3 - "$out/$name/metrics.jsonl" "$name" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][1:]  # step 1 warms up
share = statistics.median(r["overhead_share"] for r in rows)
step = statistics.median(r["time_s"]["step"] for r in rows)
comp = statistics.median(r["worker_compute_s"] for r in rows)
print(f"| {sys.argv[2]} | {len(rows)} | {step:.3f} | {comp:.3f} | {step - comp:.3f} | {100 * share:.1f}% |")
PY
}

echo "| preset (5 roles, reward model) | steps measured | step s (median) | worker compute s | outside s | outside share |"
echo "| --- | --- | --- | --- | --- | --- |"
run tiny tiny 11
run 100m 100m 3 --set rollout.batch_size=2 --set rollout.micro_batch_size=2 \
  --set rollout.n_samples_per_prompt=2 --set train.batch_size=4 --set train.micro_batch_size=2
