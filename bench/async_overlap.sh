#!/usr/bin/env bash
# One-step off-policy (algo.async_steps 1) against the synchronous loop on the CPU: ppo_tiny
# (rollout on its own device slot) for 30 steps each way. Prints the mean step time and its
# phases over steps 2..30, and the overlap achieved against the ideal: with generation fully
# hidden, a step costs max(generate, score + train) + sync, from the synchronous run's phases.
# Usage: bench/async_overlap.sh [BUILD_DIR]   (reads runs under bench-runs/async_overlap)
set -euo pipefail
cd "$(dirname "$0")/.."
rlhf=${1:-build}/cli/rlhf
out=bench-runs/async_overlap
mkdir -p "$out"
export OMP_NUM_THREADS=1
[ -f "$out/tiny/config.json" ] || $rlhf init-model --preset tiny --out "$out/tiny" >/dev/null
[ -f "$out/tiny-value/config.json" ] ||
  $rlhf init-model --preset tiny --value-head --seed 7 --out "$out/tiny-value" >/dev/null
for mode in 0 1; do
  $rlhf run examples/ppo_tiny.json --set name="async$mode" --set logger.run_dir="$out" \
    --set actor.model="$out/tiny" --set critic.model="$out/tiny-value" \
    --set algo.async_steps=$mode >"$out/async$mode.log" 2>&1
done
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
def phases(name):
    m = [json.loads(l) for l in open(f"{sys.argv[1]}/{name}/metrics.jsonl")][1:]
    keys = ["step", "generate", "generate_ahead", "score", "train", "sync"]
    return {k: statistics.mean(r["time_s"].get(k, 0.0) for r in m) for k in keys}, m
sync, ms = phases("async0")
asyn, ma = phases("async1")
print(f"{'mode':<8}" + "".join(f"{k:>16}" for k in sync))
for name, p in (("sync", sync), ("async", asyn)):
    print(f"{name:<8}" + "".join(f"{p[k]:>16.4f}" for k in p))
ideal = max(sync["generate"], sync["score"] + sync["train"]) + sync["sync"]
print(f"speed-up {sync['step'] / asyn['step']:.3f}x; ideal step {ideal:.4f} s "
      f"({sync['step'] / ideal:.3f}x); achieved / ideal speed-up "
      f"{(sync['step'] / asyn['step']) / (sync['step'] / ideal):.3f}")
first = lambda m: statistics.mean(r["reward_mean"] for r in m[:5])
last = lambda m: statistics.mean(r["reward_mean"] for r in m[-5:])
print(f"reward first 5 -> last 5 steps: sync {first(ms):.3f} -> {last(ms):.3f}, "
      f"async {first(ma):.3f} -> {last(ma):.3f}")
PY
