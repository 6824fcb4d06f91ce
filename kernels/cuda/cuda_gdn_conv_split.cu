/*
 * cuda_gdn_conv_split.cu — the GDN layer's causal conv1d + SiLU and the split after it, fused, on the cuda backend
 * (lib/backend/backend.h: gdn_conv_split_forward/backward; the oracle is the unfused pair, conv1d_silu_* then
 * gdn_split_*: kernels/cpu/cpu_conv.c). proj (T,ldp) holds the [q|k|v|z] columns: Kd2 = 2 nk dk of q|k, Vd of v,
 * Vd of z; the conv runs over C = Kd2 + Vd channels (w (C,4), halo (3,C) or NULL).
 *   forward:  qk (T,Kd2) = each q, k head of the conv's q|k columns L2-normalised, rstd (T,2nk) its 1/norm;
 *             v (T,Vd) = the conv's v columns; z (T,Vd) = proj's z columns.
 *   backward: dconv = the L2 norm's backward of dqk (with qk, rstd) | dv, made per row; then the conv's backward:
 *             dproj's q|k|v columns (=), dhalo (3,C) (= or NULL), dw (C,4) (+=, per-block partials added in a
 *             fixed order); dproj's z columns = dz.
 * The conv walks cuda_conv.cu's runs (Kc = 4: the constants and the steps of cuda_conv_run.cuh, the same sums in
 * the same order) with each q, k head's norm (forward) or its backward done in registers, a head being 16 or 32
 * lanes of one warp (dk = 64, 128): the conv output and its gradient never reach memory.
 *
 * Callers: through backend_cuda (lib/model/model_block.c), tests/cuda/test_cuda_conv.cu (cuda_gdn_conv_split); the
 * device code runs under the host emulation of tests/cuda/glue_emu too (emu_conv.cpp; split_cmp compares two
 * revisions bitwise).
 */
#include "cuda_common.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_conv_run.cuh" /* the run walk's constants and steps, shared with cuda_conv.cu */
#include "cuda_norm.cuh"     /* L2NORM_EPS */

#define CONV_SPLIT_GB 2            /* rows the fused GDN conv + split backward loads as a group (2 fit in
                                    * 128 registers beside its windows, dw and weights) */
#define CONV_SPLIT_BLOCK (CONV_RUN_KC / CONV_SPLIT_GB) /* groups per unrolled block of the backward: KC tokens */
#define CONV_SPLIT_ZG 8            /* rows the z copies of the fused GDN conv + split load as a group (2 KB
                                    * of reads in flight per warp; the conv warps have 1 KB and an L2 prefetch) */

/* How: the run kernels' walk (KC = 4) over proj's [q|k|v] channels with gdn_split done on each row in registers,
 * so the conv output (forward) and its gradient (backward) never reach memory. A warp's 32 lanes hold 128
 * consecutive channels of one token, and the q|k part (2 nk dk channels, a multiple of 128 for dk = 64, 128)
 * ends on a warp boundary: a warp is all q|k or all v (the branch is uniform per warp), and a q or k head is
 * HL = dk/4 lanes of one warp, so its sum of squares (forward) or dot (dqk . y) (backward) is a butterfly
 * over those lanes, in a fixed order; the forward does a group's CONV_RUN_G rows' sums as interleaved
 * butterflies (conv_head_sums), the backward its CONV_SPLIT_GB rows' dots, so the rows' shuffle chains overlap.
 * Both keep the conv input window in fp32, each row unpacked once as it enters (bit ops on the bf16 pairs), and
 * make a group's row addresses once from its 32-bit row index. A group whose tokens lie inside the run, with every
 * tap inside its document (doc_pos >= KC-1 along the windows) and 8-byte rows, takes the FULL instance of its group
 * code: the same operations without the per-token tests, their branches and predicates; the backward walks blocks
 * of KC tokens (two groups) unrolled, so its window shifts are register renames. Blocks past the conv's along x
 * copy z for the same rows (forward: proj's z columns into z; backward: dz into dproj's z columns). The conv output
 * and its gradient are rounded to bf16 where the unfused pair stored them, so the values are those of conv1d_silu_*
 * and gdn_split_* up to the order of a head's sum; dw and dhalo are the run backward's, bitwise, for that gradient. */

/* the n <= CONV_CV bf16 of u at p (one 8-byte store when `vec`) */
__device__ __forceinline__ void conv_put4(bf16 *p, uint2 u, int n, bool vec) {
    if (vec && n == CONV_CV) {
        *reinterpret_cast<uint2 *>(p) = u;
        return;
    }
    const bf16 *h = reinterpret_cast<const bf16 *>(&u);
#pragma unroll
    for (int i = 0; i < CONV_CV; i++)
        if (i < n) p[i] = h[i];
}

/* dst rows [t0, t1) = src rows, n <= CONV_CV columns: a group of CONV_SPLIT_ZG rows loaded before any store */
__device__ __forceinline__ void conv_copy_rows(bf16 *dst, int ldd, const bf16 *src, int lds, int t0, int t1, int n,
                                               bool vec) {
    for (int tg = t0; tg < t1; tg += CONV_SPLIT_ZG) {
        uint2 r[CONV_SPLIT_ZG];
#pragma unroll
        for (int g = 0; g < CONV_SPLIT_ZG; g++)
            if (tg + g < t1) r[g] = conv_raw4(src + (int64_t)(tg + g) * lds, n, vec);
#pragma unroll
        for (int g = 0; g < CONV_SPLIT_ZG; g++)
            if (tg + g < t1) conv_put4(dst + (int64_t)(tg + g) * ldd, r[g], n, vec);
    }
}

/* each v[r] of v[0..R) summed over the HL lanes of its head (aligned groups of HL lanes of the warp) by a
 * butterfly, the R butterflies interleaved (R independent shuffle chains: each step's R shuffles are in flight
 * together); every v[r] gets the same additions in the same order as a butterfly of its own */
template <int HL, int R>
__device__ __forceinline__ void conv_head_sums(float v[R]) {
#pragma unroll
    for (int o = HL / 2; o > 0; o >>= 1)
#pragma unroll
        for (int r = 0; r < R; r++) v[r] += __shfl_xor_sync(0xffffffffu, v[r], o);
}

/* the forward's group [tg, tg + CONV_RUN_G) (xr: its input rows in, its conv + SiLU rows out; dpg its doc_pos): the
 * group's conv + SiLU rows first, rounded to bf16 and kept packed (xr's registers), with their sums of squares;
 * then the group's head sums as one butterfly of CONV_RUN_G independent chains; then the stores. No branch between
 * the rows: the shuffle chains of the rows overlap rather than run one after another. Rows past t1 or with
 * doc_pos < 0 are computed (a warp's branches are uniform) but not stored. FULL: the caller knows the rows lie
 * before t1, every doc_pos >= KC-1 (every tap inside the document) and 8-byte rows: the same operations without the
 * tests. */
template <int KC, int HL, bool FULL>
__device__ __forceinline__ void conv_split_fwd_group(bf16 *out /* (T,ldo) */, int ldo, float *rs_out /* (T,nqk) */,
                                                     int nqk, float xw[KC][CONV_CV], const float wr[CONV_CV][KC],
                                                     uint2 xr[CONV_RUN_G], const int dpg[CONV_RUN_G], int tg, int t1,
                                                     int c, int n, bool is_qk, bool vec, int *err) {
    constexpr int DK = HL * CONV_CV;
    float ss[CONV_RUN_G];
#pragma unroll
    for (int g = 0; g < CONV_RUN_G; g++) {
        conv_unpack4(xw[0], xr[g]);
        float u[CONV_CV];
        conv_run_preact<KC>(u, xw, wr, FULL ? KC - 1 : min(KC - 1, dpg[g]));
        __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&xr[g]);
        h[0] = __floats2bfloat162_rn(u[0] * conv_sigmoid(u[0]), u[1] * conv_sigmoid(u[1]));
        h[1] = __floats2bfloat162_rn(u[2] * conv_sigmoid(u[2]), u[3] * conv_sigmoid(u[3]));
        conv_unpack4(u, xr[g]);
        ss[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < CONV_CV; i++) ss[g] += u[i] * u[i];
        conv_window_shift<KC>(xw);
    }
    if (is_qk) {
        conv_head_sums<HL, CONV_RUN_G>(ss);
#pragma unroll
        for (int g = 0; g < CONV_RUN_G; g++) ss[g] = 1.0f / sqrtf(ss[g] + L2NORM_EPS); /* the rows' rstd */
    }
#pragma unroll
    for (int g = 0; g < CONV_RUN_G; g++) {
        const int t = tg + g;
        if (!FULL && t >= t1) break;
        const int dp = dpg[g]; /* the same for the warp's lanes: its branches are uniform */
        if (!FULL && dp < 0) cuda_raise(err, CUDA_ERR_DOC_POS, t, dp);
        else if (is_qk) {
            const float rs = ss[g];
            if (c % DK == 0) rs_out[(int64_t)t * nqk] = rs;
            float u[CONV_CV];
            conv_unpack4(u, xr[g]);
#pragma unroll
            for (int i = 0; i < CONV_CV; i++) u[i] *= rs;
            conv_store4(out + (int64_t)t * ldo, u, FULL ? CONV_CV : n, FULL || vec);
        } else conv_put4(out + (int64_t)t * ldo, xr[g], FULL ? CONV_CV : n, FULL || vec);
    }
}

/* rows [t0, t0 + run) of CONV_CV channels per thread: conv + SiLU (rounded to bf16), then q|k lanes the L2
 * norm of their head into qk and rstd, v lanes the copy into v; blocks x >= nbc copy z */
template <int KC, int HL>
__global__ void __launch_bounds__(CONV_RUN_LANES *CONV_RUN_ROWS, 3) conv_split_forward_kernel(
    bf16 *qk /* (T,Kd2) */, float *rstd /* (T,Kd2/dk) */, bf16 *v /* (T,Vd) */, bf16 *z /* (T,Vd) */,
    const bf16 *proj /* (T,ldp) [q|k|v|z] */, const bf16 *halo /* (KC-1,Kd2+Vd) or NULL */,
    const bf16 *w /* (Kd2+Vd,KC) */, const int32_t *doc_pos /* (T) */, int T, int run, int Kd2, int Vd,
    int ldp, unsigned nbc, int *err, bool vec) {
    constexpr int DK = HL * CONV_CV;
    const int C = Kd2 + Vd, nqk = Kd2 / DK;
    const int t0 = (blockIdx.y * CONV_RUN_ROWS + threadIdx.y) * run; /* T < 2^31 (the host checks) */
    if (t0 >= T) return;
    const int t1 = min(T, t0 + run);
    if (blockIdx.x >= nbc) { /* z */
        const int c = ((blockIdx.x - nbc) * CONV_RUN_LANES + threadIdx.x) * CONV_CV;
        if (c < Vd) conv_copy_rows(z + c, Vd, proj + C + c, ldp, t0, t1, min(CONV_CV, Vd - c), vec);
        return;
    }
    const int c = (blockIdx.x * CONV_RUN_LANES + threadIdx.x) * CONV_CV;
    if (c >= C) return; /* v lanes only: a q|k warp is whole */
    const int n = min(CONV_CV, C - c);
    const bool is_qk = c < Kd2; /* uniform per warp */
    bf16 *out = is_qk ? qk + c : v + (c - Kd2); /* the lane's output columns */
    const int ldo = is_qk ? Kd2 : Vd;
    float *rs_out = rstd + c / DK; /* its head's rstd (q|k lanes) */
    float wr[CONV_CV][KC], xw[KC][CONV_CV]; /* xw[b] = x(t-b), each row unpacked once */
    conv_run_weights<KC>(wr, w, c, n);
#pragma unroll
    for (int b = 1; b < KC; b++) conv_row4<KC>(xw[b], proj, halo, t0 - b, c, n, C, ldp, vec);
    uint2 xn[CONV_RUN_G]; /* the next group's rows, in flight while this group computes */
    int dpn[CONV_RUN_G];
#pragma unroll
    for (int g = 0; g < CONV_RUN_G; g++) xn[g] = make_uint2(0, 0), dpn[g] = -1; /* rows past t1: never stored */
    /* the group's rows before t1: one address from the 32-bit row index, rows at + g ldp; the 8-byte case once */
    auto load_group = [&](int tg) {
        const bf16 *px = proj + (int64_t)tg * ldp + c;
        auto rows = [&](int nr, bool vr) {
#pragma unroll
            for (int g = 0; g < CONV_RUN_G; g++)
                if (tg + g < t1) xn[g] = conv_raw4(px + g * ldp, nr, vr), dpn[g] = doc_pos[tg + g];
        };
        if (vec && n == CONV_CV) rows(CONV_CV, true); else rows(n, vec);
    };
    load_group(t0);
    for (int tg = t0; tg < t1; tg += CONV_RUN_G) {
        uint2 xr[CONV_RUN_G];
        int dpg[CONV_RUN_G];
#pragma unroll
        for (int g = 0; g < CONV_RUN_G; g++) xr[g] = xn[g], dpg[g] = dpn[g];
        if (tg + CONV_RUN_G < t1) load_group(tg + CONV_RUN_G);
        conv_prefetch_rows<CONV_RUN_G>(proj, ldp, tg, t1, c);
        int dpmin = dpg[0];
#pragma unroll
        for (int g = 1; g < CONV_RUN_G; g++) dpmin = min(dpmin, dpg[g]);
        if (vec && tg + CONV_RUN_G <= t1 && dpmin >= KC - 1)
            conv_split_fwd_group<KC, HL, true>(out, ldo, rs_out, nqk, xw, wr, xr, dpg, tg, t1, c, n, is_qk, vec, err);
        else
            conv_split_fwd_group<KC, HL, false>(out, ldo, rs_out, nqk, xw, wr, xr, dpg, tg, t1, c, n, is_qk, vec, err);
    }
}

/* the backward's tokens [tg, tg + CONV_SPLIT_GB) as the run backward walks them (xr their input rows, dr their
 * dconv rows, dpg their doc_pos), the window xw shifted with every token (a token past T shifts in a row no later
 * token reads, so both instances keep one register layout); the rows s = t - (KC-1) they complete go to dproj
 * (the address of row tg - (KC-1) made once) or dhalo. FULL: the caller knows the tokens lie in the run's own
 * rows past its first KC-1, every token of their windows has doc_pos >= KC-1 and the rows are 8-byte vectors:
 * the same operations without the tests. */
template <int KC, bool FULL>
__device__ __forceinline__ void conv_split_bwd_group(bf16 *dproj /* (T,ldp) */, int ldp, bf16 *dhalo /* (KC-1,C) */,
                                                     float duw[KC][CONV_CV], int dpw[KC], float dw[CONV_CV][KC],
                                                     float xw[KC][CONV_CV], const float wr[CONV_CV][KC],
                                                     const uint2 xr[CONV_SPLIT_GB], const uint2 dr[CONV_SPLIT_GB],
                                                     const int dpg[CONV_SPLIT_GB], int tg, int t0, int t1, int tend,
                                                     int T, int C, int c, int n, bool vec, int *err) {
    bf16 *drow = dproj + (int64_t)(tg - (KC - 1)) * ldp + c; /* row tg - (KC-1), used where it is >= 0 */
#pragma unroll
    for (int g = 0; g < CONV_SPLIT_GB; g++) {
        const int t = tg + g;
        if (!FULL && t >= tend) break;
        conv_bwd_shift<KC>(duw, dpw); /* du[t] into duw[KC-1] below */
        float dy[CONV_CV];
        conv_unpack4(dy, dr[g]);
        conv_unpack4(xw[0], xr[g]);
        if (FULL || t < T) conv_bwd_token<KC, FULL>(duw, dpw, dw, wr, xw, dy, dpg[g], t, t1, err);
        conv_window_shift<KC>(xw);
        conv_bwd_input_row<KC, FULL>(drow + g * ldp, dhalo, duw, dpw, wr, t, t0, t1, C, c, n, vec);
    }
}

/* conv_run_backward_kernel with dout[t] made in registers: q|k lanes the L2 norm's backward of their head,
 * rstd (dqk - (dqk . y) y) rounded to bf16, v lanes dv; blocks x >= nbc copy dz into dproj's z columns */
template <int KC, int HL>
__global__ void __launch_bounds__(CONV_RUN_LANES *CONV_RUN_ROWS, 2) conv_split_backward_kernel(
    bf16 *dproj /* (T,ldp) [q|k|v|z] = */, bf16 *dhalo /* (KC-1,C) = or NULL */, float *part /* (gridDim.y, C*KC) */,
    const bf16 *dqk /* (T,Kd2) */, const bf16 *qk /* (T,Kd2) */, const float *rstd /* (T,Kd2/dk) */,
    const bf16 *dv /* (T,Vd) */, const bf16 *dz /* (T,Vd) */, const bf16 *proj /* (T,ldp) */,
    const bf16 *halo /* (KC-1,C) or NULL */, const bf16 *w /* (C,KC) */, const int32_t *doc_pos /* (T) */, int T,
    int run, int Kd2, int Vd, int ldp, unsigned nbc, int *err, bool vec) {
    constexpr int DK = HL * CONV_CV;
    __shared__ float sh[CONV_RUN_ROWS][CONV_RUN_LANES][CONV_CV * KC + 1];
    const int C = Kd2 + Vd, nqk = Kd2 / DK;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int t0 = (blockIdx.y * CONV_RUN_ROWS + ty) * run; /* T < 2^31 (the host checks) */
    if (blockIdx.x >= nbc) { /* dz: the whole block returns here */
        const int c = ((blockIdx.x - nbc) * CONV_RUN_LANES + tx) * CONV_CV;
        if (c < Vd && t0 < T)
            conv_copy_rows(dproj + C + c, ldp, dz + c, Vd, t0, min(T, t0 + run), min(CONV_CV, Vd - c), vec);
        return;
    }
    const int c = (blockIdx.x * CONV_RUN_LANES + tx) * CONV_CV;
    const int n = c < C ? min(CONV_CV, C - c) : 0;
    const bool is_qk = c < Kd2; /* uniform per warp */
    /* the lane's gradient columns (dqk or dv), its y columns and its head's rstd (q|k lanes) */
    const bf16 *gsrc = is_qk ? dqk + c : dv + (c - Kd2), *ysrc = qk + c;
    const int ldg = is_qk ? Kd2 : Vd;
    const float *rsrc = rstd + c / DK;
    float dw[CONV_CV][KC];
#pragma unroll
    for (int i = 0; i < CONV_CV; i++)
#pragma unroll
        for (int j = 0; j < KC; j++) dw[i][j] = 0.0f;
    if (n > 0 && t0 < T) {
        const int t1 = min(T, t0 + run);
        float wr[CONV_CV][KC], duw[KC][CONV_CV]; /* duw[b] = du[s+b], s = t-(KC-1) */
        float xw[KC][CONV_CV]; /* xw[b] = x(t-b), each row unpacked once */
        int dpw[KC];           /* doc_pos of the tokens of duw; -1: none */
        conv_bwd_start<KC>(wr, xw, duw, dpw, w, proj, halo, t0, c, n, C, ldp, vec);
        const int tend = t1 + KC - 1, tlim = min(tend, T); /* rows past tlim are not read */
        /* the next group's input rows, dqk (or dv) and y rows, rstd */
        uint2 xn[CONV_SPLIT_GB], gn[CONV_SPLIT_GB], yn[CONV_SPLIT_GB];
        float rn[CONV_SPLIT_GB];
        int dpn[CONV_SPLIT_GB];
#pragma unroll
        for (int g = 0; g < CONV_SPLIT_GB; g++)
            xn[g] = gn[g] = yn[g] = make_uint2(0, 0), rn[g] = 0.0f, dpn[g] = -1;
        /* the group's rows before tlim as in the forward: one address per stream, rows at + g ld */
        auto load_group = [&](int tg) {
            const bf16 *px = proj + (int64_t)tg * ldp + c, *pg = gsrc + (int64_t)tg * ldg,
                       *py = ysrc + (int64_t)tg * Kd2;
            const float *pr = rsrc + (int64_t)tg * nqk;
            auto rows = [&](int nr, bool vr) {
#pragma unroll
                for (int g = 0; g < CONV_SPLIT_GB; g++)
                    if (tg + g < tlim) {
                        xn[g] = conv_raw4(px + g * ldp, nr, vr);
                        gn[g] = conv_raw4(pg + g * ldg, nr, vr);
                        if (is_qk) yn[g] = conv_raw4(py + g * Kd2, CONV_CV, vr), rn[g] = pr[g * nqk];
                        dpn[g] = doc_pos[tg + g];
                    }
            };
            if (vec && n == CONV_CV) rows(CONV_CV, true); else rows(n, vec);
        };
        load_group(t0);
        /* blocks of KC tokens, each CONV_SPLIT_BLOCK groups unrolled: the window shifts are register renames */
        for (int tb = t0; tb < tend; tb += KC) {
#pragma unroll
            for (int h = 0; h < CONV_SPLIT_BLOCK; h++) {
                const int tg = tb + h * CONV_SPLIT_GB;
                if (tg >= tend) break;
                /* this group's dout rows made first (the loads behind them die before the next group's are
                 * issued): dconv = rstd (dqk - (dqk . y) y) rounded to bf16 as gdn_split_backward stores it, or dv.
                 * Rows past T give values no one reads; the head sums run uniformly per warp all the same. */
                uint2 xr[CONV_SPLIT_GB], dr[CONV_SPLIT_GB];
                int dpg[CONV_SPLIT_GB];
#pragma unroll
                for (int g = 0; g < CONV_SPLIT_GB; g++) xr[g] = xn[g], dpg[g] = dpn[g], dr[g] = gn[g];
                if (is_qk) { /* the group's dots (dqk . y) as CONV_SPLIT_GB interleaved butterflies */
                    float dot[CONV_SPLIT_GB], gv[CONV_SPLIT_GB][CONV_CV], y[CONV_SPLIT_GB][CONV_CV];
#pragma unroll
                    for (int g = 0; g < CONV_SPLIT_GB; g++) {
                        conv_unpack4(gv[g], gn[g]);
                        conv_unpack4(y[g], yn[g]);
                        dot[g] = 0.0f;
#pragma unroll
                        for (int i = 0; i < CONV_CV; i++) dot[g] += gv[g][i] * y[g][i];
                    }
                    conv_head_sums<HL, CONV_SPLIT_GB>(dot);
#pragma unroll
                    for (int g = 0; g < CONV_SPLIT_GB; g++) {
#pragma unroll
                        for (int i = 0; i < CONV_CV; i++) gv[g][i] = rn[g] * (gv[g][i] - dot[g] * y[g][i]);
                        __nv_bfloat162 *hp = reinterpret_cast<__nv_bfloat162 *>(&dr[g]);
                        hp[0] = __floats2bfloat162_rn(gv[g][0], gv[g][1]);
                        hp[1] = __floats2bfloat162_rn(gv[g][2], gv[g][3]);
                    }
                }
                if (tg + CONV_SPLIT_GB < tlim) load_group(tg + CONV_SPLIT_GB);
#pragma unroll
                for (int g = 0; g < CONV_SPLIT_GB; g++)
                    if (tg + CONV_PF_ROWS + g < tlim) {
                        const int t = tg + CONV_PF_ROWS + g;
                        cuda_prefetch_l2(proj + (int64_t)t * ldp + c);
                        cuda_prefetch_l2(gsrc + (int64_t)t * ldg);
                        if (is_qk) cuda_prefetch_l2(ysrc + (int64_t)t * Kd2);
                    }
                /* The group's tokens inside the run's own rows, past its first KC-1, with every token of their
                 * windows at doc_pos >= KC-1: every test below is known to pass (the common case), else each
                 * token as the run backward walks it. Both shift the windows the same way (a token past T
                 * shifts in a row no later token reads), so the unrolled block keeps one register layout. */
                int dpmin = dpg[0];
#pragma unroll
                for (int g = 1; g < CONV_SPLIT_GB; g++) dpmin = min(dpmin, dpg[g]);
#pragma unroll
                for (int b = 1; b < KC; b++) dpmin = min(dpmin, dpw[b]);
                if (vec && tg >= t0 + KC - 1 && tg + CONV_SPLIT_GB <= t1 && dpmin >= KC - 1)
                    conv_split_bwd_group<KC, true>(dproj, ldp, dhalo, duw, dpw, dw, xw, wr, xr, dr, dpg, tg, t0, t1,
                                                   tend, T, C, c, n, vec, err);
                else
                    conv_split_bwd_group<KC, false>(dproj, ldp, dhalo, duw, dpw, dw, xw, wr, xr, dr, dpg, tg, t0, t1,
                                                    tend, T, C, c, n, vec, err);
            }
        }
    }
    conv_run_dw_partials<KC>(part, sh, dw, C);
}

/* the fused GDN conv + split's sizes: Kc = 4 (the run kernels'), dk = 64 or 128 (a head within one warp) */
static void conv_split_check(int64_t T, int nk, int dk, int Vd, int Kc, int ldp) {
    RS_CHECK(T >= 0 && nk > 0 && Vd > 0, "gdn_conv_split: T %lld nk %d Vd %d", (long long)T, nk, Vd);
    RS_CHECK(Kc == CONV_RUN_KC, "gdn_conv_split: Kc = %d (the cuda kernel is built for %d)", Kc, CONV_RUN_KC);
    RS_CHECK(dk == 64 || dk == 128, "gdn_conv_split: dk = %d (the cuda kernel supports 64, 128)", dk);
    RS_CHECK(ldp >= 2 * nk * dk + 2 * Vd, "gdn_conv_split: ldp = %d, need >= Cc + Vd = %d", ldp, 2 * nk * dk + 2 * Vd);
}

extern "C" void cuda_gdn_conv_split_forward(void *qk, float *qk_rstd, void *v, void *z, const void *proj,
                                            const void *halo, const void *w, const int32_t *doc_pos, int64_t T, int nk,
                                            int dk, int Vd, int Kc, int ldp) {
    conv_split_check(T, nk, dk, Vd, Kc, ldp);
    if (!T) return;
    const int Kd2 = 2 * nk * dk, C = Kd2 + Vd;
    const bool v4 = conv_vec4_ok(qk, Kd2, Kd2) && conv_vec4_ok(v, Vd, Vd) && conv_vec4_ok(z, Vd, Vd) &&
                    conv_vec4_ok(proj, C + Vd, ldp) && conv_vec4_ok(halo, C, C);
    const int64_t gy = cuda_ceil_div(T, (int64_t)CONV_RUN_ROWS * CONV_RUN_FWD);
    RS_CHECK(gy <= 65535, "gdn_conv_split_forward: T = %lld exceeds the run kernel's grid (65535 blocks of %d rows; "
                          "its token indices are 32-bit)",
             (long long)T, CONV_RUN_ROWS * CONV_RUN_FWD);
    const unsigned nbc = (unsigned)cuda_ceil_div(cuda_ceil_div(C, CONV_CV), CONV_RUN_LANES);
    const unsigned nbz = (unsigned)cuda_ceil_div(cuda_ceil_div(Vd, CONV_CV), CONV_RUN_LANES);
    const dim3 grid(nbc + nbz, (unsigned)gy), block(CONV_RUN_LANES, CONV_RUN_ROWS);
#define CONV_SPLIT_FWD(HL)                                                                                           \
    conv_split_forward_kernel<CONV_RUN_KC, HL><<<grid, block, 0, cuda_stream()>>>(                                  \
        (bf16 *)qk, qk_rstd, (bf16 *)v, (bf16 *)z, (const bf16 *)proj, (const bf16 *)halo, (const bf16 *)w, doc_pos, \
        (int)T, CONV_RUN_FWD, Kd2, Vd, ldp, nbc, cuda_error_word(), v4)
    if (dk == 128) CONV_SPLIT_FWD(32);
    else CONV_SPLIT_FWD(16);
#undef CONV_SPLIT_FWD
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_gdn_conv_split_backward(void *dproj, void *dhalo, float *dw, const void *dqk, const void *qk,
                                             const float *qk_rstd, const void *dv, const void *dz, const void *proj,
                                             const void *halo, const void *w, const int32_t *doc_pos, int64_t T,
                                             int nk, int dk, int Vd, int Kc, int ldp) {
    conv_split_check(T, nk, dk, Vd, Kc, ldp);
    if (!T) return; /* no token reads the halo rows: their gradient is not asked of an empty call */
    const int Kd2 = 2 * nk * dk, C = Kd2 + Vd;
    const bool v4 = conv_vec4_ok(dproj, C + Vd, ldp) && conv_vec4_ok(dhalo, C, C) && conv_vec4_ok(dqk, Kd2, Kd2) &&
                    conv_vec4_ok(qk, Kd2, Kd2) && conv_vec4_ok(dv, Vd, Vd) && conv_vec4_ok(dz, Vd, Vd) &&
                    conv_vec4_ok(proj, C + Vd, ldp) && conv_vec4_ok(halo, C, C);
    int64_t run = 0;
    const int64_t gy = conv_run_backward_grid(&run, T, C, Kc, "gdn_conv_split_backward");
    float *part = (float *)cuda_scratch((size_t)gy * C * Kc * sizeof(float), "gdn_conv_split_backward");
    const unsigned nbc = (unsigned)cuda_ceil_div(cuda_ceil_div(C, CONV_CV), CONV_RUN_LANES);
    const unsigned nbz = (unsigned)cuda_ceil_div(cuda_ceil_div(Vd, CONV_CV), CONV_RUN_LANES);
    const dim3 grid(nbc + nbz, (unsigned)gy), block(CONV_RUN_LANES, CONV_RUN_ROWS);
#define CONV_SPLIT_BWD(HL)                                                                                           \
    conv_split_backward_kernel<CONV_RUN_KC, HL><<<grid, block, 0, cuda_stream()>>>(                                 \
        (bf16 *)dproj, (bf16 *)dhalo, part, (const bf16 *)dqk, (const bf16 *)qk, qk_rstd, (const bf16 *)dv,          \
        (const bf16 *)dz, (const bf16 *)proj, (const bf16 *)halo, (const bf16 *)w, doc_pos, (int)T, (int)run, Kd2,   \
        Vd, ldp, nbc, cuda_error_word(), v4)
    if (dk == 128) CONV_SPLIT_BWD(32);
    else CONV_SPLIT_BWD(16);
#undef CONV_SPLIT_BWD
    CUDA_LAUNCH_CHECK();
    cuda_partials_add(dw, part, (int)gy, (int64_t)C * Kc);
}
