"""test_cuda_gdn_emu.py — the cuda Gated DeltaNet kernels (kernels/cuda/gdn/) without a GPU: the cases of
tests/cuda/test_cuda_gdn.cu built against the host emulation of the CUDA they use (tests/cuda/gdn_emu/oracle_build.sh:
the KDA emulation of tests/cuda/kda_emu, one fiber per CUDA thread, plus tests/cuda/gdn_emu/inc), checked against the
cpu oracle with the GPU test's bounds. Covered: index, prep, the output and dv_local kernels, the mma.sync state passes
(forward, backward, transition columns, segments, document segments, the dual launch, 16 / 32 / 64 columns, 2 / 3
stages), dqkwg, wy_bwd (reading the kept Tinv and solving), the GVA group reduce and state_affine; the forward and the
whole backward against the oracle under every configuration of the GPU test's list, the kept buffer's kinds bitwise the
recompute (and a sabotaged one shown to differ), documents, GVA, dims 64 and 128 (mixed in the edges case, 64 with GVA
and five documents in docs_gva_64, both 128 in _128, transition and dstate), the transition and dstate entries, and
cuda_gdn_check_can_fail (a missed document reset must show). The state passes run ldmatrix and mma.sync lane by lane in
the PTX fragment layout (tests/cuda/gdn_emu/inc/cuda_ptx.h), checked against a plain GEMM for every variant the kernels
use (test_emulated_ptx).

Not here: the wgmma / TMA passes (Hopper only: the emulation holds their switches off,
tests/cuda/gdn_emu/gdn_emu_rt.cpp, so a configuration asking for them runs its mma.sync form), and the cases too long
for the emulation (staged, pieces, prep_kept, the T = 1000 and 4000 parity cases, determinism, long):
the GPU run (`build/test_cuda cuda_gdn`) has those, and the device's arithmetic, concurrency and shared-memory limits.

The cases run two at a time in the background once the build is done (the module fixture); each test waits for its own.
"""
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import BUILD, ROOT, run

# the longest first (the two workers: _128, ~80 s of a core, on one; edges, docs_gva_64 and the rest on the other)
CASES = ["cuda_gdn_forward_backward_128", "cuda_gdn_forward_backward_edges", "cuda_gdn_forward_backward_docs_gva_64",
         "cuda_gdn_dstate", "cuda_gdn_transition", "cuda_gdn_check_can_fail", "cuda_gdn_state_affine",
         "cuda_gdn_mma_layouts"]
CFGS = 32  # test_cuda_gdn.cu's gdn_cfgs
CP_CFGS = 7  # its gdn_cp_cfgs


@pytest.fixture(scope="module")
def gdn_emu(tmp_path_factory, request):
    if not shutil.which("g++"):
        pytest.skip("g++ is needed for the host emulation")
    for o in ["tests/unit/test_main.o", "lib/core/error.o", "kernels/cpu/cpu_gdn.o", "kernels/cpu/cpu_elementwise.o"]:
        assert (BUILD / o).exists(), f"build/{o} is missing: build build/test_ops first"
    out = tmp_path_factory.mktemp("gdn_emu")
    r = run(["bash", ROOT / "tests/cuda/gdn_emu/oracle_build.sh", out, BUILD], timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    # the selected cases only (-k), longest first
    chosen = {i.callspec.params["case"] for i in request.session.items
              if i.module is request.module and hasattr(i, "callspec") and "case" in i.callspec.params}
    pool = ThreadPoolExecutor(max_workers=2)
    jobs = {c: pool.submit(run, [out / "gdn_emu", c], None, 900) for c in CASES if c in chosen}
    yield out, jobs
    pool.shutdown(wait=True, cancel_futures=True)


def test_emulated_ptx(gdn_emu):
    out, _ = gdn_emu
    r = run([out / "mma_check"], timeout=300)
    assert r.returncode == 0 and "FAIL" not in r.stdout, r.stdout + r.stderr
    for what in ["ldmatrix x4:", "ldmatrix x4.trans:", "mma m16n8k16 (hand-packed PTX fragments)"]:
        assert r.stdout.count(what) == 1, r.stdout
    for at in (0, 1):
        for bt in (0, 1):
            assert f"gdn_warp_mma AT={at} BT={bt} (ldmatrix + mma): worst error" in r.stdout, r.stdout
            assert f"gdn_warp_mma AT={at} BT={bt}: the direct stand-in bitwise the PTX one: ok" in r.stdout, r.stdout
    for nt, kd in [(2, 64), (4, 128), (8, 64), (8, 128)]:
        assert f"gdn_warp_mma_hilo NT={nt} KD={kd} " in r.stdout, r.stdout
    assert r.stdout.count(": ok") == 15, r.stdout


@pytest.mark.parametrize("case", CASES)
def test_cuda_gdn_kernels_emulated(gdn_emu, case):
    _, jobs = gdn_emu
    r = jobs[case].result()
    out = r.stdout
    assert r.returncode == 0 and "FAIL" not in out, out[-20000:] + r.stderr
    assert f"== {case}: ok" in out, out[-20000:]
    if case == "cuda_gdn_check_can_fail":
        assert "check can fail: a missed reset gives o rel err" in out and "bound 1.0e-02: ok" in out, out
    elif case == "cuda_gdn_forward_backward_edges":
        # 5 problems (dk / dv 64 and 128 mixed; T 65, 5, 1, 150, 192; documents at a chunk start, of one token, at
        # token 0 and mid-chunk; GVA; S0 / S_final / dS0 off) under each configuration, the wgmma ones as mma.sync
        assert "the emulation runs the mma.sync passes instead" in out, out[:4000]
        for what in ["o", "dq", "dk", "dv", "dg", "dbeta"]:
            assert out.count(f"] {what}: rel err") == 5 * CFGS, what
        assert out.count("] S_final: rel err") == 4 * CFGS and out.count("] dS0: rel err") == 4 * CFGS
        assert out.count("o keeping Tinv bitwise = without: ok") == 5 * CFGS
        assert out.count("bitwise = recomputed: ok") == 5 * CFGS * 4  # every kind of kept buffer
        assert out.count("differs: ok") == 5 * 3  # the sabotaged kept buffers (first configuration)
        assert "T=65 dk=64 dv=128" in out and "T=150 doc at 0" in out and "T=1 dk=128 dv=64" in out
    elif case == "cuda_gdn_forward_backward_128":
        # T = 300, dk = dv = 128 (the models' shape), nk = nv = 2, no documents, S0, both decays, each configuration
        assert "T=300 nk=nv=2 d=128 no docs S0" in out, out[:4000]
        for what in ["o", "dq", "dk", "dv", "dg", "dbeta", "S_final", "dS0"]:
            assert out.count(f"] {what}: rel err") == 2 * CFGS, what
        assert out.count("o keeping Tinv bitwise = without: ok") == 2 * CFGS
        assert out.count("bitwise = recomputed: ok") == 2 * CFGS * 4  # every kind of kept buffer
    elif case == "cuda_gdn_forward_backward_docs_gva_64":
        # T = 200, GVA (nk 1, nv 2), d = 64, five documents (one of a single token), S0, a weak and a strong decay,
        # under each configuration
        assert "T=200 nk=1 nv=2 d=64 docs 17,64,100,101,128 S0" in out, out[:4000]
        for what in ["o", "dq", "dk", "dv", "dg", "dbeta", "S_final", "dS0"]:
            assert out.count(f"] {what}: rel err") == 2 * CFGS, what
        assert out.count("o keeping Tinv bitwise = without: ok") == 2 * CFGS
    elif case == "cuda_gdn_transition":  # 6 problems under each CP configuration
        assert out.count(" H: rel err") == 6 * CP_CFGS and out.count(" M: rel err") == 3 * CP_CFGS, out
        assert out.count("M == 0 exactly: ok") == 3 * CP_CFGS, out
        assert "T=1000 d=128" in out and "T=330 GVA d=128 docs 70,200" in out
    elif case == "cuda_gdn_dstate":  # 3 problems under each CP configuration, and a document at token 0
        assert out.count("dstate vs cpu: rel err") == 3 * CP_CFGS, out
        assert out.count("dstate + M^T dS_final vs cuda backward dS0: rel err") == 3 * CP_CFGS, out
        assert out.count("dstate bitwise equal to the backward's dS0: yes") == 3 * CP_CFGS, out
        assert out.count("dstate doc at 0: == 0 exactly: ok") == CP_CFGS, out
    elif case == "cuda_gdn_state_affine":
        assert out.count("state_affine nv=") == 9 and out.count(" ok") == 10, out
    elif case == "cuda_gdn_mma_layouts":
        assert out.count("mma A") == 4 and out.count(" ok") == 5, out
