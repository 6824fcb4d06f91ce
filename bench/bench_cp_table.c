/*
 * bench_cp_table.c — the tables `ringscan bench cp` prints on rank 0 (bench_cp.h): per case our
 * rows (CP, serial, one GPU) and the peer's, with ms, TFLOP/s per GPU, CP efficiency of the same
 * family (one-GPU ms / (GPUs x ms)) and the ratio to the peer at the same GPU count; then each
 * case's detail lines (ring steps, GDN / KDA phases, exchanges alone). The rows land in `table`
 * (bench.json's) as printed.
 *
 * Callers: bench_cp.c (bench_cp_main, after the cases ran).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench_common.h"
#include "bench_cp.h"

/* the row of `rows` (ours then the peer's) for this case with this family and GPU count */
static const json_t *bc_find_gpus(const json_t *ours, const json_t *peer, const char *cname, const char *family,
                                  int gpus) {
    const json_t *lists[2] = {ours, peer ? json_object_get(peer, "results") : NULL};
    for (int l = 0; l < 2; l++) {
        size_t i;
        json_t *r;
        json_array_foreach(lists[l], i, r) {
            const char *c = json_string_value(json_object_get(r, "case"));
            const char *f = json_string_value(json_object_get(r, "family"));
            if (c && f && !strcmp(c, cname) && !strcmp(f, family) &&
                json_integer_value(json_object_get(r, "gpus")) == gpus && !json_object_get(r, "error"))
                return r;
        }
    }
    return NULL;
}

static void bc_table_row(FILE *f, const char *cname, const json_t *r, const json_t *ours, const json_t *peer,
                         const BenchWork *w, int P, json_t *table) {
    const char *impl = json_string_value(json_object_get(r, "impl"));
    if (bench_error_row(f, table, cname, impl, r, 28, 20)) return;
    const char *family = json_string_value(json_object_get(r, "family"));
    int gpus = (int)json_integer_value(json_object_get(r, "gpus"));
    double mf = bench_num(r, "ms_fwd"), mfb = bench_num(r, "ms_fwdbwd");
    double tf = w->flops_fwd / (mf * 1e9) / gpus, tfb = w->flops_fb / (mfb * 1e9) / gpus;
    double ef = NAN, efb = NAN, rf = NAN, rfb = NAN;
    const json_t *one = family && gpus > 1 ? bc_find_gpus(ours, peer, cname, family, 1) : NULL;
    if (one) {
        ef = bench_num(one, "ms_fwd") / (gpus * mf);
        efb = bench_num(one, "ms_fwdbwd") / (gpus * mfb);
    }
    const json_t *mine = bench_find(ours, cname, gpus > 1 ? "ringscan-cp" : "ringscan-1gpu");
    if (mine && family && strcmp(family, "ringscan")) {
        rf = mf / bench_num(mine, "ms_fwd");
        rfb = mfb / bench_num(mine, "ms_fwdbwd");
    }
    char s[8][32];
    bench_fmt(s[0], 32, "%.3f", mf);
    bench_fmt(s[1], 32, "%.3f", mfb);
    bench_fmt(s[2], 32, "%.1f", tf);
    bench_fmt(s[3], 32, "%.1f", tfb);
    bench_fmt(s[4], 32, "%.1f%%", 100 * ef);
    bench_fmt(s[5], 32, "%.1f%%", 100 * efb);
    bench_fmt(s[6], 32, "%.2f", rf);
    bench_fmt(s[7], 32, "%.2f", rfb);
    fprintf(f, "%-28s %-20s %4d %10s %10s %8s %8s %7s %7s %7s %7s\n", cname, impl ? impl : "?", gpus, s[0], s[1], s[2],
            s[3], s[4], s[5], s[6], s[7]);
    json_t *row = json_pack("{ss ss si sf sf sf sf}", "case", cname, "impl", impl ? impl : "?", "gpus", gpus, "ms_fwd",
                            mf, "ms_fwdbwd", mfb, "tflops_per_gpu_fwd", tf, "tflops_per_gpu_fwdbwd", tfb);
    if (one) {
        json_object_set_new(row, "cp_efficiency_fwd", json_real(ef));
        json_object_set_new(row, "cp_efficiency_fwdbwd", json_real(efb));
    }
    if (isfinite(rf)) {
        json_object_set_new(row, "ratio_fwd", json_real(rf));
        json_object_set_new(row, "ratio_fwdbwd", json_real(rfb));
    }
    json_t *note = json_object_get(r, "note");
    if (note && json_is_string(note)) json_object_set(row, "note", note);
    (void)P;
    json_array_append_new(table, row);
}

/* the lines under a case: the ring's steps and exchanges, or the GDN phases and all-gathers */
static void bc_detail(FILE *f, const char *cname, const json_t *ours, int attn) {
    const json_t *cp = bench_find(ours, cname, "ringscan-cp");
    if (!cp) return;
    if (attn) {
        const json_t *ser = bench_find(ours, cname, "ringscan-cp-serial");
        fprintf(f, "  steps, ms: compute/comm (serial run) | compute/exposed wait (overlapped):");
        size_t i;
        json_t *s;
        json_array_foreach(json_object_get(ser, "steps"), i, s) {
            const json_t *o = json_array_get(json_object_get(cp, "steps"), i);
            fprintf(f, " %s%lld %.3f/%.3f|%.3f/%.3f", json_string_value(json_object_get(s, "pass")),
                    (long long)json_integer_value(json_object_get(s, "t")), bench_num(s, "compute_ms"),
                    bench_num(s, "comm_ms"), bench_num(o, "compute_ms"), bench_num(o, "exposed_wait_ms"));
        }
        fprintf(f, "\n");
        const json_t *rt = json_object_get(cp, "routed");
        long long n[4], any = 0;
        const char *const keys[4] = {"fwd_cudnn", "bwd_cudnn", "fwd_ours", "bwd_ours"};
        for (int k = 0; k < 4; k++) any += n[k] = (long long)json_integer_value(json_object_get(rt, keys[k]));
        fprintf(f, "  calls (%s): %lld per forward on the busiest rank",
                json_string_value(json_object_get(cp, "ring_calls")),
                (long long)json_integer_value(json_object_get(cp, "fwd_calls")));
        if (any)
            fprintf(f, "; per run on rank 0 cuDNN fwd %lld bwd %lld, ours fwd %lld bwd %lld", n[0], n[1], n[2], n[3]);
        fprintf(f, "\n");
        const json_t *x = json_object_get(cp, "exchange_alone");
        if (x)
            fprintf(f, "  exchange alone: K|V %.1f MB %.3f ms (%.1f GB/s), dK|dV %.1f MB %.3f ms (%.1f GB/s)\n",
                    bench_num(x, "kv_bytes") / 1e6, bench_num(x, "kv_ms"),
                    bench_num(x, "kv_bytes") / (bench_num(x, "kv_ms") * 1e6), bench_num(x, "dkv_bytes") / 1e6,
                    bench_num(x, "dkv_ms"), bench_num(x, "dkv_bytes") / (bench_num(x, "dkv_ms") * 1e6));
        return;
    }
    const char *impls[2] = {"ringscan-cp", "ringscan-1gpu"};
    for (int k = 0; k < 2; k++) {
        const json_t *r = bench_find(ours, cname, impls[k]), *ph = json_object_get(r, "phases");
        if (!ph) continue;
        fprintf(f, "  phases %s, ms:", impls[k]);
        const char *name;
        json_t *v;
        json_object_foreach((json_t *)ph, name, v) fprintf(f, " %s %.3f", name, json_number_value(v));
        fprintf(f, "\n");
        size_t rk;
        json_t *rph;
        json_array_foreach(json_object_get(r, "phases_by_rank"), rk, rph) {
            fprintf(f, "    rank %zu:", rk);
            json_object_foreach(rph, name, v) fprintf(f, " %s %.3f", name, json_number_value(v));
            fprintf(f, "\n");
        }
    }
    const json_t *x = json_object_get(cp, "exchange_alone");
    if (x)
        fprintf(f, "  exchange alone: states (%s) %.3f MB per rank %.3f ms, halo (all-gather) %.3f MB %.3f ms\n",
                json_string_value(json_object_get(x, "state_op")), bench_num(x, "state_bytes_per_rank") / 1e6,
                bench_num(x, "state_ms"), bench_num(x, "halo_bytes_per_rank") / 1e6, bench_num(x, "halo_ms"));
}

void bench_cp_print(FILE *f, int part, const json_t *req, const json_t *ours, const json_t *peer, int P, int conv,
                    json_t *table) {
    const int attn = part == 0;
    if (attn)
        fprintf(f, "\nring attention over %d ranks: causal, one document, zigzag layout; FLOPs 4*T^2/2*hd*nh forward, "
                   "backward 2.5x\n", P);
    else if (part == 1)
        fprintf(f, "\nGated DeltaNet layer over %d ranks: conv halo + conv (width %d) + L2 norm + entry states + chunk, "
                   "one document;\n  FLOPs of the chunked delta rule (bench gdn's)\n", P, conv);
    else
        fprintf(f, "\nKimi Delta Attention layer over %d ranks: conv halo + conv (width %d) + L2 norm + entry states "
                   "(the per-channel\n  transition) + chunk, one document, g (T, H, K) as bench kda's; FLOPs of the "
                   "chunked delta rule (bench kda's = gdn's)\n", P, conv);
    fprintf(f, "  TF/s per GPU; eff = one-GPU ms / (GPUs x ms) of the same family; ratio = peer ms / ringscan ms at "
               "the same GPU count\n\n");
    fprintf(f, "%-28s %-20s %4s %10s %10s %8s %8s %7s %7s %7s %7s\n", "case", "impl", "GPUs", "ms fwd", "ms f+b",
            "TF/s fwd", "TF/s f+b", "eff f", "eff fb", "ratio f", "ratio fb");
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(req, "cases"), i, c) {
        const char *cname = json_string_value(json_object_get(c, "name"));
        BenchWork w = bench_work(attn ? BENCH_ATTN : part == 1 ? BENCH_GDN : BENCH_KDA, c);
        size_t j;
        json_t *r;
        json_array_foreach(ours, j, r) if (!strcmp(json_string_value(json_object_get(r, "case")), cname))
            bc_table_row(f, cname, r, ours, peer, &w, P, table);
        if (peer) json_array_foreach(json_object_get(peer, "results"), j, r) {
                const char *rc = json_string_value(json_object_get(r, "case"));
                if (rc && !strcmp(rc, cname)) bc_table_row(f, cname, r, ours, peer, &w, P, table);
            }
        bc_detail(f, cname, ours, attn);
    }
    bench_print_notes(f, peer);
}
