"""relerr.py — the relative error every parity script of tests/ reports: ||got - ref|| / ||ref|| over all elements,
in float64; inf when got holds a non-finite value; the absolute norm when ref is all zeros.

Callers: tests/cuda/compare_bf16.py, tests/parity/kda_check.py, tests/parity/kda_fla_check.py.
"""
import numpy as np


def rel(got, ref):
    got, ref = np.asarray(got, np.float64).ravel(), np.asarray(ref, np.float64).ravel()
    if not np.all(np.isfinite(got)):
        return float("inf")
    n = float(np.linalg.norm(ref))
    d = float(np.linalg.norm(got - ref))
    return d / n if n > 0 else d
