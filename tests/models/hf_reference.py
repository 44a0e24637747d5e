"""Hugging Face `transformers` as the reference for rlhf's models (run by hf_parity_test.cpp).

`make --out DIR --seed N` random-initialises tiny Llama, Qwen2, Qwen3, Mistral and Gemma 3 models, and
the mixtures of experts Qwen3-MoE, Qwen2-MoE and Mixtral, with transformers itself, saves each with save_pretrained (FP32 safetensors, the byte tokenizer's
tokenizer_config.json so `rlhf generate` and `rlhf run` can read text), and writes HF's own
outputs next to them in DIR/<case>/reference.safetensors: logits and next-token log-probs
for a plain and a padded batch, per-token values and pooled scores of the value model, and
greedy `generate` tokens (DIR/<case>/greedy.json); for a mixture of experts also each sparse
layer's router logits and selected experts. It also writes config-only directories
under DIR/refuse/ with features rlhf does not implement, saved by transformers.

`logits --model DIR --inputs FILE --out FILE` loads any HF directory (e.g. an rlhf export)
with transformers and writes its FP32 logits for the input_ids/attention_mask in FILE.

Every model runs in FP32, eval mode, with the eager attention implementation: the plainest
reference, independent of the SDPA kernels rlhf uses. Position ids are passed explicitly as
rlhf and HF's own generate() derive them from the mask (cumsum - 1, padding at 1).
"""

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local directories only; never the network
import torch
import transformers
from safetensors.torch import load_file, save_file

PAD, BOS, EOS = 256, 257, 258  # rlhf's byte tokenizer: ids 0..255 are bytes
VOCAB = 272  # >= 259 for the byte tokenizer
BYTE_TOKENIZER_CONFIG = {
    "tokenizer_class": "RlhfByteTokenizer",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "pad_token": "<pad>",
    "add_bos_token": True,
}
GREEDY_PROMPTS = ["hello world", "ab", "the quick brown fox"]  # different lengths: left-padded
GREEDY_NEW_TOKENS = 12


def common(**extra):
    """Config fields shared by every case: tiny, GQA, the byte tokenizer's special ids."""
    fields = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        initializer_range=0.1,  # larger than HF's 0.02 so logits spread and errors show
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        tie_word_embeddings=False,
    )
    fields.update(extra)
    return fields


def cases():
    """name -> (model class, config). Each case exercises a different part of the model."""
    t = transformers
    return {
        # Llama 3 style: rope_theta in rope_parameters (transformers 5 format), tied head.
        "llama": (
            t.LlamaForCausalLM,
            t.LlamaConfig(
                **common(
                    rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                    tie_word_embeddings=True,
                )
            ),
        ),
        # Qwen2: q/k/v biases (o_proj none), rope_theta 1e6, no sliding window.
        "qwen2": (
            t.Qwen2ForCausalLM,
            t.Qwen2Config(**common(rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
        ),
        # Qwen3: per-head q/k RMSNorm before RoPE, no biases, head_dim 16 > hidden / heads
        # (8), tied head.
        "qwen3": (
            t.Qwen3ForCausalLM,
            t.Qwen3Config(
                **common(
                    head_dim=16,
                    tie_word_embeddings=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                )
            ),
        ),
        # Qwen3 with attention_bias (q/k/v and o_proj biased), head_dim 8 < hidden / heads
        # (12), untied head.
        "qwen3-bias": (
            t.Qwen3ForCausalLM,
            t.Qwen3Config(
                **common(
                    hidden_size=48,
                    head_dim=8,
                    attention_bias=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                )
            ),
        ),
        # Mistral: sliding window 4 shorter than the sequences, head_dim != hidden / heads,
        # linear RoPE scaling.
        "mistral": (
            t.MistralForCausalLM,
            t.MistralConfig(
                **common(
                    hidden_size=48,
                    head_dim=16,
                    sliding_window=4,
                    rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
                )
            ),
        ),
        # Gemma 3 (text): sliding layers (window 4, shorter than the sequences; RoPE base 1e4)
        # around a global one (linear-scaled RoPE, base 1e6), (1 + w) norms, four per layer,
        # gelu-tanh MLP, sqrt(H)-scaled embedding, q.k scaled by query_pre_attn_scalar^-0.5
        # (24, not head_dim 16), tied head.
        "gemma3": (
            t.Gemma3ForCausalLM,
            t.Gemma3TextConfig(
                **common(
                    num_hidden_layers=3,
                    head_dim=16,
                    query_pre_attn_scalar=24,
                    sliding_window=4,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    rope_parameters={
                        "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    },
                    tie_word_embeddings=True,
                )
            ),
        ),
        # Qwen3-MoE: 8 experts, top-2 renormalised (norm_topk_prob), layer 1 dense
        # (mlp_only_layers) between two sparse ones, per-head q/k norms.
        "qwen3-moe": (
            t.Qwen3MoeForCausalLM,
            t.Qwen3MoeConfig(
                **common(
                    num_hidden_layers=3,
                    head_dim=16,
                    num_experts=8,
                    num_experts_per_tok=2,
                    moe_intermediate_size=24,
                    norm_topk_prob=True,
                    mlp_only_layers=[1],
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                )
            ),
        ),
        # Qwen3-MoE whose routing has ties: randomise() makes experts 2i and 2i+1's router rows
        # equal (exact ties) in layer 0 and 1e-6 apart (near-ties) in layer 2; 16 experts,
        # top-3 (odd, so the third pick splits a tied pair and the tie-break decides which
        # expert runs), weights not renormalised.
        "qwen3-moe-ties": (
            t.Qwen3MoeForCausalLM,
            t.Qwen3MoeConfig(
                **common(
                    num_hidden_layers=3,
                    head_dim=16,
                    num_experts=16,
                    num_experts_per_tok=3,
                    moe_intermediate_size=16,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                )
            ),
        ),
        # Qwen2-MoE: 16 experts, top-4 not renormalised, a sigmoid-gated shared expert,
        # q/k/v biases; decoder_sparse_step 2 makes layer 1 of 3 the only sparse one.
        "qwen2-moe": (
            t.Qwen2MoeForCausalLM,
            t.Qwen2MoeConfig(
                **common(
                    num_hidden_layers=3,
                    num_experts=16,
                    num_experts_per_tok=4,
                    moe_intermediate_size=16,
                    shared_expert_intermediate_size=40,
                    decoder_sparse_step=2,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                )
            ),
        ),
        # Mixtral: 8 experts of intermediate_size, top-2 renormalised, FP32 routing weights,
        # its own names (block_sparse_moe, w1/w2/w3).
        "mixtral": (
            t.MixtralForCausalLM,
            t.MixtralConfig(
                **common(
                    num_local_experts=8,
                    num_experts_per_tok=2,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                )
            ),
        ),
        # A reward/critic model: LlamaForSequenceClassification with one label, llama3 RoPE,
        # attention and MLP biases.
        "llama-value": (
            t.LlamaForSequenceClassification,
            t.LlamaConfig(
                **common(
                    num_labels=1,
                    attention_bias=True,
                    mlp_bias=True,
                    rope_parameters={
                        "rope_type": "llama3",
                        "rope_theta": 500000.0,
                        "factor": 8.0,
                        "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 16,
                    },
                )
            ),
        ),
    }


def refused_cases():
    """name -> config with a feature rlhf does not implement (hf_parity_test.cpp names the
    key each must be refused by)."""
    t = transformers
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    return {
        "qwen2-sliding-window": t.Qwen2Config(
            **common(use_sliding_window=True, sliding_window=4, max_window_layers=1)
        ),
        "qwen2-layer-types": t.Qwen2Config(
            **common(layer_types=["full_attention", "sliding_attention"], sliding_window=4)
        ),
        "qwen3-sliding-window": t.Qwen3Config(
            **common(head_dim=8, use_sliding_window=True, sliding_window=4, max_window_layers=1)
        ),
        "deepseek-v3": t.DeepseekV3Config(
            **common(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=16)
        ),
        "mixtral-jitter": t.MixtralConfig(
            **common(num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.1)
        ),
        "qwen3-moe-top-k": t.Qwen3MoeConfig(
            **common(num_experts=4, num_experts_per_tok=6, moe_intermediate_size=16)
        ),
        "llama-yarn": t.LlamaConfig(
            **common(
                rope_parameters={
                    "rope_type": "yarn",
                    "rope_theta": 10000.0,
                    "factor": 4.0,
                    "original_max_position_embeddings": 32,
                }
            )
        ),
        "llama-dynamic": t.LlamaConfig(
            **common(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
        ),
        "llama-partial-rotary": t.LlamaConfig(
            **common(
                rope_parameters={
                    "rope_type": "linear",
                    "rope_theta": 10000.0,
                    "factor": 2.0,
                    "partial_rotary_factor": 0.5,
                }
            )
        ),
        "llama-attention-dropout": t.LlamaConfig(
            **common(rope_parameters=rope, attention_dropout=0.1)
        ),
        "llama-gelu": t.LlamaConfig(**common(rope_parameters=rope, hidden_act="gelu")),
        "gemma3-softcapping": t.Gemma3TextConfig(**common(final_logit_softcapping=30.0)),
        "llama-token-classification": t.LlamaConfig(
            **common(rope_parameters=rope, architectures=["LlamaForTokenClassification"])
        ),
    }


def randomise(model, generator):
    """HF's init leaves norms at 1 and biases at 0; give them random values too, so a
    missing bias or a misread norm weight (Qwen3's per-head q_norm / k_norm included: their
    names end in norm.weight) changes the outputs."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=generator))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=generator))
        if isinstance(model, transformers.Qwen3MoeForCausalLM) and model.config.num_experts == 16:
            make_router_ties(model, generator)


def make_router_ties(model, generator):
    """Experts 2i and 2i+1 get the same router row in layer 0 (their probabilities tie
    exactly, so torch.topk's tie-break decides) and rows 1e-6 apart in layer 2 (near-ties
    that a different summation order could flip)."""
    for layer, gap in ((0, 0.0), (2, 1e-6)):
        w = model.model.layers[layer].mlp.gate.weight
        noise = torch.randn(w[1::2].shape, generator=generator)
        w[1::2] = w[0::2] + gap * noise


def position_ids(mask):
    """rlhf's and HF generate()'s positions: cumsum(mask) - 1, padding positions at 1."""
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)


def batches(generator):
    """A plain batch (no padding: SDPA without a dense mask) and a padded one (left padding
    of 0, 3 and 7 tokens, and one right-padded row: a dense mask). Token ids avoid PAD."""
    T = 12
    plain = torch.randint(0, PAD, (2, T), generator=generator)
    padded = torch.randint(0, PAD, (4, T), generator=generator)
    mask = torch.ones(4, T, dtype=torch.long)
    for row, left in ((1, 3), (2, 7)):
        mask[row, :left] = 0
    mask[3, T - 4 :] = 0  # right padding
    padded = padded.masked_fill(mask == 0, PAD)
    return plain, padded, mask


def routers(model):
    """{layer index: router module} of a mixture-of-experts model's sparse layers."""
    out = {}
    for i, layer in enumerate(model.model.layers):
        block = getattr(layer, "block_sparse_moe", None) or getattr(layer, "mlp", None)
        gate = getattr(block, "gate", None)
        if gate is not None and not isinstance(gate, torch.nn.Linear):
            out[i] = gate
    return out


@torch.no_grad()
def router_outputs(model, ids, mask, kind):
    """Each sparse layer's router logits [B T, E] and selected experts [B T, k] for one batch,
    as `<kind>_router_logits_<layer>` / `<kind>_router_experts_<layer>`."""
    seen, hooks = {}, []
    for i, gate in routers(model).items():
        hooks.append(gate.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(i, out)))
    forward_logits(model, ids, mask)
    for h in hooks:
        h.remove()
    ref = {}
    for i, (logits, _scores, experts) in seen.items():
        ref[f"{kind}_router_logits_{i}"] = logits.float()
        ref[f"{kind}_router_experts_{i}"] = experts.long()
    return ref


def aux_outputs(model, ids, mask, kind):
    """The load-balancing loss of a mixture of experts (output_router_logits: transformers'
    load_balancing_loss_func over every sparse layer, padding masked) as `<kind>_aux_loss`, and
    its gradient on each router's weight as `<kind>_aux_grad_<layer>`."""
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask),
                output_router_logits=True)
    out.aux_loss.backward()
    ref = {f"{kind}_aux_loss": out.aux_loss.detach().float().reshape(1)}
    for i, gate in routers(model).items():
        ref[f"{kind}_aux_grad_{i}"] = gate.weight.grad.float().clone()
    model.zero_grad()
    return ref


@torch.no_grad()
def forward_logits(model, ids, mask):
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask))
    return out.logits.float()


def next_token_log_probs(logits, ids):
    """[B, T, V], [B, T] -> [B, T-1]: log p(ids[t+1] | ids[..t])."""
    lp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return lp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def greedy(model):
    """HF generate(do_sample=False) on the byte-tokenized prompts, left-padded as rlhf does.
    Returns each prompt's new tokens up to and including EOS."""
    encoded = [[BOS] + list(p.encode("utf-8")) for p in GREEDY_PROMPTS]
    P = max(len(e) for e in encoded)
    ids = torch.full((len(encoded), P), PAD, dtype=torch.long)
    mask = torch.zeros((len(encoded), P), dtype=torch.long)
    for b, e in enumerate(encoded):
        ids[b, P - len(e) :] = torch.tensor(e)
        mask[b, P - len(e) :] = 1
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=GREEDY_NEW_TOKENS,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    responses = []
    for row in out[:, P:].tolist():
        response = []
        for tok in row:
            response.append(tok)
            if tok == EOS:
                break
        responses.append(response)
    return {"prompts": GREEDY_PROMPTS, "max_new_tokens": GREEDY_NEW_TOKENS, "responses": responses}


def load(cls_or_auto, path):
    model = cls_or_auto.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def make(args):
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    plain, padded, mask = batches(generator)
    for name, (cls, config) in cases().items():
        config._attn_implementation = "eager"
        model = cls(config).float().eval()
        randomise(model, generator)
        out = os.path.join(args.out, name)
        model.save_pretrained(out)
        with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
            json.dump(BYTE_TOKENIZER_CONFIG, f, indent=2)
        # Reload what was saved: the reference is the directory rlhf reads, not the object.
        model = load(cls, out)
        ref = {"plain_input_ids": plain, "padded_input_ids": padded, "padded_attention_mask": mask}
        runs = (("plain", plain, torch.ones_like(plain)), ("padded", padded, mask))
        if cls is transformers.LlamaForSequenceClassification:
            for kind, ids, m in runs:
                with torch.no_grad():
                    hidden = model.model(
                        input_ids=ids, attention_mask=m, position_ids=position_ids(m)
                    ).last_hidden_state
                    ref[kind + "_values"] = model.score(hidden).squeeze(-1).float()
                ref[kind + "_scores"] = forward_logits(model, ids, m).squeeze(-1)
        else:
            for kind, ids, m in runs:
                logits = forward_logits(model, ids, m)
                ref[kind + "_logits"] = logits
                ref[kind + "_log_probs"] = next_token_log_probs(logits, ids)
                ref.update(router_outputs(model, ids, m, kind))
                if routers(model):
                    ref.update(aux_outputs(model, ids, m, kind))
            with open(os.path.join(out, "greedy.json"), "w") as f:
                json.dump(greedy(model), f)
        ref = {k: v.contiguous() for k, v in ref.items()}
        save_file(ref, os.path.join(out, "reference.safetensors"))
    for name, config in refused_cases().items():
        config.save_pretrained(os.path.join(args.out, "refuse", name))
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: wrote {args.out}")


def logits(args):
    inputs = load_file(args.inputs)
    ids, mask = inputs["input_ids"].long(), inputs["attention_mask"].long()
    model = load(transformers.AutoModelForCausalLM, args.model)
    save_file({"logits": forward_logits(model, ids, mask).contiguous()}, args.out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("make", help="random-initialise the models and write HF's outputs")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=make)
    p = sub.add_parser("logits", help="HF's FP32 logits of a model directory")
    p.add_argument("--model", required=True)
    p.add_argument("--inputs", required=True, help="safetensors with input_ids, attention_mask")
    p.add_argument("--out", required=True)
    p.set_defaults(run=logits)
    args = parser.parse_args()
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    args.run(args)


if __name__ == "__main__":
    sys.exit(main())
