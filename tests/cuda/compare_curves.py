#!/usr/bin/python3
"""compare_curves.py — compares two loss curves (jsonl lines with "step" and "loss": a run's
metrics.jsonl, or parity_step --steps' curve_<device>.jsonl), step by step:

    python3 tests/cuda/compare_curves.py REF.jsonl GOT.jsonl [--tol 0.01] [--per-step]

REF is the cpu run (fp32 oracle), GOT the cuda run of the same model, seed and data. The
difference of a step is |loss_got - loss_ref| divided by the reference's FIRST loss (the scale
of the problem: a curve that falls towards 0 would make a per-step ratio meaningless at its
end), or by that step's reference loss with --per-step. Passes (exit 0) when both hold the same
steps and every step is within tol; prints the table and the worst step. Used by
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
    ap.add_argument("--tol", type=float, default=0.01, help="bound per step (default 0.01)")
    ap.add_argument("--per-step", action="store_true", help="divide by each step's reference loss")
    a = ap.parse_args(argv)
    ref, got = losses(a.ref), losses(a.got)
    if sorted(ref) != sorted(got) or not ref:
        print("compare_curves: the runs hold different steps: %s vs %s" % (sorted(ref), sorted(got)))
        return 1
    worst = (0.0, None)
    first = abs(ref[min(ref)])
    print("step  loss_ref      loss_got      diff (/ %s)" % ("step's loss" if a.per_step else "first loss"))
    for s in sorted(ref):
        d = abs(got[s] - ref[s]) / (abs(ref[s]) if a.per_step else first)
        if worst[1] is None or d > worst[0]:
            worst = (d, s)
        print("%4d  %.6f  %.6f  %.2e%s" % (s, ref[s], got[s], d, "" if d <= a.tol else "  > tol"))
    ok = worst[0] <= a.tol
    print("compare_curves: worst step %s rel diff %.3e %s %.1e: %s" % (worst[1], worst[0], "<=" if ok else ">", a.tol,
                                                                     "ok" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
