#!/usr/bin/env python3
"""c10d Gloo's own collectives vs the formulations transport/gloo_group.cpp uses, on the
same LibTorch (the torch 2.11 wheel of scripts/python-env), 2 ranks over loopback, one
torch thread each. Prints the mean time per call (after a warm-up) and its ratio to a
memcpy of the same bytes, which is the floor for any collective that moves them.

Run: "$(scripts/python-env)" bench/gloo_collectives.py [MiB=64] [reps=5]
     "$(scripts/python-env)" bench/gloo_collectives.py latency   # a 1.5 KB BF16 all_reduce,
     mean of 500 (what each all-reduce of a tensor-parallel decode step of one row costs)
"""
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def timed(fn, reps):
    fn()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    dist.barrier()
    return (time.perf_counter() - start) / reps


def run(rank, world, port, mib, reps):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    if mib == 0:  # latency
        small = torch.ones(768, dtype=torch.bfloat16)
        seconds = timed(lambda: dist.all_reduce(small), 500)
        if rank == 0:
            print(f"gloo_collectives: torch {torch.__version__}, {world} ranks, all_reduce of "
                  f"768 BF16 (1.5 KB): {seconds * 1e6:.0f} us per call, mean of 500")
        dist.destroy_process_group()
        return
    n = mib * 1024 * 1024 // 4
    piece = n // world
    full = torch.randn(n)
    out = torch.empty(n)
    shard = torch.empty(piece)
    mine = slice(rank * piece, (rank + 1) * piece)

    def gather_by_sum():  # gloo_group.cpp: zero, place own piece, int32-word sum all-reduce
        out.zero_()
        out[mine].copy_(shard)
        dist.all_reduce(out.view(torch.int32))

    wide = torch.empty(n)
    half = torch.randn(n, dtype=torch.bfloat16)

    def bf16_through_fp32():  # gloo_group.cpp: BF16 sums go through FP32
        wide.copy_(half)
        dist.all_reduce(wide)
        half.copy_(wide)

    cases = [
        ("memcpy (torch copy_), FP32", lambda: out.copy_(full)),
        ("all_reduce FP32", lambda: dist.all_reduce(full)),
        ("reduce_scatter: c10d _reduce_scatter_base", lambda: dist.reduce_scatter_tensor(shard, full)),
        ("reduce_scatter: all_reduce + own slice (ours)",
         lambda: (dist.all_reduce(full), shard.copy_(full[mine]))),
        ("all_gather: c10d _allgather_base", lambda: dist.all_gather_into_tensor(out, shard)),
        ("all_gather: int32-word sum all_reduce (ours)", gather_by_sum),
        ("all_reduce BF16 (half the bytes): c10d native", lambda: dist.all_reduce(half)),
        ("all_reduce BF16: through FP32 (ours)", bf16_through_fp32),
        ("broadcast BF16: c10d native (ours)", lambda: dist.broadcast(half, 0)),
    ]
    results = [(name, timed(fn, reps)) for name, fn in cases]
    if rank == 0:
        memcpy = results[0][1]
        print(f"gloo_collectives: torch {torch.__version__}, {world} ranks, {mib} MiB FP32 "
              f"buffer, mean of {reps}, loadavg {' '.join(open('/proc/loadavg').read().split()[:3])}")
        print(f"| operation | ms | x memcpy |\n| --- | ---: | ---: |")
        for name, seconds in results:
            print(f"| {name} | {seconds * 1e3:.1f} | {seconds / memcpy:.1f} |")
    dist.destroy_process_group()


def main():
    mib = 0 if sys.argv[1:2] == ["latency"] else int(sys.argv[1]) if len(sys.argv) > 1 else 64
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(run, args=(2, port, mib, reps), nprocs=2)


if __name__ == "__main__":
    main()
