"""kda_fla_profile.py — FLA's chunk_kda per kernel, for the tables beside ours (docs/bench-log/, the KDA kernel
entries): for each case of a `ringscan bench kda` request (kda_fla.py's inputs and call), torch.profiler over `runs`
forward-only runs, then over `runs` forward+backward runs: every GPU kernel's calls per run, ms per call and ms per
run, in the order of first launch. Information only; nothing is asserted. No warm-up subprocesses: carry a Triton
cache (tests/cuda/gpu_env.sh's TRITON_CACHE_TAR) or expect minutes of autotuning per shape.
Standalone, on the GPU machine:
  PYTHONPATH=.dev/peer python3 bench/peer/kda_fla_profile.py --request OUT/request_kda.json
(`ringscan bench kda ... --write-requests --out OUT` writes the request without a GPU).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gdn_fla_profile  # noqa: E402
import kda_fla  # noqa: E402
import peer_common as pc  # noqa: E402


def profile(torch, what, body, runs):
    body()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            body()
        torch.cuda.synchronize()
    print(f"  {what}, over {runs} runs (profiler):", flush=True)
    gdn_fla_profile.print_kernel_rows(gdn_fla_profile.kernel_table(prof, runs))


def profile_case(torch, F, fn, c, gen, runs):
    T, H, K, V, cu = c["T"], c["H"], c["K"], c["V"], c["cu_seqlens"]
    ins, dout = kda_fla.make_inputs(torch, F, T, H, K, V, gen)
    kw = {}
    if len(cu) > 2:
        kw = dict(cu_seqlens=torch.tensor(cu, dtype=torch.long, device="cuda"),
                  cu_seqlens_cpu=torch.tensor(cu, dtype=torch.long))

    def fwd():
        o, _ = fn(*ins, scale=K ** -0.5, output_final_state=False, use_qk_l2norm_in_kernel=False,
                  use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, safe_gate=False, disable_recompute=False,
                  state_v_first=kda_fla.state_v_first(), **kw)
        return o

    def fwd_only():
        with torch.no_grad():
            fwd()

    def fwd_bwd():
        for t in ins:
            t.grad = None
        fwd().backward(dout)

    print(f"case {c['name']}:", flush=True)
    profile(torch, "forward (no_grad)", fwd_only, runs)
    profile(torch, "forward + backward", fwd_bwd, runs)
    del ins, dout


def main():
    a = gdn_fla_profile.parse_args(__doc__.splitlines()[0])
    req = pc.load_request(a.request, "kda")
    kda_fla.check_cases(req, a.request)
    torch, F = kda_fla.import_torch()
    fn, notes, ver = kda_fla.import_fla()
    print(f"fla {ver}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}; " + "; ".join(notes), flush=True)
    gen = torch.Generator(device="cuda").manual_seed(req["seed"])
    for c in req["cases"]:
        profile_case(torch, F, fn, c, gen, a.runs)
    print(kda_fla.fla_backends_used(), flush=True)


if __name__ == "__main__":
    main()
