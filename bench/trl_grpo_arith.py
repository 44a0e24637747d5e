"""The same GRPO job as examples/grpo_smollm2_arith.json, run by Hugging Face TRL's
GRPOTrainer on the same machine, for bench/RESULTS.md: seconds per step and held-out accuracy
before and after. TRL is a peer to compare with (bench-only, never a dependency of rlhf).

  "$(scripts/python-env)" bench/trl_grpo_arith.py --steps 20 [--loss dr_grpo] [--eval-steps 5]
      [--out bench-runs/trl]

Same model (SmolLM2-135M-Instruct from scripts/get-model), same prompts (`rlhf dataset
synthetic:arith`, 2000 rows) and held-out problems (synthetic:arith_test, 200), same rewards
(the example's sources, scored by `rlhf reward` itself so both runs see identical scores), 16
prompts x 8 samples per step, 48 new tokens, temperature 0.7, two optimizer steps of 64
samples per step, KL k3 loss with beta 0.001, no gradient checkpointing, BF16 compute (TRL: autocast, FP32 weights; rlhf: dtype auto
chose BF16 on this AVX512-BF16 CPU, FP32 master weights). --loss picks the pair of settings:
  dr_grpo (the example's): TRL loss_type="dr_grpo", scale_rewards="none", lr 1e-5 = rlhf
          algo.advantage.estimator dr_grpo (r - group mean; loss summed over tokens and divided
          by batch x max_new_tokens, rlhf's token_sum_norm), lr 1e-5;
  group_norm: TRL loss_type="dapo", scale_rewards="group", lr 5e-6 = rlhf group_norm with
          token_mean (the same normalisation over a batch's tokens).
Held-out accuracy is measured before, every --eval-steps rlhf steps and after (greedy, the
same 200 problems), as rlhf's eval.steps does. Differences: HF generate (dense KV cache, no
continuous batching) for rollouts; torch's threads inside one process vs one thread in each of
rlhf's three processes (both use the machine's 2 cores).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# datasets 4.8.x: 5.x needs pyarrow >= 24, and the build pins pyarrow 22 (data/CMakeLists.txt).
TRL = ["trl==1.16.0", "datasets==4.8.2", "pyarrow==22.0.0"]


def ensure_trl():
    try:
        import trl  # noqa: F401
        return
    except ImportError:
        pass
    print("trl_grpo_arith: installing " + " ".join(TRL) + " (bench-only)", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"] + TRL,
                   check=True)


def rlhf_rows(rlhf, source, count):
    out = subprocess.run([rlhf, "dataset", source, "--count", str(count)], check=True,
                         capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


class RlhfReward:
    """Scores with `rlhf reward SPEC`: the example's own sources."""

    def __init__(self, rlhf, spec, model):
        self.cmd = [rlhf, "reward", spec, "--set", "actor.model=" + model]
        self.__name__ = "rlhf_reward"

    def scores(self, prompts, completions, labels):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            for p, c, l in zip(prompts, completions, labels):
                f.write(json.dumps({"prompt": p, "response": c, "label": l}) + "\n")
        try:
            out = subprocess.run(self.cmd + ["--input", f.name], check=True, capture_output=True,
                                 text=True).stdout
        finally:
            os.unlink(f.name)
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def __call__(self, prompts, completions, label, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        ptexts = [p[-1]["content"] if isinstance(p, list) else p for p in prompts]
        return [r["reward"] for r in self.scores(ptexts, texts, label)]


def accuracy(model, tok, rows, reward, batch=16, new_tokens=48):
    import torch
    model.eval()
    tok.padding_side = "left"
    responses = []
    for i in range(0, len(rows), batch):
        chunk = rows[i:i + batch]
        texts = [tok.apply_chat_template([{"role": "user", "content": r["prompt"]}],
                                         add_generation_prompt=True, tokenize=False) for r in chunk]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id)
        responses += tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    scored = reward.scores([r["prompt"] for r in rows], responses, [r["label"] for r in rows])
    model.train()
    return sum(s["sources"]["correct"] >= 1 for s in scored) / len(rows)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20, help="rlhf steps (16 prompts x 8 samples)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench-runs", "trl"))
    p.add_argument("--rlhf", default=os.path.join(ROOT, "build", "cli", "rlhf"))
    p.add_argument("--eval-prompts", type=int, default=200)
    p.add_argument("--loss", choices=["dr_grpo", "group_norm"], default="dr_grpo")
    p.add_argument("--eval-steps", type=int, default=5,
                   help="held-out accuracy every N rlhf steps (0: before and after only)")
    p.add_argument("--eval-only", metavar="DIR",
                   help="only the held-out accuracy of this HF directory (e.g. rlhf's export), "
                        "greedy in transformers; no TRL needed")
    a = p.parse_args()
    if a.eval_only:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        spec = os.path.join(ROOT, "examples", "grpo_smollm2_arith.json")
        reward = RlhfReward(a.rlhf, spec, a.eval_only)
        held_out = rlhf_rows(a.rlhf, "synthetic:arith_test", a.eval_prompts)
        tok = AutoTokenizer.from_pretrained(a.eval_only)
        model = AutoModelForCausalLM.from_pretrained(a.eval_only, dtype=torch.float32)
        acc = accuracy(model, tok, held_out, reward)
        print(json.dumps({"model": a.eval_only, "accuracy": acc, "prompts": len(held_out)}))
        return
    ensure_trl()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model_dir = subprocess.run([os.path.join(ROOT, "scripts", "get-model"), "smollm2-135m-instruct"],
                               check=True, capture_output=True, text=True).stdout.strip()
    spec = os.path.join(ROOT, "examples", "grpo_smollm2_arith.json")
    reward = RlhfReward(a.rlhf, spec, model_dir)
    train = rlhf_rows(a.rlhf, "synthetic:arith", 2000)
    held_out = rlhf_rows(a.rlhf, "synthetic:arith_test", a.eval_prompts)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}],
                               "label": r["label"]} for r in train])
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    t = time.time()
    before = accuracy(model, tok, held_out, reward)
    eval_s = time.time() - t
    print(f"trl_grpo_arith: held-out accuracy before {before:.3f} ({eval_s:.0f} s)", flush=True)

    curve = [{"step": 0, "accuracy": before}]

    class Clock(TrainerCallback):
        """Times each optimizer step, leaving the held-out evaluations out of the step times."""

        def __init__(self):
            self.marks = [time.time()]
            self.eval_s = 0.0

        def on_step_end(self, args, state, control, model=None, **kw):
            now = time.time()
            self.marks.append(now)
            step = state.global_step // 2  # an rlhf step is two TRL optimizer steps
            if (a.eval_steps and state.global_step % 2 == 0 and step % a.eval_steps == 0
                    and step < a.steps):
                acc = accuracy(model, tok, held_out, reward)
                curve.append({"step": step, "accuracy": acc})
                print(f"trl_grpo_arith: step {step} held-out accuracy {acc:.3f}", flush=True)
                spent = time.time() - now
                self.eval_s += spent
                self.marks = [m + spent for m in self.marks]  # shift: the next step starts now

    clock = Clock()
    lr = 1e-5 if a.loss == "dr_grpo" else 5e-6
    loss_type, scale = ("dr_grpo", "none") if a.loss == "dr_grpo" else ("dapo", "group")
    config = GRPOConfig(
        output_dir=a.out, learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0,
        per_device_train_batch_size=8, gradient_accumulation_steps=8, steps_per_generation=16,
        num_generations=8, max_completion_length=48, temperature=0.7, beta=0.001,
        loss_type=loss_type, scale_rewards=scale, num_iterations=1, max_steps=2 * a.steps,
        gradient_checkpointing=False, bf16=True, use_cpu=True, logging_steps=2,
        save_strategy="no", report_to=[], seed=42)
    trainer = GRPOTrainer(model=model, args=config, train_dataset=data, reward_funcs=[reward],
                          processing_class=tok, callbacks=[clock])
    t = time.time()
    trainer.train()
    train_s = time.time() - t - clock.eval_s
    after = accuracy(trainer.model, tok, held_out, reward)
    curve.append({"step": a.steps, "accuracy": after})
    # An rlhf step is two of TRL's optimizer steps (128 samples).
    step_s = [clock.marks[i + 2] - clock.marks[i] for i in range(0, len(clock.marks) - 2, 2)]
    rewards = [h.get("reward") for h in trainer.state.log_history if "reward" in h]
    result = {"loss": a.loss, "lr": lr, "steps": a.steps, "accuracy_curve": curve,
              "accuracy_before": before, "accuracy_after": after,
              "train_s": train_s, "s_per_step": step_s, "mean_s_per_step": train_s / a.steps,
              "reward_curve": rewards, "eval_prompts": len(held_out), "eval_s": eval_s}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "s_per_step"}), flush=True)


if __name__ == "__main__":
    main()
