"""gdn_fla_profile.py — FLA's chunk_gated_delta_rule per kernel, for the tables beside ours
(docs/bench-log/, the GDN kernel entries): for each case of a `ringscan bench gdn` request (the same inputs and
documents as gdn_fla.py), the fwd and fwd+bwd medians by CUDA events (peer_common's rule), then
torch.profiler over `reps` more fwd+bwd runs: every GPU kernel's calls per run, ms per call and ms
per run, in the order of first launch. Information only; nothing is asserted.

FLA's #640 guard is lifted in memory for timing only, as in gdn_fla.py (the gradients of such a
run are not trusted). Standalone, on the GPU machine:
  PYTHONPATH=.dev/peer python3 bench/peer/gdn_fla_profile.py --request OUT/request_gdn.json
(`ringscan bench gdn ... --write-requests --out OUT` writes the request without a GPU).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gdn_fla  # noqa: E402
import peer_common as pc  # noqa: E402


def kernel_table(prof, runs):
    """[(name, calls per run, ms per call, ms per run)] of the GPU kernels, in the order of first launch."""
    order, acc = [], {}
    for e in prof.events():
        if "CUDA" not in str(getattr(e, "device_type", "")):
            continue
        us = getattr(e, "device_time", None)
        if us is None:
            us = getattr(e, "cuda_time", 0.0)
        if e.name not in acc:
            order.append(e.name)
            acc[e.name] = [0, 0.0]
        acc[e.name][0] += 1
        acc[e.name][1] += us
    return [(n, acc[n][0] / runs, acc[n][1] / 1e3 / acc[n][0], acc[n][1] / 1e3 / runs) for n in order]


def profile_case(fn, c, gen, req, runs):
    T, H, K, V, cu = c["T"], c["H"], c["K"], c["V"], c["cu_seqlens"]
    ms_f, ms_fb, n = gdn_fla.run(fn, T, H, K, V, cu, gen, req)
    ins, dout = gdn_fla.make_inputs(T, H, K, V, gen)
    kw = {}
    if len(cu) > 2:
        kw = dict(cu_seqlens=torch.tensor(cu, dtype=torch.long, device="cuda"),
                  cu_seqlens_cpu=torch.tensor(cu, dtype=torch.long))

    def step():
        for t in ins:
            t.grad = None
        o, _ = fn(*ins, scale=K ** -0.5, output_final_state=False, **kw)
        o.backward(dout)

    step()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(runs):
            step()
        torch.cuda.synchronize()
    print(f"case {c['name']}: FLA fwd {ms_f:.3f} ms, fwd+bwd {ms_fb:.3f} ms (events, median of {n}); "
          f"kernels over {runs} fwd+bwd runs (profiler):", flush=True)
    print_kernel_rows(kernel_table(prof, runs))
    del ins, dout


def print_kernel_rows(rows):
    """kernel_table's rows, one a line, and their sum."""
    tot = 0.0
    for name, calls, per_call, per_run in rows:
        tot += per_run
        print(f"  {per_run:8.3f} ms/run {calls:4.1f} calls {per_call:8.3f} ms/call  {name[:110]}", flush=True)
    print(f"  {tot:8.3f} ms/run in all kernels", flush=True)


def parse_args(description):
    """--request (a bench request file) and --runs (profiled runs per case), for this script and kda_fla_profile.py."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--request", required=True)
    ap.add_argument("--runs", type=int, default=5)
    return ap.parse_args()


def main():
    a = parse_args(__doc__.splitlines()[0])
    req = pc.load_request(a.request, "gdn")
    fn, notes, ver = gdn_fla.import_fla()
    print(f"fla {ver}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}; " + "; ".join(notes), flush=True)
    gen = torch.Generator(device="cuda").manual_seed(req["seed"])
    for c in req["cases"]:
        profile_case(fn, c, gen, req, a.runs)


if __name__ == "__main__":
    main()
