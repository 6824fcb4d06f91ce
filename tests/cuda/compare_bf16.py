#!/usr/bin/python3
"""compare_bf16.py — judges the cuda backend's whole-model gradients against what bf16 storage
alone costs:

    python3 tests/cuda/compare_bf16.py CPU CUDA BF16EMU [--ratio 2] [--floor 1e-2] [--loss-tol 1e-2]

CPU, CUDA and BF16EMU are build/parity_step's grads files of one case on --device cpu, cuda and
cpu-bf16 (the cpu kernels with every activation stored in bf16, tests/parity/backend_bf16emu.c).
For every tensor, e_cuda = ||cuda - cpu|| / ||cpu|| and e_bf16 = ||bf16emu - cpu|| / ||cpu||; a
random-weight model can amplify bf16 rounding to several percent, so a fixed bound would either
miss bugs or fail on rounding. The check: e_cuda <= max(ratio * e_bf16, floor) per tensor (the
cuda kernels may cost at most `ratio` times what storing in bf16 costs, and a bug that breaks a
tensor costs far more), and the loss within loss-tol. Prints the table worst-first (by
e_cuda / allowed); exit 0 on pass. Used by tests/cuda/model_check.sh.

One emulated run is one draw of the rounding, and cuda's is another (its sums run in other orders,
so other elements round up). Most tensors' errors agree from draw to draw; a gradient that cancels
heavily (a linear layer's A_log: sum over tokens and channels of dg g, 100-300x cancellation) does
not: its error moves several-fold between draws, so one draw can sit far below cuda's without any
kernel at fault. --draws F1,F2,... (parity_step --emulate-bf16 --draw SEED: the same emulation with
stochastic rounding, independent draws) widen e_bf16 to the largest of the draws, each divided by
sqrt(2) (stochastic rounding's variance is twice round-to-nearest's): e_bf16 =
max(e_rne, max_i e_draw_i / sqrt(2)).
"""
import argparse
import os
import sys

import numpy as np

for _d in (os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"), os.path.join("tests", "parity")):
    sys.path.insert(0, _d)  # beside tests/cuda, or the repo root's when this file was copied elsewhere
import safetensors_io  # noqa: E402
from relerr import rel  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("cpu")
    ap.add_argument("cuda")
    ap.add_argument("bf16emu")
    ap.add_argument("--ratio", type=float, default=2.0)
    ap.add_argument("--floor", type=float, default=1e-2)
    ap.add_argument("--loss-tol", type=float, default=1e-2)
    ap.add_argument("--draws", default="", help="comma-separated grads files of stochastic-rounding draws")
    a = ap.parse_args(argv)
    cpu, cuda, emu = (safetensors_io.load(p) for p in (a.cpu, a.cuda, a.bf16emu))
    draws = [safetensors_io.load(p) for p in a.draws.split(",") if p]
    if any(set(cpu) != set(f) for f in [cuda, emu] + draws):
        print("compare_bf16: the files hold different tensors")
        return 1
    rows = []
    for name in cpu:
        ec = rel(cuda[name], cpu[name])
        ee = max([rel(emu[name], cpu[name])] + [rel(d[name], cpu[name]) / np.sqrt(2) for d in draws])
        allowed = a.loss_tol if name == "loss" else max(a.ratio * ee, a.floor)
        rows.append((ec / allowed if allowed > 0 else float("inf"), name, ec, ee, allowed))
    rows.sort(reverse=True)
    print(f"{'tensor':<48} {'e_cuda':>10} {'e_bf16':>10} {'allowed':>10}")
    for r, name, ec, ee, allowed in rows:
        print(f"{name:<48} {ec:>10.3e} {ee:>10.3e} {allowed:>10.3e}  {'ok' if r <= 1 else 'FAIL'}")
    bad = [r for r in rows if not r[0] <= 1]
    print(f"compare_bf16: {len(rows)} compared, {len(bad)} over; worst {rows[0][1]} at {rows[0][0]:.2f} of its "
          f"allowance: {'ok' if not bad else 'FAIL'}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
