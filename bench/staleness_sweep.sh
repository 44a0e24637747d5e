#!/usr/bin/env bash
# Bounded staleness on the CPU (issue 42.5): `rlhf sweep` of algo.max_staleness 0, 1, 2, 4
# (partial rollouts on, the default) x rollout.max_new_tokens 48, 256 x rollout.streaming off,
# on, on grpo_tiny (actor, reference and rollout as separate processes), STEPS steps each
# (default 6; the sweep leaves the first out). Each group pinned: the rollout on core 0, actor and reference on core 1
# (<role>.cpu_affinity; unpinned groups steal each other's cores). Prints per variant:
# samples/s, each role group's busy share (busy_s / step time) and all devices'
# (devices_busy), the samples' mean and max staleness and token-mean staleness (below the
# sample mean when in-flight updates made later tokens newer), the rollout mismatch
# (rollout_mismatch.kl) and the mean response length, over the measured steps.
# Usage: [STEPS=N] [PIN=0] bench/staleness_sweep.sh [BUILD_DIR]   (runs under bench-runs/staleness)
set -euo pipefail
cd "$(dirname "$0")/.."
rlhf=${1:-build}/cli/rlhf
out=bench-runs/staleness
mkdir -p "$out"
export OMP_NUM_THREADS=1
[ -f "$out/tiny/config.json" ] || $rlhf init-model --preset tiny --out "$out/tiny" >/dev/null
pin=()
if [ "${PIN:-1}" = 1 ]; then
  pin=(--set rollout.cpu_affinity=[0] --set actor.cpu_affinity=[1] --set ref.cpu_affinity=[1])
fi
rm -rf "$out/sweep"
$rlhf sweep examples/grpo_tiny.json --grid algo.max_staleness=0,1,2,4 \
  --grid rollout.max_new_tokens=48,256 --grid rollout.streaming=false,true --steps "${STEPS:-6}" --out "$out/sweep" \
  --set actor.model="$out/tiny" --set data.max_len=272 "${pin[@]}" >"$out/sweep.log" 2>&1
/usr/bin/python3 - "$out/sweep" <<'PY'
import csv, json, statistics, sys
out = sys.argv[1]
rows = list(csv.DictReader(open(f"{out}/sweep.csv")))
print(f"{'k':>2} {'max_new':>7} {'stream':>6} {'samples/s':>9} {'actor':>6} {'ref':>6} {'rollout':>7} "
      f"{'all':>5} {'stale':>6} {'max':>4} {'token':>6} {'mismatch kl':>11} {'len':>6}")
for row in rows:
    m = [json.loads(l) for l in open(f"{out}/{row['variant']}/metrics.jsonl")][1:]
    mean = lambda f: statistics.mean(f(r) for r in m)
    share = lambda g: mean(lambda r: r["busy_s"][g] / r["time_s"]["step"])
    print(f"{row['algo.max_staleness']:>2} {row['rollout.max_new_tokens']:>7} "
          f"{row['rollout.streaming']:>6} "
          f"{mean(lambda r: r['samples_per_s']):>9.1f} {share('actor'):>6.2f} {share('ref'):>6.2f} "
          f"{share('rollout'):>7.2f} {mean(lambda r: r['devices_busy']):>5.2f} "
          f"{mean(lambda r: r['staleness']['mean']):>6.2f} "
          f"{max(r['staleness']['max'] for r in m):>4} "
          f"{mean(lambda r: r['staleness']['token_mean']):>6.2f} "
          f"{mean(lambda r: r['rollout_mismatch']['kl']):>11.2e} "
          f"{mean(lambda r: r['response_length']):>6.1f}")
PY
