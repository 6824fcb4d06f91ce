#!/usr/bin/python3
"""compare.py — compares the C trainer's gradients with the PyTorch reference:

    /usr/bin/python3 tests/parity/compare.py REF GRADS [--tol 1e-4] [--loss-tol 1e-5]

REF is a case's ref.safetensors (make_case.py), GRADS the C side's
grads.safetensors (format in tests/parity/README.md): "loss" and the gradient
of every internal parameter, same names and shapes, F32 or F64.

Per tensor it computes the relative L2 error ||got - ref|| / ||ref|| (the
absolute error when ||ref|| == 0) and prints a table worst-first; the loss is
compared by |got - ref| / |ref|. It passes (exit 0) when every tensor is
within --tol, the loss within --loss-tol, and the two files hold the same
names with the same shapes; otherwise it exits 1 and says why.

Used by the C parity test and tests/test_reference.py (compare()).
"""
import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402


def rel_error(got, ref):
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    diff = float(np.linalg.norm((got - ref).ravel()))
    norm = float(np.linalg.norm(ref.ravel()))
    if not np.all(np.isfinite(got)):
        return math.inf
    return diff / norm if norm > 0 else diff


def compare(ref, got, tol=1e-4, loss_tol=1e-5):
    """ref, got: dicts name -> array. Returns (ok, rows, problems): rows are
    (name, shape, rel_err, bound, ref_norm, max_abs_diff) sorted worst-first
    (by rel_err / bound); problems are missing/extra/shape messages."""
    problems = []
    for name in ref:
        if name not in got:
            problems.append(f"missing in grads: {name}")
    for name in got:
        if name not in ref:
            problems.append(f"not in the reference: {name}")
    rows = []
    for name, r in ref.items():
        if name not in got:
            continue
        g = got[name]
        if name == "loss":
            if np.size(g) != 1:
                problems.append(f"loss: expected one value, got shape {list(np.shape(g))}")
                continue
            r, g = np.reshape(r, ()), np.reshape(g, ())
        elif tuple(np.shape(g)) != tuple(np.shape(r)):
            problems.append(f"{name}: shape {list(np.shape(g))}, reference {list(np.shape(r))}")
            continue
        bound = loss_tol if name == "loss" else tol
        diff = np.asarray(g, np.float64) - np.asarray(r, np.float64)
        rows.append((name, tuple(np.shape(r)), rel_error(g, r), bound,
                     float(np.linalg.norm(np.ravel(r))), float(np.max(np.abs(diff))) if diff.size else 0.0))
    rows.sort(key=lambda x: -x[2] / x[3] if not math.isnan(x[2]) else -math.inf)
    ok = not problems and all(row[2] <= row[3] for row in rows)
    return ok, rows, problems


def format_table(rows):
    lines = [f"{'tensor':<52} {'shape':<14} {'rel err':>10} {'bound':>8} {'|ref|':>10} {'max|diff|':>10}  "]
    for name, shape, err, bound, norm, mad in rows:
        flag = "ok" if err <= bound else "FAIL"
        lines.append(f"{name:<52} {'x'.join(map(str, shape)) or 'scalar':<14} {err:>10.3e} {bound:>8.1e} "
                     f"{norm:>10.3e} {mad:>10.3e}  {flag}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ref")
    ap.add_argument("grads")
    ap.add_argument("--tol", type=float, default=1e-4, help="relative L2 bound per tensor (default 1e-4)")
    ap.add_argument("--loss-tol", type=float, default=1e-5, help="relative bound on the loss (default 1e-5)")
    ap.add_argument("--top", type=int, default=0, help="print only the N worst rows (default all)")
    a = ap.parse_args(argv)
    try:
        ref = safetensors_io.load(a.ref)
        got = safetensors_io.load(a.grads)
    except (OSError, safetensors_io.SafetensorsError) as e:
        print(f"compare: {e}", file=sys.stderr)
        return 1
    ok, rows, problems = compare(ref, got, a.tol, a.loss_tol)
    print(format_table(rows[:a.top] if a.top else rows))
    for p in problems:
        print(f"compare: {p}")
    n_bad = sum(r[2] > r[3] for r in rows)
    worst = rows[0] if rows else None
    print(f"compare: {'PASS' if ok else 'FAIL'}: {len(rows)} compared, {n_bad} over the bound, "
          f"{len(problems)} name/shape problems" + (f"; worst {worst[0]} {worst[2]:.3e}" if worst else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
