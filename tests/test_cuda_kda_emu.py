"""test_cuda_kda_emu.py — the cuda KDA kernels (kernels/cuda/kda/) without a GPU: tests/cuda/test_cuda_kda.cu's cases
built against a host emulation of the CUDA they use (tests/cuda/kda_emu/: one fiber per CUDA thread, of
tests/cuda/emu_fiber.h; block barriers; warp shuffles through per-warp slots), checked against the cpu oracle with the
GPU test's bounds. This proves the kernels' indexing, chunk bookkeeping, synchronisation structure and algebra in CI;
the GPU run (`build/test_cuda cuda_kda`) proves the rest (the device's arithmetic, real concurrency, shared-memory
limits).
The tensor-core pieces (gdn_warp_mma of kernels/cuda/cuda_gdn_mma.h) run as tests/cuda/kda_emu/inc/cuda_gdn_mma.h,
checked against a plain GEMM for the four transpose combinations (test_emulated_warp_mma).

Each case can fail: the comparison against the oracle, the bitwise equality of every kept / staged / prep path with
the plain call, and cuda_kda_check_can_fail (a missed document start must show). The emulation runs blocks one at a
time on one core, so the cases here are the small ones (the GPU run has the rest: GVA over every layout, T = 4133, ...).
"""
import shutil

import pytest

from conftest import BUILD, ROOT, run

CASES = ["cuda_kda_forward_backward_d64", "cuda_kda_forward_backward_mha_no_states", "cuda_kda_gates",
         "cuda_kda_staged_edges", "cuda_kda_check_can_fail", "cuda_kda_model_calls", "cuda_kda_prep",
         "cuda_kda_transition", "cuda_kda_dstate", "cuda_kda_dg_reduction", "cuda_kda_unaligned_rows"]
# cuda_kda_determinism (every mode twice) runs on the GPU only: the emulation runs the blocks one at a time in a fixed
# order, so two runs agree by construction there


@pytest.fixture(scope="module")
def kda_emu(tmp_path_factory):
    if not shutil.which("g++"):
        pytest.skip("g++ is needed for the host emulation")
    for o in ["tests/unit/test_main.o", "lib/core/error.o", "kernels/cpu/cpu_kda.o", "kernels/cpu/cpu_gdn.o",
              "kernels/cpu/cpu_elementwise.o"]:
        assert (BUILD / o).exists(), f"build/{o} is missing: build build/test_ops first"
    out = tmp_path_factory.mktemp("kda_emu")
    r = run(["bash", ROOT / "tests/cuda/kda_emu/build.sh", out, BUILD], timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    return out / "kda_emu"


def test_emulated_warp_mma(kda_emu):
    r = run([kda_emu.parent / "mma_check"], timeout=300)
    assert r.returncode == 0 and "FAIL" not in r.stdout, r.stdout + r.stderr
    for at in (0, 1):
        for bt in (0, 1):
            assert f"mma AT={at} BT={bt}: worst error" in r.stdout and r.stdout.count(": ok") == 4, r.stdout


def test_emulation_stops_a_deadlock(kda_emu):
    # a barrier reached by part of a block stops the emulation (tests/cuda/emu_fiber.h) instead of hanging or passing
    r = run([kda_emu.parent / "mma_check", "deadlock"], timeout=60)
    assert r.returncode != 0 and "emu_fiber: deadlock: 32 of 64 threads" in r.stderr, r.stdout + r.stderr
    assert "the launch returned" not in r.stdout, r.stdout


@pytest.mark.parametrize("case", CASES + ["cuda_kda_forward_backward_d64 sms=4", "cuda_kda_forward_backward_d64 sms=2",
                                  "cuda_kda_forward_backward_mha_no_states sms=4"])
def test_cuda_kda_kernels_emulated(kda_emu, case):
    # "sms=4", "sms=2": a device of 4 or 2 SMs (the emulation's KDA_EMU_SMS), so the d = 64 state passes take 32 or 64
    # columns per block and the d = 128 ones (nv = 2) 64 (16 with the default 16 SMs; kda.cu's kda_state_bv): the
    # GPU's test_cuda cases, with nv <= 4 on 132 SMs, run 16 only
    case, _, sms = case.partition(" sms=")
    env = {"KDA_EMU_SMS": sms} if sms else None
    r = run([kda_emu, case], timeout=900, env=env)
    assert r.returncode == 0 and "FAIL" not in r.stdout, r.stdout + r.stderr
    assert f"== {case}: ok" in r.stdout, r.stdout
    if case == "cuda_kda_check_can_fail":
        assert "a missed document start: o rel err" in r.stdout, r.stdout
    elif case == "cuda_kda_dg_reduction":  # model_check's A_log: sum_t sum_c dg g per head, d = 64 and 128
        for d in (64, 128):
            assert f"d={d}: dA_log-like reduction rel err" in r.stdout and f"nv=2 d={d}: dg: rel err" in r.stdout, \
                r.stdout
        assert r.stdout.count("(must exceed the bound)") == 2, r.stdout
    else:
        assert r.stdout.count(" ok") >= 5, r.stdout
    if case == "cuda_kda_prep":  # Tinv: prep's sub-chunk products (tensor cores) and the diagonal blocks
        assert r.stdout.count(": Tinv : rel err") == 5, r.stdout
    if case == "cuda_kda_dstate":  # dS0 alone (no kept, the prep's kept, the backward's) on the five layouts
        assert r.stdout.count(": dS0: rel err") == 5, r.stdout
    if case == "cuda_kda_determinism":  # every mode twice, the same bits
        assert "determinism (" in r.stdout and "FAIL" not in r.stdout, r.stdout
    if case == "cuda_kda_unaligned_rows":  # plain loads for rows not 16-byte aligned: the aligned layout's bits
        assert r.stdout.count("unaligned rows = aligned rows:") == 16 and "(unaligned): dq" in r.stdout, r.stdout
    if case == "cuda_kda_transition":  # M, H: the forward state pass's identity columns
        assert r.stdout.count(": M: rel err") == 5 and r.stdout.count(": H: rel err") == 5, r.stdout
