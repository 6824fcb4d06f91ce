"""test_ops.py — runs every per-op case of build/test_ops (tests/unit) as its own
pytest test. The cases compare each cpu kernel's forward against a float64
naive reference and its backward against float64 finite differences, with the
bound printed on every line of their output."""
import subprocess

import pytest

from conftest import BUILD, run


def cases():
    exe = BUILD / "test_ops"
    if not exe.exists():
        return ["<build/test_ops missing: run make>"]
    out = subprocess.run([str(exe), "--list"], capture_output=True, text=True, check=True).stdout
    return out.split()


@pytest.mark.parametrize("case", cases())
def test_op(case):
    r = run([BUILD / "test_ops", case], timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
