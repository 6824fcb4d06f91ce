"""peer_common.py — what the peer scripts of bench/peer share: reading the request and writing the
result of the JSON contract (bench/peer/README.md), CUDA-event timing with the same rule as
`ringscan bench` (warm-up runs, then timed runs, the median; stop repeating once the timed runs
took max_s seconds and at least 3 were done), the description of the device and software, and the
lifting of FLA's #640 guard for timing (gdn_fla.py, step_hf.py, cp_gdn_fla.py), and for the CP
peers the process group under torchrun and the timing across ranks.

Called by attn_sdpa.py, gdn_fla.py and step_hf.py (which `ringscan bench --peer` runs as
`python3 SCRIPT --request REQ.json --out RESULT.json`) and by cp_attn_torch.py and cp_gdn_fla.py
(which `ringscan bench cp --peer` runs under `python3 -m torch.distributed.run --nproc_per_node P`).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REQUEST_SCHEMA = "ringscan-bench-request/1"
RESULT_SCHEMA = "ringscan-bench-result/1"


def usage_exit(msg):
    print(f"{os.path.basename(sys.argv[0])}: {msg}", file=sys.stderr)
    sys.exit(2)


def parse_args(description):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--request", required=True, help="request file written by `ringscan bench --peer`")
    ap.add_argument("--out", required=True, help="where the result JSON goes")
    return ap.parse_args()


def load_request(path, kind):
    try:
        with open(path) as f:
            req = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        usage_exit(f"--request {path}: {e}")
    if req.get("schema") != REQUEST_SCHEMA:
        usage_exit(f"--request {path}: key 'schema' is {req.get('schema')!r}, expected {REQUEST_SCHEMA!r}")
    if req.get("kind") != kind:
        usage_exit(f"--request {path}: key 'kind' is {req.get('kind')!r}, this script runs {kind!r}")
    for key, typ in (("warmup", int), ("reps", int), ("max_s", (int, float)), ("seed", int), ("cases", list)):
        if not isinstance(req.get(key), typ):
            usage_exit(f"--request {path}: key {key!r} missing or of the wrong type")
    return req


def device_and_software(torch, extra=None):
    sw = {"python": sys.version.split()[0], "torch": torch.__version__}
    try:
        import triton
        sw["triton"] = triton.__version__
    except ImportError:
        pass
    if extra:
        sw.update(extra)
    return torch.cuda.get_device_name(0), sw


def time_fwd_bwd(torch, fwd, bwd, req, before=None, dist=None, slowest=True):
    """fwd() -> state; bwd(state). Events around each: (ms_fwd median, ms_fwdbwd median, runs).
    With dist (torch.distributed, the CP peers): every rank syncs and meets the others at a barrier
    before each run, and a run's times are the slowest rank's (slowest) or rank 0's, the same on every
    rank, so every rank applies the stop rule to the same numbers (as `ringscan bench cp` does)."""
    e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    f, fb, spent = [], [], 0.0
    for i in range(req["warmup"] + req["reps"]):
        if before:
            before()
        if dist:
            torch.cuda.synchronize()
            dist.barrier()
        e0.record()
        st = fwd()
        e1.record()
        bwd(st)
        e2.record()
        e2.synchronize()
        del st
        t = [e0.elapsed_time(e1), e0.elapsed_time(e2)]
        if dist:
            tt = torch.tensor(t, dtype=torch.float64, device="cuda")
            if slowest:
                dist.all_reduce(tt, op=dist.ReduceOp.MAX)
            else:
                dist.broadcast(tt, src=0)
            t = tt.tolist()
        if i < req["warmup"]:
            continue
        f.append(t[0])
        fb.append(t[1])
        spent += fb[-1] / 1e3
        if len(fb) >= 3 and spent > req["max_s"]:
            break
    return statistics.median(f), statistics.median(fb), len(fb)


def case_cu_seqlens(c, path):
    """A case's document boundaries ([0, T], one document, when it has none), else exit 2 naming the file,
    the case and the key."""
    cu = c.get("cu_seqlens", [0, c["T"]])
    if (not isinstance(cu, list) or len(cu) < 2 or not all(isinstance(x, int) for x in cu) or cu[0] != 0
            or cu[-1] != c["T"] or any(a >= b for a, b in zip(cu, cu[1:]))):
        usage_exit(f"--request {path}: case {c['name']!r}: key 'cu_seqlens' is not [0, ..., T] increasing")
    return cu


def require_case_keys(req, path, keys):
    """Every case of the request has every key, else exit 2 naming the file and the key."""
    for c in req["cases"]:
        for key in keys:
            if key not in c:
                usage_exit(f"--request {path}: a case lacks key {key!r}")


def finish_dist(dist, rank, path, kind, device, software, notes, results):
    """The CP peers' end: rank 0 writes the result, then every rank leaves the process group."""
    if rank == 0:
        write_result(path, kind, device, software, notes, results)
    dist.barrier()
    dist.destroy_process_group()


def init_dist(torch, path, req):
    """The CP peers under torchrun: NCCL process group, this rank's GPU (LOCAL_RANK); the world must be
    the request's P. Returns (dist, rank, world)."""
    import torch.distributed as dist
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        if key not in os.environ:
            usage_exit(f"{key} is not set: run under torchrun (python3 -m torch.distributed.run --nproc_per_node P)")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    if not isinstance(req.get("P"), int) or req["P"] != world:
        usage_exit(f"--request {path}: key 'P' is {req.get('P')!r}, but {world} processes run")
    return dist, rank, world


def write_result(path, kind, device, software, notes, results):
    out = {"schema": RESULT_SCHEMA, "kind": kind, "device": device, "software": software, "notes": notes,
           "results": results}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
    os.replace(tmp, path)


def short_error(e):
    s = f"{type(e).__name__}: {e}".replace("\n", " ")
    return s if len(s) < 300 else s[:297] + "..."


FLA_GUARD_NOTE = ("FLA's guard against Triton < 3.7.1 on Hopper (issue #640: the gated chunk_bwd_dqkwg gives wrong "
                  "gradients there) was lifted in memory for timing only; fwd+bwd numbers are speed, not a correct "
                  "backward")


def fla_lift_guard(notes):
    """FLA refuses its gated backward under Triton < 3.7.1 on Hopper (issue #640); for timing only, sets
    fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 in memory (no file is changed) and says so in notes."""
    import fla.ops.common.chunk_o as chunk_o
    if not getattr(chunk_o, "TRITON_ABOVE_3_7_1", True):
        chunk_o.TRITON_ABOVE_3_7_1 = True
        notes.append(FLA_GUARD_NOTE)


def warm_variants(cases, script, env_flag):
    """FLA's Triton compile per (H, K, V, varlen) variant of the cases, one `script --warm-one SPEC` subprocess each,
    all at once, with env_flag=0 so a child does not warm again; returns (seconds, variants)."""
    variants = {}
    for c in cases:
        variants.setdefault((c["H"], c["K"], c["V"], len(c["cu_seqlens"]) > 2), c)
    env = dict(os.environ, FLA_CACHE_RESULTS="0", **{env_flag: "0"})
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, script, "--warm-one", json.dumps(list(v))], env=env)
             for v in variants]
    for p in procs:
        p.wait()
    return time.time() - t0, len(procs)

