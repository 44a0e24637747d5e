"""Hugging Face PEFT as the reference for rlhf's LoRA adapters (run by lora_test.cpp).

`make --out DIR --seed N` random-initialises a tiny Llama (tied head) and a tiny Qwen2 (q/k/v
biases, rsLoRA) with transformers, saves each base model (FP32), puts a PEFT LoRA adapter on
every target module (q/k/v/o/gate/up/down) with init_lora_weights=False so B is not zero, and
saves the adapter with PEFT's save_pretrained. It writes DIR/<case>/reference.json: the
input sequences and, per sequence, the next-token log-probs of the base model, of the model
with the adapter (PEFT's forward, unmerged) and of merge_and_unload()'s merged model.

`score --model DIR [--adapter DIR] --inputs FILE --out FILE` loads a model with transformers
(and an adapter with PeftModel.from_pretrained) and writes the log-probs of FILE's sequences
(a JSON list of token-id lists) as a JSON list of lists: an rlhf adapter or merged model
checked by PEFT and transformers themselves.

`values --model DIR --adapter DIR --inputs FILE --out FILE` loads a value model as
AutoModelForSequenceClassification (num_labels 1) with an rlhf-exported adapter whose value head
PEFT restores from modules_to_save, and writes each sequence's score (the head at its last
token) as a JSON list: a LoRA reward model or critic checked by PEFT itself.

FP32, eval mode, eager attention; one sequence at a time (no padding), as `rlhf logprobs`.
"""

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local directories only; never the network
import peft
import torch
import transformers

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def common(**extra):
    fields = dict(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    fields.update(extra)
    return fields


def cases():
    """name -> (model class, config, LoRA options)."""
    t = transformers
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    return {
        "llama": (
            t.LlamaForCausalLM,
            t.LlamaConfig(**common(rope_parameters=rope, tie_word_embeddings=True)),
            dict(r=4, lora_alpha=8),
        ),
        "qwen2": (
            t.Qwen2ForCausalLM,
            t.Qwen2Config(**common(rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
            dict(r=8, lora_alpha=6, use_rslora=True),
        ),
    }


def load(path):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


@torch.no_grad()
def log_probs(model, sequences):
    out = []
    for seq in sequences:
        ids = torch.tensor([seq])
        logits = model(input_ids=ids).logits.float()
        lp = torch.log_softmax(logits[0, :-1], dim=-1).gather(-1, ids[0, 1:].unsqueeze(-1))
        out.append(lp.squeeze(-1).tolist())
    return out


def make(args):
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    for name, (cls, config, lora) in cases().items():
        out = os.path.join(args.out, name)
        config._attn_implementation = "eager"
        base = cls(config).float().eval()
        base.save_pretrained(os.path.join(out, "base"))
        vocab = config.vocab_size
        sequences = [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in (9, 16)]
        base = load(os.path.join(out, "base"))
        ref = {"sequences": sequences, "base": log_probs(base, sequences)}
        lora_config = peft.LoraConfig(
            target_modules=TARGETS, task_type="CAUSAL_LM", init_lora_weights=False, **lora
        )
        model = peft.get_peft_model(base, lora_config).eval()
        model.save_pretrained(os.path.join(out, "adapter"))
        model = peft.PeftModel.from_pretrained(
            load(os.path.join(out, "base")), os.path.join(out, "adapter")
        ).eval()
        ref["adapter"] = log_probs(model, sequences)
        ref["merged"] = log_probs(model.merge_and_unload().eval(), sequences)
        with open(os.path.join(out, "reference.json"), "w") as f:
            json.dump(ref, f)
    print(f"peft {peft.__version__}, transformers {transformers.__version__}: wrote {args.out}")


def score(args):
    with open(args.inputs) as f:
        sequences = json.load(f)
    model = load(args.model)
    if args.adapter:
        model = peft.PeftModel.from_pretrained(model, args.adapter).eval()
    with open(args.out, "w") as f:
        json.dump(log_probs(model, sequences), f)


@torch.no_grad()
def values(args):
    with open(args.inputs) as f:
        sequences = json.load(f)
    base = transformers.AutoModelForSequenceClassification.from_pretrained(
        args.model, num_labels=1, dtype=torch.float32, attn_implementation="eager"
    )
    model = peft.PeftModel.from_pretrained(base, args.adapter).eval()
    assert type(model).__name__ == "PeftModelForSequenceClassification", type(model).__name__
    scores = [model(input_ids=torch.tensor([seq])).logits[0, 0].item() for seq in sequences]
    with open(args.out, "w") as f:
        json.dump(scores, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("make", help="random base models, PEFT adapters and their log-probs")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=make)
    p = sub.add_parser("score", help="log-probs of a model (and adapter) under transformers/PEFT")
    p.add_argument("--model", required=True)
    p.add_argument("--adapter")
    p.add_argument("--inputs", required=True, help="JSON list of token-id lists")
    p.add_argument("--out", required=True)
    p.set_defaults(run=score)
    p = sub.add_parser("values", help="scores of a value model and adapter under PEFT (SEQ_CLS)")
    p.add_argument("--model", required=True)
    p.add_argument("--adapter", required=True)
    p.add_argument("--inputs", required=True, help="JSON list of token-id lists")
    p.add_argument("--out", required=True)
    p.set_defaults(run=values)
    args = parser.parse_args()
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    args.run(args)


if __name__ == "__main__":
    main()
