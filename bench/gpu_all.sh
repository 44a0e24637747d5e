#!/usr/bin/env bash
# Every GPU figure of bench/RESULTS.md in one run, on a machine with a GPU, after
# `scripts/gpu-test build` (binaries in build-gpu/): decode and training (bench_gpu), the
# same through Hugging Face transformers (hf_gpu_reference.py, skipped when transformers is
# not installed), their comparison, and a PPO step's phase breakdown with per-role GPU
# memory (examples/ppo_1gpu.json, 10 steps). Writes everything under ${OUT:-bench-gpu-out}.
# Usage: bench/gpu_all.sh [BUILD_DIR] [ppo|sync]   (ppo: only the PPO run and the OOM check;
#        sync: only the weight-sync benchmark). RLHF_SKIP_HF=1 skips the transformers run.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
only=${2:-}
# Libraries of scripts/gpu-test's .deb bundle (libzmq, ...), where it unpacked them.
for d in "${RLHF_DEPS_PREFIX:-}" /opt/rlhf-deps "${XDG_CACHE_HOME:-$HOME/.cache}/rlhf/deps"; do
  [ -n "$d" ] && [ -d "$d/ld" ] && export LD_LIBRARY_PATH="$d/ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" && break
done
out=${OUT:-bench-gpu-out}
python=${RLHF_PYTHON:-python3}
mkdir -p "$out"
[ -x "$build/bench/bench_gpu" ] || { echo "gpu_all: no $build/bench/bench_gpu (run scripts/gpu-test build)" >&2; exit 1; }

if [ -z "$only" ]; then
echo "== bench_gpu"
timeout 300 "$build/bench/bench_gpu" --device cuda --out "$out/rlhf_gpu.json" 2>&1 | tee "$out/bench_gpu.txt"
if [ "${RLHF_SKIP_HF:-0}" != 1 ]; then
  echo "== hf_gpu_reference"
  timeout 240 "$python" bench/hf_gpu_reference.py --device cuda --out "$out/hf_gpu.json" 2>&1 | tee "$out/hf_gpu.txt"
fi
if [ -f "$out/rlhf_gpu.json" ] && [ -f "$out/hf_gpu.json" ]; then
  "$python" bench/gpu_compare.py "$out/rlhf_gpu.json" "$out/hf_gpu.json" 2>&1 | tee "$out/compare.txt"
fi
fi

if [ -z "$only" ] || [ "$only" = sync ]; then
  echo "== weight sync (bench_sync: CUDA IPC and Gloo with CUDA tensors, one GPU)"
  if [ -x "$build/bench/bench_sync" ]; then
    timeout 180 "$build/bench/bench_sync" --device cuda 2>&1 | tee "$out/bench_sync.txt"
  else
    echo "gpu_all: no $build/bench/bench_sync" | tee "$out/bench_sync.txt"
  fi
  [ "$only" = sync ] && exit 0
fi

echo "== PPO on one GPU: phase breakdown"
runs=$(mktemp -d)
"$build/cli/rlhf" init-model --preset tiny --out "$runs/tiny" >/dev/null
"$build/cli/rlhf" init-model --preset tiny --value-head --seed 7 --out "$runs/tiny-value" >/dev/null
# Twice: sleep mode on (the default: rollout weights to the host while the actor trains, and
# here also the actor's optimizer state while the rollout generates), then off; the
# per-phase allocator peaks show what each offload saves.
for mode in sleep awake; do
  if [ $mode = sleep ]; then
    flags=(--set actor.offload_optimizer_while_generating=true)
  else
    flags=(--set rollout.offload_while_training=false --set name=ppo_1gpu_awake)
  fi
  name=ppo_1gpu; [ $mode = awake ] && name=ppo_1gpu_awake
  echo "-- $mode: ${flags[*]}"
  timeout 120 "$build/cli/rlhf" run examples/ppo_1gpu.json --set "actor.model=$runs/tiny" \
    --set "critic.model=$runs/tiny-value" --set "logger.run_dir=$runs" --set train.max_steps=10 \
    "${flags[@]}" 2>&1 | tee "$out/$name.txt"
  cp "$runs/$name/metrics.jsonl" "$out/${name}_metrics.jsonl" 2>/dev/null
  "$build/cli/rlhf" plan --check "$runs/$name" 2>&1 | tee "$out/plan_check_$mode.txt"
  "$python" - "$out/${name}_metrics.jsonl" <<'PY' | tee "$out/ppo_phases_$mode.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
last = rows[1:] or rows  # step 1 includes CUDA and NCCL start-up
mean = lambda k: sum(r["time_s"][k] for r in last) / len(last)
print("PPO step phases, mean of steps 2..%d (s):" % rows[-1]["step"],
      ", ".join("%s %.4f" % (k, mean(k)) for k in ("generate", "score", "train", "sync", "step")))
for key in ("weight_sync", "offload"):
    if key in rows[-1]:
        print(key, json.dumps(rows[-1][key]))
for role, ranks in rows[-1]["memory"].items():
    for r in ranks:
        print("%-8s rank %d %s: peak allocated %.1f MiB, reserved %.1f MiB, planned total %.1f MiB"
              % (role, r["rank"], r["device"], r.get("cuda_peak_allocated_bytes", 0) / 2**20,
                 r.get("cuda_peak_reserved_bytes", 0) / 2**20,
                 r.get("planned_total_bytes", 0) / 2**20))
        for ph, p in sorted(r.get("cuda_phases", {}).items()):
            print("    %-14s allocated %.2f MiB reserved %.2f MiB"
                  % (ph, p["peak_allocated_bytes"] / 2**20, p["peak_reserved_bytes"] / 2**20))
PY
done

echo "== CUDA out of memory, on purpose (memory_gb 0.001)"
timeout 60 "$build/cli/rlhf" run examples/ppo_1gpu.json --set "actor.model=$runs/tiny" \
  --set "critic.model=$runs/tiny-value" --set "logger.run_dir=$runs" --set name=oom \
  --set 'cluster.nodes=[{"name": "gpu", "kind": "cuda", "devices": 1, "memory_gb": 0.001}]' \
  >"$out/oom.txt" 2>&1
echo "exit code $?" | tee -a "$out/oom.txt"
grep -m1 "CUDA out of memory" "$out/oom.txt"
rm -rf "$runs"
