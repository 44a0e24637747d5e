#!/usr/bin/env bash
# One-step off-policy (algo.async_steps 1) against the synchronous loop on the CPU: ppo_tiny
# (rollout on its own device slot) for 30 steps each way, the two modes alternating, REPEATS
# times (default 2). Prints each run's mean step time and phases over steps 2..30, the
# speed-up of each pair, and, from the one-step run's own phases, how much of its generation
# was hidden (1 - generate on the critical path / generate_ahead) and its step against its
# own floor score + train + sync (what a step costs with generation wholly hidden). No ideal
# is taken from the other mode's run: run-to-run noise (a few percent) is as large as the gap.
# Also each role group's busy share of the step (metrics busy_s / time_s.step, issue 42.4) and
# all workers' (devices_busy). PIN=1 pins the rollout to core 0 and the other groups to core 1
# (<role>.cpu_affinity): on a 2-core machine unpinned groups steal each other's cores.
# Usage: [REPEATS=N] [PIN=1] bench/async_overlap.sh [BUILD_DIR]   (runs under bench-runs/async_overlap)
set -euo pipefail
cd "$(dirname "$0")/.."
rlhf=${1:-build}/cli/rlhf
out=bench-runs/async_overlap
mkdir -p "$out"
export OMP_NUM_THREADS=1
[ -f "$out/tiny/config.json" ] || $rlhf init-model --preset tiny --out "$out/tiny" >/dev/null
[ -f "$out/tiny-value/config.json" ] ||
  $rlhf init-model --preset tiny --value-head --seed 7 --out "$out/tiny-value" >/dev/null
repeats=${REPEATS:-2}
pin=()
if [ "${PIN:-0}" = 1 ]; then
  pin=(--set rollout.cpu_affinity=[0] --set actor.cpu_affinity=[1] --set critic.cpu_affinity=[1]
    --set ref.cpu_affinity=[1])
fi
for ((i = 1; i <= repeats; ++i)); do
  for mode in 0 1; do
    $rlhf run examples/ppo_tiny.json --set name="async${mode}_$i" --set logger.run_dir="$out" \
      --set actor.model="$out/tiny" --set critic.model="$out/tiny-value" \
      --set algo.async_steps=$mode "${pin[@]}" >"$out/async${mode}_$i.log" 2>&1
  done
done
/usr/bin/python3 - "$out" "$repeats" <<'PY'
import json, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
keys = ["step", "generate", "generate_ahead", "score", "train", "sync"]
def phases(name):
    m = [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl")][1:]
    return {k: statistics.mean(r["time_s"].get(k, 0.0) for r in m) for k in keys}, m
print(f"{'run':<10}" + "".join(f"{k:>16}" for k in keys))
for i in range(1, repeats + 1):
    sync, ms = phases(f"async0_{i}")
    asyn, ma = phases(f"async1_{i}")
    for name, p in ((f"sync {i}", sync), (f"async {i}", asyn)):
        print(f"{name:<10}" + "".join(f"{p[k]:>16.4f}" for k in keys))
    floor = asyn["score"] + asyn["train"] + asyn["sync"]
    hidden = 1 - asyn["generate"] / asyn["generate_ahead"]
    first = lambda m: statistics.mean(r["reward_mean"] for r in m[:5])
    last = lambda m: statistics.mean(r["reward_mean"] for r in m[-5:])
    for name, m in ((f"sync {i}", ms), (f"async {i}", ma)):
        share = {g: statistics.mean(r["busy_s"][g] / r["time_s"]["step"] for r in m)
                 for g in m[0]["busy_s"]}
        busy = statistics.mean(r["devices_busy"] for r in m)
        print(f"  {name} busy share: " + ", ".join(f"{g} {v:.2f}" for g, v in share.items()) +
              f"; all devices {busy:.2f}")
    print(f"  pair {i}: speed-up {sync['step'] / asyn['step']:.3f}x; one-step run: "
          f"{100 * hidden:.1f}% of generation hidden, step / (score + train + sync) "
          f"{asyn['step'] / floor:.3f}; reward first 5 -> last 5 steps: sync "
          f"{first(ms):.3f} -> {last(ms):.3f}, one-step {first(ma):.3f} -> {last(ma):.3f}")
PY
