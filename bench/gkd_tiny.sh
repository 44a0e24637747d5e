#!/usr/bin/env bash
# Distillation variants on the tiny letters task (issue 44): a GRPO-trained teacher
# (examples/grpo_tiny.json, 30 steps, its export) teaches the untrained tiny model for 30
# steps without any reward (the letters rule measured at weight 0), by
#   - on-policy distillation: the per-token reverse KL in the advantage (algo.distill.coef 1),
#   - GKD (algo.distill.gkd.coef 1) with the teacher's top k of 288 tokens (k 8, 64, and 288,
#     the whole distribution) at beta 0.5, and at k 64 with beta 0 (forward KL) and 1
#     (reverse KL),
# and prints per variant: the letters reward over the first and last 5 steps, the first step
# whose 5-step mean reaches 0.5, the last 5 steps' divergence, seconds per step, and the
# teacher's peak tensor bytes against the plan's.
#
#   bench/gkd_tiny.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/gkd_tiny}
mkdir -p "$out"
out=$(realpath "$out")
rlhf=build/cli/rlhf
fp32=(--set actor.dtype=fp32 --set rollout.dtype=fp32 --set ref.dtype=fp32)

[ -d "$out/tiny" ] ||
  "$rlhf" init-model --preset tiny --out "$out/tiny" --seed 5 --dtype fp32 > /dev/null
[ -d "$out/runs/teacher/export/actor" ] ||
  "$rlhf" run examples/grpo_tiny.json --set name=teacher --set actor.model="$out/tiny" \
    --set logger.run_dir="$out/runs" "${fp32[@]}" > "$out/teacher.log"

student() {  # NAME, then --set arguments
  local name=$1
  shift
  "$rlhf" run examples/grpo_tiny.json --set name="$name" --set actor.model="$out/tiny" \
    --set logger.run_dir="$out/runs" "${fp32[@]}" --set teacher.dtype=fp32 \
    --set 'cluster.nodes=[{"name":"local","kind":"cpu","devices":4,"memory_gb":4}]' \
    --set teacher.model="$out/runs/teacher/export/actor" --set teacher.devices=[3] \
    --set rollout.temperature=1.0 --set reward.rule= \
    --set 'reward.sources=[{"rule": "letters", "weight": 0}]' "$@" > "$out/$name.log"
}
student reverse_kl --set algo.distill.coef=1
for k in 8 64 288; do
  student "gkd_k${k}" --set algo.distill.gkd.coef=1 --set algo.distill.gkd.top_k=$k
done
student gkd_k64_beta0 --set algo.distill.gkd.coef=1 --set algo.distill.gkd.beta=0
student gkd_k64_beta1 --set algo.distill.gkd.coef=1 --set algo.distill.gkd.beta=1

python3 - "$out/runs" <<'EOF'
import json, sys
runs = sys.argv[1]
def load(name):
    return [json.loads(l) for l in open(f"{runs}/{name}/metrics.jsonl")]
teacher = load("teacher")
print(f"teacher (GRPO): reward {sum(m['reward_mean'] for m in teacher[-5:]) / 5:.3f} (last 5 steps)")
print(f"{'variant':15} {'letters first 5':>15} {'last 5':>7} {'0.5 at':>7} "
      f"{'divergence last 5':>18} {'s/step':>7} {'teacher peak/plan':>18}")
for name in ["reverse_kl", "gkd_k8", "gkd_k64", "gkd_k288", "gkd_k64_beta0", "gkd_k64_beta1"]:
    m = load(name)
    letters = [s["reward"]["letters"] for s in m]
    mean5 = [sum(letters[i - 5:i]) / 5 for i in range(5, len(letters) + 1)]
    reach = next((i + 5 for i, v in enumerate(mean5) if v >= 0.5), None)
    key = "reverse_kl" if name == "reverse_kl" else "gkd"
    div = sum(s["distill"][key] for s in m[-5:]) / 5
    step_s = sum(s["time_s"]["step"] for s in m[1:]) / (len(m) - 1)
    t = m[-1]["memory"]["teacher"][0]
    peak = f"{t['peak_tensor_bytes'] / 2**20:.2f}/{t['planned_tensor_bytes'] / 2**20:.2f} MiB"
    print(f"{name:15} {sum(letters[:5]) / 5:15.3f} {sum(letters[-5:]) / 5:7.3f} "
          f"{str(reach):>7} {div:18.5f} {step_s:7.2f} {peak:>18}")
EOF
