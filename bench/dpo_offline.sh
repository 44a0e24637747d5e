#!/usr/bin/env bash
# What the reference log-prob cache saves in a DPO job, and where a DPO step's time goes:
# runs examples/dpo_tiny.json (512 pairs, 2 epochs; actor and reference in their own
# processes) twice under one run name. The first run computes the reference pass (train +
# held-out pairs) on the ref group and caches it; the second reads the cache. Prints the
# reference pass time against one epoch of training (the cost every extra epoch or resume
# would pay again without the cache), the cache load time, and the step's worker-compute share.
# Usage: bench/dpo_offline.sh [BUILD_DIR] [PRESET] [--set PATH=VALUE]...
#   (runs under bench-runs/dpo_offline; the --set options go to both runs)
set -euo pipefail
cd "$(dirname "$0")/.."
rlhf=${1:-build}/cli/rlhf
preset=${2:-tiny}
shift $(( $# < 2 ? $# : 2 ))
out=bench-runs/dpo_offline
mkdir -p "$out"
export OMP_NUM_THREADS=1
[ -f "$out/$preset/config.json" ] || $rlhf init-model --preset "$preset" --out "$out/$preset" >/dev/null
rm -rf "$out/dpo_$preset"
for pass in 1 2; do
  $rlhf run examples/dpo_tiny.json --set name="dpo_$preset" --set logger.run_dir="$out" \
    --set actor.model="$out/$preset" --set logger.logging_steps=1 --set ckpt.export_hf=false "$@" \
    >"$out/pass$pass.log" 2>&1
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$out" "dpo_$preset" <<'PY'
import json, re, statistics, sys
out, name = sys.argv[1], sys.argv[2]
first, second = open(f"{out}/pass1.log").read(), open(f"{out}/pass2.log").read()
computed = [(int(p), float(s)) for p, s in re.findall(r"of (\d+) \w+ pairs computed on the ref group in ([\d.]+) s", first)]
loaded = [float(s) for s in re.findall(r"pairs loaded from \S+ in ([\d.]+) s", second)]
rows = [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl") if l.strip()]
steps = [r for r in rows if r.get("split") != "eval"]
per_epoch = max(r["step"] for r in steps) // max(r["epoch"] for r in steps)
step_s = statistics.median(r["time_s"] for r in steps[1:])
tok_s = statistics.median(r["tokens_per_s"] for r in steps[1:])
share = statistics.median(r["overhead_share"] for r in steps[1:])
evals = [r for r in rows if r.get("split") == "eval"]
ref_s = sum(s for _, s in computed)
print(f"reference pass: {sum(p for p, _ in computed)} pairs in {ref_s:.2f} s; cache load: {sum(loaded):.4f} s "
      f"({ref_s / max(sum(loaded), 1e-9):.0f}x faster)")
print(f"training: {per_epoch} steps per epoch, median step {step_s:.3f} s, {tok_s:.0f} tokens/s, "
      f"outside worker compute {100 * share:.1f}%")
print(f"reference pass / one training epoch: {ref_s / (per_epoch * step_s):.2f}")
print("held-out accuracy: " + ", ".join(f'{e["when"]} {e["eval_accuracy"]:.3f}' for e in evals))
PY
