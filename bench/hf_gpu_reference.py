#!/usr/bin/env python3
"""The Hugging Face reference for bench_gpu: the same Qwen2.5-0.5B / -1.5B shapes as
Qwen2ForCausalLM (random init, sdpa attention) on one device, measured the same way:

  a. decode tokens/s of model.generate (BF16 weights, use_cache=True, greedy and
     temperature 1 with no top-k/top-p, min_new_tokens = max_new_tokens and no EOS so every
     row makes exactly --new-tokens tokens). Decode only: a full generate minus a 1-token
     generate (prefill + first token), both synchronised; tokens = batch x (new - 1). The
     limit is the weight-bandwidth bound, copy bandwidth measured here / BF16 weight bytes x
     batch.
  b. one training step: FP32 master parameters, forward and backward under
     torch.autocast(bfloat16), gradient checkpointing per decoder layer
     (model.gradient_checkpointing_enable, named activation_checkpointing_enable from
     transformers 5 on; non-reentrant), loss = mean next-token NLL (labels = input ids),
     clip_grad_norm_(1.0), torch.optim.AdamW (fused on cuda; betas 0.9/0.95 as rlhf's
     defaults). MFU of model FLOPs (6 x P + 12 x L x d x T per token) against the BF16 dense
     spec peak and a measured 8192^3 BF16 GEMM; the hardware figure adds the
     recompute (8 x layer params + 6 x head + 16 x L x d x T).
  c. peak memory (torch.cuda.max_memory_allocated / max_memory_reserved) of each.

Run: python3 bench/hf_gpu_reference.py --device cuda [--models 0.5b,1.5b] [--batches 1,32,256]
       [--new-tokens 128] [--prompt-len 128] [--train-seq 1024] [--train-batch 8] [--steps 3]
       [--out FILE.json]
     "$(scripts/python-env)" bench/hf_gpu_reference.py --device cpu --models tiny   (smoke test)
Exits 3 when transformers cannot be imported, 2 when --device cuda finds no GPU.
"""
import argparse
import inspect
import json
import sys
import time

import torch

try:
    import transformers
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM
except ImportError as e:  # the GPU machine may have torch without transformers
    print(f"hf_gpu_reference: cannot import transformers ({e}); install it "
          "(pip install transformers) to run the HF reference", file=sys.stderr)
    sys.exit(3)

# Spec-sheet BF16 dense FLOP/s and HBM bytes/s by device name (as bench_gpu.cpp).
SPECS = [("H200", 989e12, 4.8e12), ("H100 NVL", 835e12, 3.9e12), ("H100 PCIe", 756e12, 2.0e12),
         ("H100", 989e12, 3.35e12), ("A100", 312e12, 2.0e12)]

# Qwen2.5 shapes (their config.json); "tiny" matches rlhf's tiny preset's sizes.
SHAPES = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=176, vocab_size=288, tie_word_embeddings=False, rope_theta=1e4),
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                 tie_word_embeddings=True, rope_theta=1e6),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, intermediate_size=8960, vocab_size=151936,
                 tie_word_embeddings=True, rope_theta=1e6),
}


def qwen_config(name):
    if name not in SHAPES:
        raise SystemExit(f"hf_gpu_reference: unknown model {name} ({', '.join(SHAPES)})")
    shape = dict(SHAPES[name])
    theta = shape.pop("rope_theta")
    if "rope_parameters" in inspect.signature(Qwen2Config.__init__).parameters:  # transformers 5
        shape["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    else:
        shape["rope_theta"] = theta
    return Qwen2Config(**shape, rms_norm_eps=1e-6, max_position_embeddings=32768,
                       use_sliding_window=False, bos_token_id=None, eos_token_id=None,
                       pad_token_id=None)


def build_model(config, device, dtype):
    with torch.device(device):  # initialise on the device: seconds, not a minute on the host
        model = Qwen2ForCausalLM._from_config(config, attn_implementation="sdpa")
    return model.to(dtype)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device, fn):
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


def reset_peak(device):
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak(device):
    if device.type != "cuda":
        return {"peak_allocated_bytes": -1, "peak_reserved_bytes": -1}
    return {"peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(device)}


def gib(b):
    return "n/a" if b < 0 else f"{b / 2**30:.2f} GiB"


def copy_bandwidth(device):
    """Bytes read + written per second by copy_ (1 GiB on cuda, 256 MiB on cpu), best of 5x10."""
    n = (1 << 30) if device.type == "cuda" else (256 << 20)
    src = torch.ones(n, dtype=torch.uint8, device=device)
    dst = torch.zeros_like(src)
    dst.copy_(src)
    best = min(timed(device, lambda: [dst.copy_(src) for _ in range(10)])[0] for _ in range(5))
    assert dst[-1].item() == 1
    return 2.0 * n * 10 / best


def matmul_flops(device):
    """BF16 FLOP/s of an n^3 GEMM (8192 on cuda, 1024 on cpu), best of 3."""
    n = 8192 if device.type == "cuda" else 1024
    reps = 20 if device.type == "cuda" else 2
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    c = a @ b
    best = min(timed(device, lambda: [torch.mm(a, b, out=c) for _ in range(reps)])[0]
               for _ in range(3))
    return 2.0 * n**3 * reps / best


def matmul_params(config, params):
    """Parameters a matmul reads: all but an untied input embedding (a row lookup)."""
    return params - (0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size)


def train_flops(config, params, seq):
    """Model and hardware FLOPs per trained token, as bench_gpu.cpp's train_flops."""
    mm = matmul_params(config, params)
    head = config.vocab_size * config.hidden_size
    head_dim = config.hidden_size // config.num_attention_heads
    attention = 12.0 * config.num_hidden_layers * config.num_attention_heads * head_dim * seq
    model = 6.0 * mm + attention
    return model, model + 2.0 * (mm - head) + attention / 3.0


def generate(model, ids, new_tokens, greedy):
    config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              do_sample=not greedy, use_cache=True, pad_token_id=0,
                              eos_token_id=None, bos_token_id=None)
    if not greedy:
        config.temperature, config.top_k, config.top_p = 1.0, 0, 1.0
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                         generation_config=config)
    assert out.shape[1] == ids.shape[1] + new_tokens, f"stopped early: {tuple(out.shape)}"
    return out


def bench_decode(name, model, config, args, device, bw):
    params = sum(p.numel() for p in model.parameters())
    weight_bytes = 2.0 * matmul_params(config, params)
    head_dim = config.hidden_size // config.num_attention_heads
    kv_position = 2.0 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 2.0
    P, R = args.prompt_len, args.new_tokens
    print(f"\n== a. decode: {name} ({params / 1e6:.2f} M params, {weight_bytes / 1e9:.3f} GB BF16 "
          f"weights read per step), prompt {P}, {R} new tokens, no EOS")
    print("   tok/s = batch x (new - 1) / (generate(new) - generate(1)), both synchronised; "
          "bound_w = bandwidth / weight bytes x batch")
    print(f"{'batch':>6} {'sampling':<13} {'prefill_s':>9} {'decode_s':>9} {'ms/step':>8} "
          f"{'tok/s':>10} {'bound_w':>10} {'ratio':>6} {'bound_kv':>10} {'ratio':>6} "
          f"{'peak_alloc':>10} {'peak_resv':>10}")
    rows = []
    gen = torch.Generator().manual_seed(0)
    for batch in args.batches:
        ids = torch.randint(config.vocab_size, (batch, P), generator=gen).to(device)
        for greedy in (True, False):
            torch.manual_seed(1)
            with torch.no_grad():
                generate(model, ids, 4, greedy)  # warm-up at these shapes
                reset_peak(device)
                prefill, _ = timed(device, lambda: generate(model, ids, 1, greedy))
                total, _ = timed(device, lambda: generate(model, ids, R, greedy))
            mem = peak(device)
            decode = total - prefill
            tok_s = batch * (R - 1) / decode
            bound_w = batch * bw / weight_bytes
            bound_kv = batch * bw / (weight_bytes + batch * (P + R / 2) * kv_position)
            sampling = "greedy" if greedy else "temperature 1"
            print(f"{batch:>6} {sampling:<13} {prefill:>9.3f} {decode:>9.3f} "
                  f"{1e3 * decode / (R - 1):>8.2f} {tok_s:>10.1f} {bound_w:>10.1f} "
                  f"{tok_s / bound_w:>6.3f} {bound_kv:>10.1f} {tok_s / bound_kv:>6.3f} "
                  f"{gib(mem['peak_allocated_bytes']):>10} {gib(mem['peak_reserved_bytes']):>10}",
                  flush=True)
            rows.append(dict(model=name, batch=batch, sampling="greedy" if greedy else "sample",
                             prompt_len=P, new_tokens=R, prefill_s=prefill, decode_s=decode,
                             decode_tokens_per_s=tok_s, bound_weights_tokens_per_s=bound_w,
                             bound_weights_kv_tokens_per_s=bound_kv, **mem))
    return rows


def bench_train(name, config, args, device, spec_flops, gemm_flops):
    model = build_model(config, device, torch.float32)  # FP32 master parameters
    model.train()
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # its name from transformers 5 on
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    params = sum(p.numel() for p in model.parameters())
    fused = {"fused": True} if device.type == "cuda" else {"foreach": True}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.0, **fused)
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(config.vocab_size, (args.train_batch, args.train_seq),
                           generator=gen).to(device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(input_ids=tokens, labels=tokens, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    step()  # warm-up: optimizer state, kernels
    reset_peak(device)
    times, loss = [], 0.0
    for _ in range(args.steps):
        t, loss = timed(device, step)
        times.append(t)
    mem = peak(device)
    step_s = sum(times) / len(times)
    tokens_s = args.train_batch * args.train_seq / step_s
    model_f, hw_f = train_flops(config, params, args.train_seq)
    limit, limit_name = (spec_flops, "spec peak") if spec_flops > 0 else (gemm_flops, "GEMM")
    adamw = "fused" if "fused" in fused else "foreach"
    print(f"\n== b. training step: {name} ({params / 1e6:.2f} M params), batch {args.train_batch} "
          f"x seq {args.train_seq}, FP32 params + autocast BF16, AdamW ({adamw}), gradient "
          "checkpointing per layer, mean next-token NLL")
    print(f"   step {step_s:.4f} s (mean of {args.steps} after 1 warm-up), {tokens_s:.0f} "
          f"tokens/s, loss {loss:.3f}")
    print(f"   model FLOPs/token = {model_f:.3g}; achieved {tokens_s * model_f / 1e12:.1f} "
          "TFLOP/s")
    if spec_flops > 0:
        print(f"   MFU vs BF16 dense peak {spec_flops / 1e12:.0f} TFLOP/s (spec): "
              f"{tokens_s * model_f / spec_flops:.3f}")
    print(f"   MFU vs measured BF16 GEMM {gemm_flops / 1e12:.0f} TFLOP/s: "
          f"{tokens_s * model_f / gemm_flops:.3f}")
    print(f"   hardware FLOPs/token (+ recompute) = {hw_f:.3g}; {tokens_s * hw_f / 1e12:.1f} "
          f"TFLOP/s = {tokens_s * hw_f / limit:.3f} of {limit_name}")
    print(f"   peak memory over the timed steps: allocated {gib(mem['peak_allocated_bytes'])}, "
          f"reserved {gib(mem['peak_reserved_bytes'])}", flush=True)
    del model, opt
    return dict(model=name, batch=args.train_batch, seq=args.train_seq, step_s=step_s,
                tokens_per_s=tokens_s, loss=loss, model_flops_per_token=model_f,
                hardware_flops_per_token=hw_f,
                mfu_spec=tokens_s * model_f / spec_flops if spec_flops > 0 else -1.0,
                mfu_measured_gemm=tokens_s * model_f / gemm_flops,
                hfu_spec=tokens_s * hw_f / spec_flops if spec_flops > 0 else -1.0, **mem)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--models", default=None, help="default 0.5b,1.5b (cuda), tiny (cpu)")
    p.add_argument("--batches", default=None, help="default 1,32,256 (cuda), 1,8 (cpu)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--train-seq", type=int, default=None, help="default 1024 (cuda), 128 (cpu)")
    p.add_argument("--train-batch", type=int, default=None, help="default 8 (cuda), 2 (cpu)")
    p.add_argument("--steps", type=int, default=None, help="timed steps; default 3 (cuda), 2 (cpu)")
    p.add_argument("--sections", default="decode,train")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads; default 1 on cpu")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    a = p.parse_args()
    cuda = a.device == "cuda"
    a.models = (a.models or ("0.5b,1.5b" if cuda else "tiny")).split(",")
    a.batches = [int(b) for b in (a.batches or ("1,32,256" if cuda else "1,8")).split(",")]
    a.train_seq = a.train_seq or (1024 if cuda else 128)
    a.train_batch = a.train_batch or (8 if cuda else 2)
    a.steps = a.steps or (3 if cuda else 2)
    a.sections = set(a.sections.split(","))
    if a.new_tokens < 2:
        p.error("--new-tokens must be >= 2")
    return a


def main():
    args = parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("hf_gpu_reference: --device cuda asked, but torch sees no CUDA device; use "
              "--device cpu for the smoke test", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if args.threads or device.type == "cpu":
        torch.set_num_threads(args.threads or 1)
    transformers.logging.set_verbosity_error()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        memory = torch.cuda.get_device_properties(device).total_memory
    else:
        with open("/proc/cpuinfo") as f:
            models = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        name, memory = (models or ["cpu"])[0], -1
    spec_flops, spec_bw = next(((f, b) for n, f, b in SPECS if n in name), (0.0, 0.0))
    bw, gemm = copy_bandwidth(device), matmul_flops(device)
    print(f"hf_gpu_reference: device {device}: {name} ({gib(memory)}), torch "
          f"{torch.__version__}, transformers {transformers.__version__}, sdpa attention, "
          f"{torch.get_num_threads()} CPU threads")
    print(f"limits: copy_ bandwidth {bw / 1e9:.1f} GB/s measured (read + write)"
          + (f", spec {spec_bw / 1e9:.0f} GB/s" if spec_bw else "")
          + f"; BF16 GEMM {gemm / 1e12:.1f} TFLOP/s measured"
          + (f", BF16 dense peak {spec_flops / 1e12:.0f} TFLOP/s (spec)" if spec_flops else ""))
    out = dict(framework="hf", transformers=transformers.__version__, device=str(device),
               device_name=name, copy_bandwidth_bytes_per_s=bw, matmul_flops=gemm,
               spec_flops=spec_flops, decode=[], train=[])
    for name in args.models:
        config = qwen_config(name)
        if "decode" in args.sections:
            model = build_model(config, device, torch.bfloat16).eval()
            out["decode"] += bench_decode(name, model, config, args, device, bw)
            del model
        if "train" in args.sections:
            out["train"].append(bench_train(name, config, args, device, spec_flops, gemm))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2)
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
