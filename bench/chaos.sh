#!/usr/bin/env bash
# Jobs that survive their workers (issue 45): grpo_tiny and ppo_tiny for 60 steps, each
# undisturbed and then under a seeded killer (bench/chaos.py: a signal every 5-10 steps, in
# turn SIGKILL to a rollout engine, the reference, the critic (ppo), an actor rank, and
# SIGSTOP to a rollout engine), with two rollout engines, a checkpoint every 5 steps and a
# 2 s heartbeat timeout. Prints per job the signals, the restarts with their time to
# recover, whether each step is logged once with the undisturbed run's reward, and leftover
# processes.
#
#   bench/chaos.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/chaos}
mkdir -p "$out"
out=$(realpath "$out")
rlhf=$(realpath build/cli/rlhf)
[ -d "$out/tiny" ] || "$rlhf" init-model --preset tiny --out "$out/tiny" --seed 0 > /dev/null
[ -d "$out/tiny-value" ] ||
  "$rlhf" init-model --preset tiny --value-head --out "$out/tiny-value" --seed 7 > /dev/null
common=(--set actor.model="$out/tiny" --set train.max_steps=60 --set ckpt.save_steps=5
        --set fault.max_restarts=100 --set scheduler.worker_timeout_s=2)
echo "== grpo_tiny (actor, ref, 2 rollout engines)"
bench/chaos.py "$rlhf" examples/grpo_tiny.json "$out/grpo" "${common[@]}" \
  --set 'cluster.nodes=[{"name":"local","kind":"cpu","devices":4,"memory_gb":4}]' \
  --set rollout.devices=[2,3] --set rollout.micro_batch_size=4
echo "== ppo_tiny (actor, critic, ref, 2 rollout engines)"
bench/chaos.py "$rlhf" examples/ppo_tiny.json "$out/ppo" "${common[@]}" \
  --set critic.model="$out/tiny-value" --set rollout.devices=[2,4] \
  --set rollout.micro_batch_size=4 \
  --plan rollout:SIGKILL,ref:SIGKILL,critic:SIGKILL,actor:SIGKILL,rollout:SIGSTOP
