"""conftest.py — shared fixtures for the ringscan test suite, and the final
summary line `N passed, N failed` that CI and the README rely on.

Tests run the real binary (build/ringscan, built by `make test`) on real files
under pytest's tmp_path; nothing is mocked. `run()` returns the completed
process with stdout/stderr as text.
"""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
RINGSCAN = BUILD / "ringscan"


def run(args, cwd=None, timeout=600, env=None, input=None):
    """Runs a command (list of str) and returns the CompletedProcess."""
    full_env = dict(os.environ)
    full_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    full_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if env:
        full_env.update(env)
    return subprocess.run([str(a) for a in args], cwd=cwd or ROOT, capture_output=True, text=True,
                          timeout=timeout, env=full_env, input=input)


@pytest.fixture(scope="session")
def ringscan():
    if not RINGSCAN.exists():
        pytest.fail(f"{RINGSCAN} is missing: run `make` (or `make test`, which builds it first)")
    return RINGSCAN


@pytest.fixture(scope="session")
def recall_tok(tmp_path_factory, ringscan):
    """The synthetic recall data most training tests use (300k tokens, seed 7), made once per session."""
    d = tmp_path_factory.mktemp("recall")
    r = run([ringscan, "data", "synth", d / "recall.tok", "--tokens", "300000", "--seed", "7"])
    assert r.returncode == 0, r.stderr
    return d / "recall.tok"


def pytest_unconfigure(config):
    """Runs after pytest's own summary, so this is the last line printed."""
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is None:
        return
    passed = len(tr.stats.get("passed", []))
    failed = len(tr.stats.get("failed", [])) + len(tr.stats.get("error", []))
    tr.write_line(f"{passed} passed, {failed} failed")
