#!/usr/bin/env bash
# The classic pipeline on CPU with tiny models: SFT -> reward model -> PPO, each step a
# plain `rlhf run` of an example spec. PPO starts from the SFT export and is scored by the
# reward model just trained (no rule reward); the script ends with PPO's reward curve.
# Usage: examples/pipeline_tiny.sh [extra --set for the PPO run]. RUNS=dir to change where.
set -euo pipefail
cd "$(dirname "$0")/.."
rlhf=${RLHF:-./build/cli/rlhf}
runs=${RUNS:-runs/pipeline}
export OMP_NUM_THREADS=1
mkdir -p "$runs/models"
[ -f "$runs/models/tiny/config.json" ] || $rlhf init-model --preset tiny --out "$runs/models/tiny"
[ -f "$runs/models/tiny-value/config.json" ] ||
  $rlhf init-model --preset tiny --value-head --seed 7 --out "$runs/models/tiny-value"

# SFT on noisy copies (half the characters digits or capitals) gives a policy that writes
# words, but not the all-lowercase ones the reward model (trained on synthetic:preferences)
# prefers: PPO's reward then has room to rise.
echo "== 1/3 SFT (examples/sft_tiny.json on synthetic:noisy_sft)"
$rlhf run examples/sft_tiny.json --set actor.model="$runs/models/tiny" --set logger.run_dir="$runs" \
  --set data.dataset=synthetic:noisy_sft

echo "== 2/3 reward model (examples/rm_tiny.json)"
$rlhf run examples/rm_tiny.json --set reward.model="$runs/models/tiny-value" --set logger.run_dir="$runs"

echo "== 3/3 PPO from the SFT model, scored by the reward model (examples/ppo_tiny.json)"
$rlhf run examples/ppo_tiny.json --set actor.model="$runs/sft_tiny/export/actor" \
  --set critic.model="$runs/models/tiny-value" --set reward.rule= \
  --set reward.model="$runs/rm_tiny/export/reward" --set logger.run_dir="$runs" "$@"

echo "== PPO reward curve: reward_mean per step (the reward model's score)"
python3 - "$runs/ppo_tiny/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
lo = min(r["reward_mean"] for r in rows); hi = max(r["reward_mean"] for r in rows)
for r in rows:
    bar = "#" * int(1 + 40 * (r["reward_mean"] - lo) / max(hi - lo, 1e-9))
    print(f'step {r["step"]:3d}  reward_mean {r["reward_mean"]:+.4f}  {bar}')
PY
