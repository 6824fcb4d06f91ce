#!/usr/bin/env python3
"""gdn_cp_model.py — the critical path of the GDN core's three CP schedules on paper.

    python3 bench/gdn_cp_model.py [--cp 2,3,4,5,6,8] [--set p=1.03,tau=0.72,...] [--heads 16|64] [--json]

Each rank's program is the order of lib/cp/cp_gdn_hybrid.c (the hybrid, C = cp chained fragments, and the
chain of every fragment, C = 2 cp - 1) and lib/cp/cp_gdn_scan.c (the scan), one in-order queue per rank (a
GPU's compute stream); a hand-off arrives `lam` after its sender's pass ends, an all-gather `gather` after the
last rank posts it. Times are per fragment of T / 2cp tokens and sample, in ms, for the run at cp 4 (fragments
of 16k tokens at 128k); at another cp every pass scales by 4 / cp (the passes are linear in the fragment's
length), the hand-off and the all-gather do not. docs/design/gdn-cp.md, "Choosing a schedule", explains the
phases and where the default figures come from (the phases `ringscan bench cp` measured at cp 2 and cp 4); give
measured ones with --set to re-derive the choice (lib/cp/cp_gdn.c cp_gdn_method).

  forward   p prep (WY factors, gate cumsums), tau state pass alone (chunk states kept), om outputs from
            them, mu the [M | H] transition pass, eps one dk x dk by dk x dv product per head (a fold step)
  backward  d dout stage, s state-gradient stage, g gradients stage, k dL pass (gdn_chunk_dstate)
  comm      lam one hand-off (an exchange of one state per sample), gather the all-gather

Prints per cp the ideal (one rank's own work, W = 2 (p + tau + om) forward, 2 (d + s + g) backward) and each
schedule's makespan, forward / backward / sum, and the efficiency of the core (ideal / makespan).
"""
import argparse
import json
import sys

# per 16k-token fragment at cp 4 (K = V = 128): 64 heads from bench cp's phases (docs/bench-log v0.10, v0.12);
# 16 heads: the state passes barely shorter (latency-bound), the rest about a quarter, mu and k estimated
FIGURES = {
    64: dict(p=1.03, tau=0.72, om=0.70, mu=1.47, eps=0.01, d=0.40, s=1.25, g=3.50, k=1.65, lam=0.03, gather=0.20),
    16: dict(p=0.60, tau=0.62, om=0.40, mu=0.78, eps=0.005, d=0.10, s=1.19, g=1.07, k=1.30, lam=0.03, gather=0.10),
}


def makespan(progs):
    """progs: per rank a list of (name, ms, waits, posts); a message is an id, 'AG' the all-gather (arrives when
    every rank posted it). Returns the time the last rank finishes (None: a rank waits forever)."""
    P = len(progs)
    t, pc, arrive, ag = [0.0] * P, [0] * P, {}, []
    need = sum(1 for ops in progs for op in ops if "AG" in op[3])
    moved = True
    while moved:
        moved = False
        for r in range(P):
            while pc[r] < len(progs[r]):
                _, ms, waits, posts = progs[r][pc[r]]
                if not all(w in arrive for w in waits):
                    break
                t[r] = max([t[r]] + [arrive[w] for w in waits]) + ms
                for m in posts:
                    if m == "AG":
                        ag.append(t[r])
                        if len(ag) == need:
                            arrive["AG"] = max(ag) + F["gather"]
                    else:
                        arrive[m] = t[r] + F["lam"]
                pc[r] += 1
                moved = True
    return None if any(pc[r] < len(progs[r]) for r in range(P)) else max(t)


def hybrid_fwd(P, C):
    progs = []
    gather = C <= 2 * P - 2
    for r in range(P):
        A, B = r, 2 * P - 1 - r
        trans = C <= B <= 2 * P - 2
        early = trans and 2 * r >= P
        ops = []
        up = [f"E{A + 1}"] if r < P - 1 else []  # A's exit up the ranks (rank P-1: its own B)
        if r == 0:
            ops += [("passA", F["p"] + F["tau"], [], up), ("outA", F["om"], [], []), ("prepB", F["p"], [], [])]
        else:
            ops += [("prepA", F["p"], [], []), ("prepB", F["p"], [], [])]
            ops += [("transB", F["mu"], [], [])] if early else []
            ops += [("passA", F["tau"], [f"E{A}"], up)]
        ops += [("transB", F["mu"], [], [])] if trans and not early else []
        wB = [f"E{B}"] if B <= C and r < P - 1 else []
        if B < C:
            ops += [("passB", F["tau"], wB, [f"E{B + 1}"])]
        elif B == C and gather:
            ops += [("exitC", F["eps"], wB, [])]
        ops += [("post", 0, [], ["AG"])] if gather else []
        ops += [("outA", F["om"], [], [])] if r > 0 else []
        if B < C:
            ops += [("outB", F["om"], [], [])]
        else:
            fold = [("fold", F["eps"] * (B - C - 1), ["AG"], [])] if B > C else []
            ops += fold + [("runB", F["tau"] + F["om"], wB if B == C and not gather else [], [])]
        progs.append(ops)
    return progs


def hybrid_bwd(P, C):
    progs = []
    gather = C <= 2 * P - 2
    for r in range(P):
        A, B = r, 2 * P - 1 - r
        folded = gather and B >= C
        early = 2 * r < P
        ops = []
        if folded:
            ops += [("dLB", F["k"], [], [])]
        else:
            ops += [("doutB", F["d"], [], [])]
        ops += [("post", 0, [], ["AG"])] if gather else []
        ops += [("doutA", F["d"], [], [])] if r > 0 else []
        up = [f"D{B}"] if r < P - 1 else []
        if not folded:
            w = [f"D{B + 1}"] if B < 2 * P - 1 else []
            ops += [("stateB", F["s"], w, up)]
            ops += [("gradsB", F["g"], [], [])] if early else []
        else:
            ops += [("wholeB", F["d"] + F["s"] + F["g"] + F["eps"] * max(0, 2 * P - 2 - B), ["AG"], [])] if early else []
        wA = [f"D{A + 1}"] if r < P - 1 else (["AG"] if gather else [])
        down = [f"D{A}"] if r > 0 else []
        ops += [("stateA", F["s"] + (0 if r > 0 else F["d"]) + (F["eps"] * (P - 1) if r == P - 1 else 0), wA, down)]
        ops += [("gradsA", F["g"], [], [])]
        if not early:
            ops += [("gradsB", F["g"], [], [])] if not folded else [("wholeB", F["d"] + F["s"] + F["g"], ["AG"], [])]
        progs.append(ops)
    return progs


def scan(P, back):
    if back:
        per = [("dL", 2 * (F["d"] + F["k"]), [], ["AG"]), ("fold", 2 * P * F["eps"], ["AG"], []),
               ("run", 2 * (F["d"] + F["s"] + F["g"]), [], [])]
    else:
        per = [("trans", 2 * (F["p"] + F["mu"]), [], ["AG"]), ("fold", (2 * P - 1) * F["eps"], ["AG"], []),
               ("run", 2 * (F["tau"] + F["om"]), [], [])]
    return [list(per) for _ in range(P)]


def model(P):
    """{schedule: (forward, backward)} at cp P, and the ideal"""
    out = {"scan": (makespan(scan(P, 0)), makespan(scan(P, 1)))}
    for name, C in (("hybrid", P), ("chain", 2 * P - 1)):
        out[name] = (makespan(hybrid_fwd(P, C)), makespan(hybrid_bwd(P, C)))
    ideal = (2 * (F["p"] + F["tau"] + F["om"]), 2 * (F["d"] + F["s"] + F["g"]))
    return out, ideal


def main():
    global F
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cp", default="2,3,4,5,6,8")
    ap.add_argument("--heads", type=int, default=64, choices=sorted(FIGURES))
    ap.add_argument("--set", default="", help="phase times at cp 4, e.g. p=1.0,tau=0.7")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    base = dict(FIGURES[a.heads])
    for kv in filter(None, a.set.split(",")):
        k, v = kv.split("=")
        if k not in base:
            sys.exit(f"--set: unknown phase '{k}' (known: {', '.join(base)})")
        base[k] = float(v)
    rows = {}
    for P in (int(x) for x in a.cp.split(",")):
        F = {k: v * (4 / P if k not in ("lam", "gather", "eps") else 1) for k, v in base.items()}
        sched, ideal = model(P)
        rows[P] = {"ideal": ideal, **sched}
    if a.json:
        print(json.dumps(rows))
        return
    print(f"GDN core per rank, ms (phases at cp 4: {', '.join(f'{k} {v:g}' for k, v in base.items())})")
    print("cp | ideal fwd / bwd | scan | hybrid | chain | best")
    for P, row in rows.items():
        cells = []
        for name in ("scan", "hybrid", "chain"):
            f, b = row[name]
            cells.append(f"{f:.2f} / {b:.2f} = {f + b:.2f} ({100 * sum(row['ideal']) / (f + b):.0f}%)")
        best = min(("scan", "hybrid", "chain"), key=lambda n: sum(row[n]))
        print(f"{P} | {row['ideal'][0]:.2f} / {row['ideal'][1]:.2f} | " + " | ".join(cells) + f" | {best}")


F = FIGURES[64]
if __name__ == "__main__":
    main()
