#!/usr/bin/env python3
"""as_h100.py — make each H200 of the GPU machine hold no more than an 80 GB H100 would, for runs whose point
is that they fit an H100 (issue 18: 1M tokens on two H100s; the lent two-GPU kind has come as H200s).

    python3 tests/cuda/as_h100.py READY_FILE &      (gpu_env.sh, AS_H100=1, starts and stops it)

On every visible GPU it allocates a ballast of (the GPU's total - an H100 80GB HBM3's 81,559 MiB), less its
own CUDA context, so the memory left free for other processes is what the same machine would leave on an
H100; then it writes READY_FILE (one line per GPU: total, free before, ballast, free after, in MiB) and
sleeps until killed. A GPU of 81,559 MiB or less gets no ballast. What it proves: an allocation that would not
fit an H100 fails here too. What it does not: H100 speed (an H200's memory is faster), and "in use" figures
read by cudaMemGetInfo on such a GPU include the ballast (subtract the printed ballast).
"""
import sys
import time

import torch

H100_MIB = 81559  # nvidia-smi's total for NVIDIA H100 80GB HBM3 (KINDS.md)
MIB = 1 << 20


def main():
    ready = sys.argv[1]
    held, lines = [], []
    for d in range(torch.cuda.device_count()):
        torch.cuda.set_device(d)
        torch.empty(1, device=d)  # the context first: its memory counts against the ballast
        free0, total = torch.cuda.mem_get_info(d)
        want = total // MIB - H100_MIB  # MiB to take away so that total - taken = an H100's total
        used_by_us = (total - free0) // MIB
        ballast = max(0, want - used_by_us)  # this process's context is part of what is taken
        if ballast:
            held.append(torch.empty(ballast * MIB, dtype=torch.uint8, device=d))
        free1, _ = torch.cuda.mem_get_info(d)
        lines.append(f"GPU {d}: total {total // MIB} MiB, free {free0 // MIB} -> {free1 // MIB} MiB, "
                     f"ballast {ballast} MiB + context {used_by_us} MiB (an H100 80GB: {H100_MIB} MiB total)")
    with open(ready, "w") as f:
        f.write("\n".join(lines) + "\n")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
