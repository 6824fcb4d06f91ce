#!/usr/bin/python3
"""compare_curves.py — compares two runs' loss curves (metrics.jsonl), step by step:

    python3 tests/cuda/compare_curves.py REF/metrics.jsonl GOT/metrics.jsonl [--tol 0.02]

REF is the cpu run (fp32 oracle), GOT the cuda run of the same config, seed and data. Passes
(exit 0) when both hold the same steps and every step's |loss_got - loss_ref| / loss_ref <= tol;
prints the table (step, both losses, relative difference) and the worst step. Used by
tests/cuda/model_check.sh.
"""
import argparse
import json
import sys


def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            o = json.loads(line)
            out[o["step"]] = o["loss"]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("ref")
    ap.add_argument("got")
    ap.add_argument("--tol", type=float, default=0.02, help="relative bound per step (default 0.02)")
    a = ap.parse_args(argv)
    ref, got = losses(a.ref), losses(a.got)
    if sorted(ref) != sorted(got) or not ref:
        print("compare_curves: the runs hold different steps: %s vs %s" % (sorted(ref), sorted(got)))
        return 1
    worst = (0.0, None)
    print("step  loss_ref      loss_got      rel_diff")
    for s in sorted(ref):
        d = abs(got[s] - ref[s]) / abs(ref[s])
        worst = max(worst, (d, s))
        print("%4d  %.6f  %.6f  %.2e%s" % (s, ref[s], got[s], d, "" if d <= a.tol else "  > tol"))
    ok = worst[0] <= a.tol
    print("compare_curves: worst step %s rel diff %.3e %s %.1e: %s" % (worst[1], worst[0], "<=" if ok else ">", a.tol,
                                                                     "ok" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
