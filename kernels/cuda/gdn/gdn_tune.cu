/*
 * gdn_tune.cu — how a GDN call is run (gdn_host.h): the switches of cuda_gdn_tune.h (set by tests and
 * `ringscan bench gdn --gdn-tune`; all 0 in training: the built-in choices) and the plan of a call from
 * its shape: the mma.sync state passes' column block and pipeline stages, segments folded like the CP
 * scan where the heads are few, document segments side by side, the dual launch that lets the device
 * pick between two configurations by the documents, and the wgmma passes from 128 blocks of 64
 * columns. Every plan gives the same bits; the plan is a function of the shape and the switches only.
 * Host code only. docs/design/gdn-kernels.md has the design.
 *
 * Callers: gdn.cu (every entry plans its call), bench/bench.c and tests/cuda (cuda_gdn_tune_set / get).
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h" /* GDN_PIECE_ROWS */
#include "cuda_ptx.h"
#include "cuda_common.h"
#include "cuda_gdn_mma.h"
#include "cuda_gdn_tune.h"
#include "cuda_kernels.h"

/* the kernels' constants only (GDN_C, GDN_META_N, GDN_TP_N, GdnCarve): no kernel is instantiated here */
#include "common.cuh"
#include "state_pass.cuh"

#include "gdn_host.h"

static CudaGdnTune gdn_tune_set; /* all 0 (the built-in choices) unless a test or a benchmark set them */

CudaGdnTune gdn_tune(void) { return gdn_tune_set; }

extern "C" void cuda_gdn_tune_set(const CudaGdnTune *t) {
    if (t) gdn_tune_set = *t;
    else memset(&gdn_tune_set, 0, sizeof gdn_tune_set);
}

extern "C" void cuda_gdn_tune_get(CudaGdnTune *t) { *t = gdn_tune_set; }

static int gdn_sm_count(void) {
    static int n;
    if (!n) {
        int dev;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    }
    return n;
}

/* wide state passes fill more SMs with 16-column blocks when there are few heads */
static int gdn_state_bv(int nv, int dv) { return (int64_t)nv * dv / 32 >= 128 ? 32 : 16; }

/*
 * Segments of a state pass (gdn/state_pass.cuh): nc chunks, `blocks` state column blocks (nv dv / BV),
 * `mblocks` transition column blocks per segment (nv DK / BV), `slots` blocks the device holds at
 * once. Cost in chunk steps: (waves of phase A + waves of phase C) x ceil(nc / nseg), plus 2 per
 * fold link; one segment costs waves(blocks) x nc. A larger nseg must win by 5%; at least 16 chunks
 * per segment. A function of the shape only, so the bits do not change from run to run.
 */
static int gdn_pick_nseg(int64_t nc, int64_t blocks, int64_t mblocks, int64_t slots) {
    auto waves = [&](int64_t n) { return (double)((n + slots - 1) / slots); };
    double best = waves(blocks) * (double)nc;
    int bp = 1;
    for (int P = 2; P <= 32; P++) {
        if (nc < 16 * (int64_t)P) break;
        const double c = (waves((P - 1) * (blocks + mblocks) - mblocks) + waves(P * blocks)) *
                             (double)((nc + P - 1) / P) + 2.0 * (P - 2);
        if (c < 0.95 * best) {
            best = c;
            bp = P;
        }
    }
    return bp;
}

/* Automatic segments only where the state columns fill at most a quarter of the SMs (few heads):
 * at 128 and 256 column blocks (16 and 64 heads of 128) every split measured slower (a block's chunk
 * step is bound by its own issue and store work, and a second resident block runs at about half speed;
 * docs/design/gdn-kernels.md), so there one segment. Slots = one block per SM. */
template <int DK> static void gdn_plan_nseg(GdnPlan *pl, int64_t nc, int nv, int dv) {
    const int64_t blocks = (int64_t)nv * dv / pl->bv, mblocks = (int64_t)nv * DK / pl->bv;
    pl->nseg_f = pl->nseg_b = 4 * blocks <= gdn_sm_count() ? gdn_pick_nseg(nc, blocks, mblocks, gdn_sm_count()) : 1;
}

/* document segments when the chunks' documents are not known on the host: empty segments cost a
 * block launch each, so enough for about GDN_DSEG_WAVES blocks per SM, at most GDN_DSEG_MAX */
static int gdn_auto_dseg(int64_t blocks, int sms) {
    const int64_t z = (GDN_DSEG_WAVES * sms) / (blocks > 0 ? blocks : 1);
    return (int)(z < 1 ? 1 : z > GDN_DSEG_MAX ? GDN_DSEG_MAX : z);
}

template <int DK> GdnPlan gdn_plan(int64_t T, int nv, int dv) {
    const CudaGdnTune t = gdn_tune();
    GdnPlan pl = {};
    pl.prof = gdn_prof_level;
    RS_CHECK(t.bv == 0 || t.bv == 16 || t.bv == 32 || t.bv == 64, "gdn: bv %d (0, 16, 32 or 64 columns)", t.bv);
    pl.bv = t.bv ? t.bv : gdn_state_bv(nv, dv);
    RS_CHECK(dv % pl.bv == 0, "gdn: %d state columns per block do not divide dim_v %d", pl.bv, dv);
    pl.nst = pl.bv == 64 ? 2 : t.nst == 2 || t.nst == 3 ? t.nst : GDN_NST_DEFAULT; /* 64: smem for 2 stages */
    const int64_t nc = (T + GDN_C - 1) / GDN_C;
    if (t.split > 0) pl.nseg_f = pl.nseg_b = t.split < 64 ? t.split : 64;
    else gdn_plan_nseg<DK>(&pl, nc, nv, dv);
    /* document segments: explicit, or automatic where no explicit / automatic split was chosen */
    const int64_t blocks = (int64_t)nv * dv / pl.bv;
    if (t.dseg > 0) pl.dseg = t.dseg < GDN_DSEG_MAX ? t.dseg : GDN_DSEG_MAX;
    else if (t.split > 0 || pl.nseg_f > 1) pl.dseg = 1;
    else pl.dseg = gdn_auto_dseg(blocks, gdn_sm_count());
    if (pl.dseg > 1) pl.nseg_f = pl.nseg_b = 1;
    /* dual launch: where column block and document segments are automatic and nothing is split */
    const int dual = t.dual >= 1 && t.dual <= 4 ? (t.dual == 2 ? 0 : t.dual) : GDN_DUAL_DEFAULT;
    if (dual && t.bv == 0 && t.dseg == 0 && t.split == 0 && pl.nseg_f == 1 && pl.nseg_b == 1 && dv % 32 == 0) {
        pl.dual = dual;
        pl.dual_need = dual == 3 ? 0 : dual == 4 ? INT64_MAX : (int64_t)GDN_DUAL_WAVES * gdn_sm_count();
        const int64_t per_seg = (int64_t)nv * dv / 128 > 0 ? (int64_t)nv * dv / 128 : 1;
        pl.dual_wave = gdn_sm_count() / per_seg > 0 ? (int)(gdn_sm_count() / per_seg) : 1;
    }
    /* wgmma forward state pass: every forward pass (segments, transition columns, document segments,
     * dual launch) */
    const int sfwd = t.sfwd == 1 ? 2 : t.sfwd == 3 ? 3 : t.sfwd == 2 ? 0 : (int64_t)nv * dv / 64 >= GDN_SFWD_BLOCKS ? 2 : 0;
    pl.sfwd = dv % 64 != 0 ? 0 : sfwd;
    /* wgmma backward state pass: every backward pass (the same contract) */
    const int sbwd = t.sbwd == 1 ? 1 : t.sbwd == 2 ? 0 : (int64_t)nv * dv / 64 >= GDN_SBWD_BLOCKS ? 1 : 0;
    pl.sbwd = dv % 64 != 0 ? 0 : sbwd;
    /* the dual launch's many-document configuration on wgmma: 64 columns in GDN_DUAL_ZB document
     * segments. The device's pick is unchanged: (nv dv / 32) x non-empty segments >= 2 blocks per SM is
     * (nv dv / 64) x non-empty segments >= 1 block per SM, what a wgmma block (one per SM) needs. */
    const int dwg = t.dwg == 1 ? 1 : t.dwg == 2 ? 0 : GDN_DWG_DEFAULT;
    pl.dwg = pl.dual && dv % 64 == 0 ? dwg : 0;
    /* the wgmma forward pass in 32-column blocks (two blocks per SM), or with the state in registers: one
     * warpgroup of 64 columns (two blocks per SM), or two sharing the W, K tiles where the state and transition
     * columns fall in whole blocks of 128 (else 32); automatic: 32, or 64 where the shape allows two warpgroups
     * and the blocks with work exceed one per SM */
    RS_CHECK(t.sfbv == 0 || t.sfbv == 32 || t.sfbv == 64 || t.sfbv == 128, "gdn: sfbv %d (0, 32, 64 or 128 columns)",
             t.sfbv);
    const bool wide_ok = dv % 128 == 0 && DK % 128 == 0;
    pl.sfbv = (t.sfbv == 0 || t.sfbv == 128) && !wide_ok ? 32 : t.sfbv;
    /* the wgmma backward pass in 128-column blocks (two warpgroups) where the state and transition columns
     * (dv + DK) fall in whole blocks of 128 (as sfwd, a shape that does not allow it runs the other) */
    RS_CHECK(t.sbcols == 0 || t.sbcols == 64 || t.sbcols == 128, "gdn: sbcols %d (0, 64 or 128 columns)", t.sbcols);
    pl.sbcols = !wide_ok ? 64 : t.sbcols;
    if (pl.prof == 2) {
        static long long *tp;
        if (!tp) CUDA_CHECK(cudaMalloc(&tp, 2 * GDN_TP_SLOTS * sizeof(long long)));
        pl.tp = tp;
    }
    return pl;
}

/* The wide form of a wgmma state pass against the narrow one, by the 64-column blocks that have work; measured on
 * an H200. Backward, two warpgroups per block against one (docs/bench-log/2026-11-30-l-gdn-two-warpgroup-state-
 * passes.md): 128 blocks (one wave): one warpgroup wins by 2.8%; 160 with uneven segments: one wins by 2.4%; 192
 * and more: two win by 4-8% (the 1.9-wave launches run their second wave late). Forward, the pass with the state
 * in registers (one warpgroup of 64 columns, two blocks per SM) against 32-column blocks (2026-12-02-b): it wins
 * by 2-17% on the pass wherever the 64-column blocks with work exceed one per SM (160 and more) and loses by 1-2%
 * at 128 (64 heads, one document). Threshold, both: one block per SM. Every form gives the same bits (test_cuda
 * checks it). */
int64_t gdn_wide_need(void) { return (int64_t)gdn_sm_count(); }

bool gdn_wide_pick(int64_t blocks64) { return blocks64 > gdn_wide_need(); }

template GdnPlan gdn_plan<64>(int64_t T, int nv, int dv);
template GdnPlan gdn_plan<128>(int64_t T, int nv, int dv);
