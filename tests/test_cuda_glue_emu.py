"""test_cuda_glue_emu.py — the cuda glue kernels without a GPU: the conv + SiLU run kernels and the fused GDN conv +
split (kernels/cuda/cuda_conv.cu, cuda_gdn_conv_split.cu, their shared cuda_conv_run.cuh),
RMSNorm (cuda_rmsnorm.cu), the gated RMSNorm group kernels (cuda_norm.cu), the sigmoid gate and SwiGLU
(cuda_elementwise.cu) and the stage-2 column reduction (cuda_device.cuh), their device code run by a host emulation
of CUDA (tests/cuda/glue_emu/: one fiber per CUDA thread, block barriers, warp shuffles through per-warp slots)
against the cpu oracle with the GPU tests' bounds, with the entries' launch shapes. This proves the kernels' indexing,
vector tails, document masks, multi-block reductions and synchronisation in CI; the GPU run (`build/test_cuda
cuda_conv1d_silu cuda_gdn_conv_split cuda_rmsnorm cuda_gated_rmsnorm cuda_sigmoid_gate cuda_swiglu`) proves the rest (the device's
arithmetic and intrinsics, real concurrency, the host code of the entries).

Each comparison can fail: a kernel that disagrees with the oracle, writes outside its block or past the halo rows
prints FAIL and exits 1. The fused GDN conv + split's FULL groups (8-byte rows, every tap inside the document) must
also give the general path's bits on the same rows.
"""
import shutil

import pytest

from conftest import BUILD, ROOT, run

CASES = {"emu_conv": "glue_emu conv: ok", "emu_norm": "glue_emu norm: ok", "emu_ew": "glue_emu ew: ok"}


@pytest.fixture(scope="module")
def glue_emu(tmp_path_factory):
    if not shutil.which("g++"):
        pytest.skip("g++ is needed for the host emulation")
    for o in ["lib/core/error.o", "kernels/cpu/cpu_conv.o", "kernels/cpu/cpu_norm.o", "kernels/cpu/cpu_memory.o",
              "kernels/cpu/cpu_elementwise.o"]:
        assert (BUILD / o).exists(), f"build/{o} is missing: build build/test_ops first"
    out = tmp_path_factory.mktemp("glue_emu")
    r = run(["bash", ROOT / "tests/cuda/glue_emu/build.sh", out, BUILD], timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


@pytest.mark.parametrize("binary", sorted(CASES))
def test_cuda_glue_kernels_emulated(glue_emu, binary):
    r = run([glue_emu / binary], timeout=900)
    assert r.returncode == 0 and "FAIL" not in r.stdout, r.stdout + r.stderr
    assert CASES[binary] in r.stdout, r.stdout
