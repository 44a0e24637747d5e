#!/usr/bin/env bash
# Which ZeRO stage (issue 41.3): per optimizer step, the bytes each stage's collectives carry
# on one actor rank, as `rlhf plan` predicts them and as the rank's Gloo group counted them in a
# real run, and what one rank sends for them (Gloo's algorithms here). Runs
# examples/sft_tiny.json with the actor sharded over 2 CPU ranks at ZeRO 1, 2 and 3 (4 steps
# each), then reads each run's last metrics record (memory.actor[r].step_collectives beside
# planned_step_collectives) and the step time.
# Usage: bench/zero_comm.sh [BUILD_DIR] [--set PATH=VALUE]...   (runs under bench-runs/zero_comm)
set -euo pipefail
cd "$(dirname "$0")/.."
rlhf=${1:-build}/cli/rlhf
shift $(($# < 1 ? $# : 1))
out=bench-runs/zero_comm
mkdir -p "$out"
export OMP_NUM_THREADS=1
for stage in 1 2 3; do
  rm -rf "$out/zero$stage"
  $rlhf run examples/sft_tiny.json --set name="zero$stage" --set logger.run_dir="$out" \
    --set 'cluster.nodes=[{"name": "local", "kind": "cpu", "devices": 2, "memory_gb": 8}]' \
    --set 'actor.devices=[0,1]' --set actor.zero_stage=$stage --set train.max_steps=4 --set logger.logging_steps=1 \
    --set ckpt.export_hf=false "$@" >"$out/zero$stage.log" 2>&1 ||
    { echo "zero_comm: stage $stage failed, see $out/zero$stage.log" >&2; exit 1; }
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
mib = lambda b: f"{b / 2**20:8.3f}"
print("stage | all-gather MiB (plan / counted) | reduce-scatter MiB | all-reduce MiB | calls | "
      "sent per rank MiB (plan) | step s")
for stage in (1, 2, 3):
    recs = [json.loads(l) for l in open(f"{out}/zero{stage}/metrics.jsonl")]
    steps = [r for r in recs if "loss" in r and "memory" in r]
    last = steps[-1]
    rank = last["memory"]["actor"][0]
    got, want = rank["step_collectives"], rank["planned_step_collectives"]
    plan = json.load(open(f"{out}/zero{stage}/plan.json"))["memory"]["roles"]["actor"]
    same = all(got[k] == want[k] for k in ("all_gather", "reduce_scatter", "all_reduce", "calls"))
    t = sorted(r["time_s"] for r in steps[1:]) or [last["time_s"]]
    print(f"{stage} | {mib(want['all_gather'])} / {mib(got['all_gather'])} | "
          f"{mib(want['reduce_scatter'])} / {mib(got['reduce_scatter'])} | "
          f"{mib(want['all_reduce'])} / {mib(got['all_reduce'])} | {want['calls']} / {got['calls']} | "
          f"{mib(plan['collective_wire_bytes_per_step'])} | {t[len(t) // 2]:.3f}"
          f"{'' if same else '  MISMATCH'}")
PY
