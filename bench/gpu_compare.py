#!/usr/bin/env python3
"""rlhf against Hugging Face on the same device: reads bench_gpu's and hf_gpu_reference.py's
--out files and prints, per (model, batch, sampling), decode tokens/s of each and the ratio
rlhf / HF (above 1: rlhf is faster), and per model the training step's tokens/s, MFU and
peak memory of each. Rows present in only one file are shown with '-' for the other.

Run: python3 bench/gpu_compare.py RLHF.json HF.json
"""
import json
import sys


def gib(b):
    return "-" if b is None or b < 0 else f"{b / 2**30:.2f}"


def num(x, fmt):
    return "-" if x is None else format(x, fmt)


def ratio(a, b):
    return None if a is None or not b else a / b


def decode_key(row):
    return row["model"], row["batch"], row["sampling"]


def mfu(row):
    """MFU against the spec peak, or against the measured GEMM where there is no spec entry."""
    spec = row.get("mfu_spec")
    return spec if spec is not None and spec > 0 else row.get("mfu_measured_gemm")


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        ours = json.load(f)
    with open(argv[2]) as f:
        ref = json.load(f)
    print(f"rlhf: {ours.get('device_name')}   HF: {ref.get('device_name')} "
          f"(transformers {ref.get('transformers', '?')})")
    if ours.get("device_name") != ref.get("device_name"):
        print("warning: the two files come from different devices; ratios compare machines too")

    # rlhf measures several decode engines (contiguous, paged, graphs) per HF row.
    a = {}
    for r in ours.get("decode", []):
        a.setdefault(decode_key(r), []).append(r)
    b = {decode_key(r): r for r in ref.get("decode", [])}
    print("\ndecode tokens/s (batch x (new - 1) / (generate(new) - generate(1)))")
    print(f"{'model':<6} {'batch':>6} {'sampling':<8} {'engine':<10} {'rlhf':>10} {'HF':>10} "
          f"{'rlhf/HF':>8} {'rlhf/bound_w':>12} {'HF/bound_w':>10} {'rlhf GiB':>9} {'HF GiB':>7}")
    for k in sorted(set(a) | set(b)):
        y = b.get(k, {})
        ty = y.get("decode_tokens_per_s")
        for x in a.get(k, [{}]):
            tx = x.get("decode_tokens_per_s")
            print(f"{k[0]:<6} {k[1]:>6} {k[2]:<8} {x.get('engine', 'contiguous'):<10} "
                  f"{num(tx, '10.1f')} {num(ty, '10.1f')} "
                  f"{num(ratio(tx, ty), '8.3f')} "
                  f"{num(ratio(tx, x.get('bound_weights_tokens_per_s')), '12.3f')} "
                  f"{num(ratio(ty, y.get('bound_weights_tokens_per_s')), '10.3f')} "
                  f"{gib(x.get('peak_allocated_bytes')):>9} {gib(y.get('peak_allocated_bytes')):>7}")

    a = {r["model"]: r for r in ours.get("train", [])}
    b = {r["model"]: r for r in ref.get("train", [])}
    print("\ntraining step (one forward + backward + AdamW step, per-layer checkpointing)")
    print(f"{'model':<6} {'batch x seq':>12} {'rlhf tok/s':>11} {'HF tok/s':>10} {'rlhf/HF':>8} "
          f"{'rlhf MFU':>9} {'HF MFU':>7} {'rlhf GiB':>9} {'HF GiB':>7}")
    for m in sorted(set(a) | set(b)):
        x, y = a.get(m, {}), b.get(m, {})
        tx, ty = x.get("tokens_per_s"), y.get("tokens_per_s")
        shape = f"{x.get('batch', y.get('batch'))} x {x.get('seq', y.get('seq'))}"
        if x and y and (x["batch"], x["seq"]) != (y["batch"], y["seq"]):
            shape += " (differ!)"
        print(f"{m:<6} {shape:>12} {num(tx, '11.0f')} {num(ty, '10.0f')} "
              f"{num(ratio(tx, ty), '8.3f')} {num(mfu(x), '9.3f')} {num(mfu(y), '7.3f')} "
              f"{gib(x.get('peak_allocated_bytes')):>9} {gib(y.get('peak_allocated_bytes')):>7}")
    print("\nMFU: model FLOPs (6 x P + 12 x L x d x T per token) over the spec BF16 peak (over the"
          " measured GEMM where the device has no spec entry)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
