/*
 * gdn.cu — the chunked gated delta rule on the GPU: the Backend entries gdn_chunk_forward,
 * gdn_chunk_backward (whole or by stage), gdn_chunk_prep and the context-parallel entries
 * gdn_chunk_transition, gdn_chunk_dstate, gdn_state_affine (lib/backend/backend.h has the contract;
 * kernels/cpu/cpu_gdn.c is the fp32 oracle), and the launches of the kernels, which are the .cuh files
 * beside it, one stage each, compiled in this one translation unit.
 *
 * Shapes: T tokens (T < 2^31 - 128), nk key heads and nv value heads (GVA: nv a multiple of nk),
 * dim_k, dim_v in {64, 128}; q, k (T, ldq), v (T, ldv), o (T, ldo) bf16 with 16-byte aligned rows; g,
 * beta (T, nv) fp32; states (nv, dim_k, dim_v) fp32. Chunks of 64 tokens restart at every document
 * start (doc_pos == 0), found on the device by the index kernels.
 *
 * A forward runs index, prep (the WY factors and gate cumsums per chunk), the state pass (sequential
 * over chunks, one block per value head and column block of the state) and the output; a backward runs
 * dvlocal, the reverse state pass, dqkwg and wy_bwd (and group_reduce for GVA). What the forward keeps
 * for the backward (the caller's kept buffer: W, U, G2 and, by its kind, Tinv and the chunk states h and vn)
 * lets the backward skip its prep, wy_bwd's solve and its state recompute; the staged entries split both passes
 * for the CP chain (lib/cp/cp_gdn_chain.c). A call longer than GDN_PIECE_ROWS runs as pieces, the state passed between
 * them in fp32. Every configuration of the plan gives the same bits; tiles are fixed and no atomics are
 * used, so a run is deterministic. The plan, the profile and the device buffers are in gdn_tune.cu,
 * gdn_profile.cu and gdn_buffers.cu (gdn_host.h). The algebra, the kernel split, the numerics, the
 * chunk bookkeeping and the byte counts of the workspace and the kept buffer: docs/design/gdn-kernels.md.
 *
 * Callers: the cuda backend table (the model's GDN layers, lib/cp/cp_gdn*.c), tests/cuda/test_cuda_gdn.cu,
 * bench/bench_ops.c.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h> /* CUtensorMap and its enums (the encoder is fetched through the runtime) */

#include "backend/backend.h" /* GDN_PIECE_ROWS */
#include "cuda_ptx.h"
#include "cuda_common.h"
#include "cuda_gdn_mma.h"
#include "cuda_gdn_tune.h"
#include "cuda_kernels.h"

/* the kernels, one stage per file (one translation unit: the host code below instantiates them) */
#include "common.cuh"
#include "index.cuh"
#include "output.cuh"
#include "state_pass.cuh"
#include "state_forward.cuh"
#include "state_backward.cuh"
#include "wy_backward.cuh"
#include "prep.cuh"
#include "dqkwg.cuh"
#include "state_forward_wgmma.cuh"
#include "state_forward_regs.cuh"
#include "state_backward_regs.cuh"
#include "reduce.cuh"

#include "gdn_host.h" /* the plan, the profile and the buffers (gdn_tune.cu, gdn_profile.cu, gdn_buffers.cu) */

/* ------------------------------------------------------------------------------------------------ */
/* host side: launches                                                                                */

/* dual (> 0): also the dual launch's second cuts (GDN_DUAL_ZB segments, or half as many where more than wave
 * have work; bps column blocks each) and the device's choice (need: blocks of the second configuration that make
 * it the one to run); then the first configuration's cuts are written even for dseg == 1 */
static void gdn_index(const GdnBufs *b, const int32_t *doc_pos, int64_t T, int dseg = 1, int dual = 0, int bps = 0,
                      int64_t need = 0, int wave = 0) {
    const int nb = (int)((T + 1023) / 1024);
    cudaStream_t st = cuda_stream();
    gdn_index_count_kernel<<<nb, 1024, 0, st>>>(b->blk, doc_pos, T);
    CUDA_LAUNCH_CHECK();
    gdn_index_scan_kernel<<<1, 1024, 0, st>>>(b->blk, b->meta, b->starts, nb, T);
    CUDA_LAUNCH_CHECK();
    gdn_index_write_kernel<<<nb, 1024, 0, st>>>(b->starts, b->meta, b->blk, doc_pos, T);
    CUDA_LAUNCH_CHECK();
    gdn_index_info_kernel<<<(unsigned)((T + 255) / 256 < 1024 ? (T + 255) / 256 : 1024), 256, 0, st>>>(
        b->info, b->starts, b->meta, doc_pos, T);
    CUDA_LAUNCH_CHECK();
    if (dseg > 1 || dual) {
        RS_CHECK(dseg <= GDN_DSEG_MAX, "gdn: %d document segments (at most %d)", dseg, GDN_DSEG_MAX);
        gdn_index_cuts_kernel<<<1, 1024, 0, st>>>(b->cuts, b->info, b->meta, dseg > 1 ? dseg : 1, NULL, 0, 0, 0);
        CUDA_LAUNCH_CHECK();
    }
    if (dual) {
        gdn_index_cuts_kernel<<<1, 1024, 0, st>>>(b->cuts + GDN_CUTS_B, b->info, b->meta, GDN_DUAL_ZB,
                                                  b->cuts + GDN_CUTS_PICK, bps, need, wave);
        CUDA_LAUNCH_CHECK();
    }
}

static int gdn_max_smem(void) {
    static int max_smem;
    if (!max_smem) {
        int dev;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    }
    return max_smem;
}

/* raise a kernel's dynamic shared-memory limit to `bytes` (checked against the device's) */
template <class K> static void gdn_smem_attr(K kernel, size_t bytes, const char *name) {
    RS_CHECK((int)bytes <= gdn_max_smem(), "gdn: %s needs %zu bytes of shared memory, the device allows %d", name,
             bytes, gdn_max_smem());
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

/* the per-chunk kernels that pack several blocks per SM (prep 4 x 55 KB, wy_bwd and dqkwg 2 x 110-113 KB) need the
 * largest shared-memory carveout (228 KB): asked for, not left to the driver's choice */
template <class K> static void gdn_carveout_max(K kernel) {
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
}

/* grid.x of the per-chunk kernels: one block per 64 tokens, the rest (more chunks when documents
 * are short) by the grid-stride loop */
static int gdn_chunk_grid(int64_t T) { return (int)((T + GDN_C - 1) / GDN_C > 0 ? (T + GDN_C - 1) / GDN_C : 1); }

template <int DK, int DV>
static void gdn_launch_prep(const GdnBufs *b, bool with_U, const bf16 *k, const bf16 *v, const float *g,
                               const float *beta, int mode, int64_t T, int nk, int nv, int ldq, int ldv) {
    const size_t sm = GdnPrepSmem<DK, DV>(NULL).bytes;
    gdn_smem_attr(gdn_prep_kernel<DK, DV>, sm, "prep");
    gdn_carveout_max(gdn_prep_kernel<DK, DV>);
    gdn_prep_kernel<DK, DV><<<dim3(gdn_chunk_grid(T), nv), GDN_PREP_THREADS, sm, cuda_stream()>>>(
        b->W, with_U ? b->U : NULL, b->G2, with_U ? b->Tb : NULL, k, v, g, beta, b->starts, b->meta, mode, nk, nv,
        ldq, ldv);
    CUDA_LAUNCH_CHECK();
}

/* wy_bwd: SOLVE solves for Tinv again, else reads b->Tb (the kept Tinv) */
template <int DK, int DV, bool SOLVE>
static void gdn_launch_wy_bwd(const GdnBufs *b, bf16 *dk, bf16 *dv, float *dg, float *dbeta, const bf16 *dw,
                              const float *dgp2, const bf16 *k, const bf16 *v, const float *beta, int64_t T, int nk,
                              int nv, int ldq, int ldv) {
    const size_t sm = GdnWySmem<DK, DV, SOLVE>(NULL).bytes;
    gdn_smem_attr(gdn_wy_backward_kernel<DK, DV, SOLVE>, sm, "wy_bwd");
    gdn_carveout_max(gdn_wy_backward_kernel<DK, DV, SOLVE>);
    gdn_wy_backward_kernel<DK, DV, SOLVE><<<dim3(gdn_chunk_grid(T), nv), GDN_WY_THREADS, sm, cuda_stream()>>>(
        b->dkv, nv == nk ? dk : NULL, dv, dg, dbeta, dw, b->dv2, b->dgp, dgp2, k, v, b->Tb, b->G2, beta, b->starts,
        b->meta, nk, nv, ldq, ldv);
    CUDA_LAUNCH_CHECK();
}

/* dv_loc into dst */
template <int DK, int DV>
static void gdn_launch_dvlocal(const GdnBufs *b, bf16 *dst, const bf16 *q, const bf16 *k, const bf16 *dout, int mode,
                               int64_t T, int nk, int nv, int ldq, int ldo, float scale) {
    const size_t sm = GdnOutSmem<DK, DV>(NULL, false).bytes;
    gdn_smem_attr(gdn_dvlocal_kernel<DK, DV>, sm, "dvlocal");
    gdn_dvlocal_kernel<DK, DV><<<dim3(gdn_chunk_grid(T), nv, 1), GDN_OUT_THREADS, sm, cuda_stream()>>>(
        dst, q, k, dout, b->G2, b->starts, b->meta, mode, nk, nv, DV, ldq, ldo, scale);
    CUDA_LAUNCH_CHECK();
}

/* ------------------------------------------------------------------------------------------------ */
/* host side: plan (segments, stages, column block), segmented passes                                 */

/* the running entry's plan.sfwd / plan.sbwd, for gdn_state_fwd_launch / gdn_state_bwd_launch (set with the
 * plan; one compute stream) */
static int gdn_sfwd_cur, gdn_sbwd_cur;
static int gdn_sfbv_cur;   /* the running entry's plan.sfbv: columns per block of the wgmma forward pass (0: by
                              the blocks with work) */
static int gdn_sbcols_cur; /* the running entry's plan.sbcols: columns per block of the wgmma backward pass */

/* the running entry's switches from its plan (every entry sets them before its launches) */
static void gdn_cur_set(const GdnPlan &pl) {
    gdn_sfwd_cur = pl.sfwd;
    gdn_sfbv_cur = pl.sfbv;
    gdn_sbwd_cur = pl.sbwd;
    gdn_sbcols_cur = pl.sbcols;
}

/* the mma.sync state pass instantiation for a run-time (bv, nst) */
#define GDN_STATE_BVNST(pl, FN, ...)                                                     \
    do {                                                                              \
        if ((pl).bv == 64) FN<DK, 64, 2>(__VA_ARGS__);                                \
        else if ((pl).bv == 32 && (pl).nst == 3) FN<DK, 32, 3>(__VA_ARGS__);          \
        else if ((pl).bv == 32) FN<DK, 32, 2>(__VA_ARGS__);                           \
        else if ((pl).nst == 3) FN<DK, 16, 3>(__VA_ARGS__);                           \
        else FN<DK, 16, 2>(__VA_ARGS__);                                              \
    } while (0)

static void gdn_affine_launch(float *S_out, const float *M, const float *S_in, const float *H, int nv, int dk, int dv,
                              cudaStream_t st) {
    const dim3 grid((dv + 31) / 32, (dk + 31) / 32, nv);
    gdn_state_affine_kernel<<<grid, dim3(32, 8), 0, st>>>(S_out, M, S_in, H, 0, dk, dv);
    CUDA_LAUNCH_CHECK();
}

typedef CUresult (*GdnEncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                   const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* a 2-d bf16 tensor map over `rows` rows of `cols` columns from `base` (row stride ld elements): boxes
 * of box_cols columns (64: 128 bytes, 128-byte swizzle; 32: 64 bytes, 64-byte swizzle; 16: 32 bytes, 32-byte
 * swizzle) by box_rows rows;
 * rows past the end read as zeros and are not written. base NULL: a zeroed map, never used. */
static void gdn_tmap(CUtensorMap *m, const void *base, int64_t rows, int64_t cols, int64_t ld, int box_rows,
                     int box_cols = 64) {
    RS_CHECK(box_cols == 64 || box_cols == 32 || box_cols == 16, "gdn: tensor map boxes of %d columns (64, 32, 16)",
             box_cols);
    static GdnEncodeTiled encode;
    memset(m, 0, sizeof *m);
    if (!base) return;
    if (!encode) {
        cudaDriverEntryPointQueryResult q;
        CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000,
                                                    cudaEnableDefault, &q));
        RS_CHECK(q == cudaDriverEntryPointSuccess && encode, "gdn: cuTensorMapEncodeTiled not found");
    }
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)ld * 2};
    const cuuint32_t box[2] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows}, estr[2] = {1, 1};
    const CUresult r = encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, dims, strides, box, estr,
                              CU_TENSOR_MAP_INTERLEAVE_NONE,
                              box_cols == 64   ? CU_TENSOR_MAP_SWIZZLE_128B
                              : box_cols == 32 ? CU_TENSOR_MAP_SWIZZLE_64B
                                               : CU_TENSOR_MAP_SWIZZLE_32B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    RS_CHECK(r == CUDA_SUCCESS, "gdn: cuTensorMapEncodeTiled failed (%d): rows %lld cols %lld ld %lld", (int)r,
             (long long)rows, (long long)cols, (long long)ld);
}

/* the tensor maps of a wgmma forward pass, BV state columns per U tile and OB per h and vn store: 32 and 32
 * (gdn/state_forward_wgmma.cuh), or 64 and 16, one warp's (gdn/state_forward_regs.cuh) */
template <int DK, int BV, int OB = BV>
static GdnWgMaps gdn_wg_maps(const GdnBufs *b, bf16 *hs, bf16 *vn, const bf16 *k, int nk, int nv, int dv, int ldq) {
    GdnWgMaps tm;
    const int64_t T = b->T, ns = (T + GDN_C - 1) / GDN_C + 1;
    RS_CHECK(ns * nv * DK < INT_MAX, "gdn: state_fwd_wg: %lld h rows exceed the TMA coordinates",
             (long long)(ns * nv * DK));
    gdn_tmap(&tm.w, b->W, T, (int64_t)nv * DK, (int64_t)nv * DK, GDN_C);
    gdn_tmap(&tm.k, k, T, (int64_t)nk * DK, ldq, GDN_C);
    gdn_tmap(&tm.u, b->U, T, (int64_t)nv * dv, (int64_t)nv * dv, GDN_C, BV);
    gdn_tmap(&tm.h, hs, ns * nv * DK, dv, dv, DK, OB);
    gdn_tmap(&tm.vn, vn, T, (int64_t)nv * dv, (int64_t)nv * dv, GDN_C, OB);
    return tm;
}

/* the wgmma forward pass in 32-column blocks (gdn/state_forward_wgmma.cuh), gdn_sfwd_cur's stages (2, 3); need
 * > 0: both widths are launched, the device picks */
template <int DK>
static void gdn_wg_fwd_launch(const GdnBufs *b, bf16 *hs, bf16 *vn, const GdnSeg &sg, int nz, int ncol, const bf16 *k,
                              int mode, int nk, int nv, int dv, int ldq, cudaStream_t st, long long *tp,
                              int64_t need = 0) {
    RS_CHECK(ncol % GDN_WG_BV == 0 && dv % GDN_WG_BV == 0,
             "gdn: state_fwd_wg in %d-column blocks: %d columns, dim_v %d", (int)GDN_WG_BV, ncol, dv);
    const GdnWgMaps tm = gdn_wg_maps<DK, GDN_WG_BV>(b, hs, vn, k, nk, nv, dv, ldq);
    auto run = [&](auto kernel, int bytes) {
        gdn_smem_attr(kernel, bytes, "state_fwd_wg");
        kernel<<<dim3(ncol / GDN_WG_BV, nv, nz), GDN_THREADS, bytes, st>>>(hs, vn, sg, tm, b->G2, b->info, b->meta,
                                                                            mode, nk, nv, dv, tp, (int)need);
        CUDA_LAUNCH_CHECK();
    };
    if (gdn_sfwd_cur == 3) run(gdn_state_forward_wgmma_kernel<DK, 3>, GdnStateFwdSmemWg<DK, 3>::BYTES);
    else run(gdn_state_forward_wgmma_kernel<DK, 2>, GdnStateFwdSmemWg<DK, 2>::BYTES);
}

/* the wgmma forward pass with the state in registers (gdn/state_forward_regs.cuh), NWG warpgroups of 64 columns
 * per block, gdn_sfwd_cur's stages (2, 3; 2 at two warpgroups); need > 0: both widths are launched, the device
 * picks */
template <int DK, int NWG>
static void gdn_rg_fwd_launch(const GdnBufs *b, bf16 *hs, bf16 *vn, const GdnSeg &sg, int nz, int ncol, const bf16 *k,
                              int mode, int nk, int nv, int dv, int ldq, cudaStream_t st, long long *tp,
                              int64_t need = 0) {
    constexpr int BC = 64 * NWG; /* columns per block */
    RS_CHECK(ncol % BC == 0 && dv % BC == 0, "gdn: state_fwd_rg in %d-column blocks: %d columns, dim_v %d", BC, ncol,
             dv);
    const GdnWgMaps tm = gdn_wg_maps<DK, 64, 16>(b, hs, vn, k, nk, nv, dv, ldq);
    auto run = [&](auto kernel, int bytes) {
        gdn_smem_attr(kernel, bytes, "state_fwd_rg");
        kernel<<<dim3(ncol / BC, nv, nz), GDN_THREADS * NWG, bytes, st>>>(hs, vn, sg, tm, b->G2, b->info, b->meta, mode,
                                                                          nk, nv, dv, tp, (int)need);
        CUDA_LAUNCH_CHECK();
    };
    if constexpr (NWG > 1) run(gdn_state_forward_regs_kernel<DK, 2, NWG>, GdnStateFwdSmemRg<DK, 2, NWG>::BYTES);
    else if (gdn_sfwd_cur == 3) run(gdn_state_forward_regs_kernel<DK, 3, 1>, GdnStateFwdSmemRg<DK, 3, 1>::BYTES);
    else run(gdn_state_forward_regs_kernel<DK, 2, 1>, GdnStateFwdSmemRg<DK, 2, 1>::BYTES);
}

template <int DK, int BV, int NST>
static void gdn_state_fwd_launch(const GdnBufs *b, bf16 *hs, bf16 *vn, GdnSeg sg, int nz, int ncol, const bf16 *k,
                              int mode, int nk, int nv, int dv, int ldq, cudaStream_t st, long long *tp) {
    if (gdn_sfwd_cur) { /* the wgmma passes: gdn_sfbv_cur columns per block (32; 64 or 128: the state in registers,
                           one or two warpgroups; 0: 32 or 64 by the blocks with work) */
        int fb = gdn_sfbv_cur;
        if (fb == 0 && gdn_sfwd_cur == 3) fb = 32; /* the automatic wide form runs 2 stages */
        if (fb == 0 && sg.cuts) { /* document segments: the device counts those with work, one form runs */
            const int64_t need = gdn_wide_need();
            gdn_wg_fwd_launch<DK>(b, hs, vn, sg, nz, ncol, k, mode, nk, nv, dv, ldq, st, tp, need);
            gdn_rg_fwd_launch<DK, 1>(b, hs, vn, sg, nz, ncol, k, mode, nk, nv, dv, ldq, st, tp, need);
            return;
        }
        if (fb == 0) fb = gdn_wide_pick((int64_t)(ncol / 64) * nv * nz) ? 64 : 32;
        if (fb == 128) gdn_rg_fwd_launch<DK, 2>(b, hs, vn, sg, nz, ncol, k, mode, nk, nv, dv, ldq, st, tp);
        else if (fb == 64) gdn_rg_fwd_launch<DK, 1>(b, hs, vn, sg, nz, ncol, k, mode, nk, nv, dv, ldq, st, tp);
        else gdn_wg_fwd_launch<DK>(b, hs, vn, sg, nz, ncol, k, mode, nk, nv, dv, ldq, st, tp);
        return;
    }
    const size_t sm = GdnStateFwdSmem<DK, BV, NST>(NULL).bytes;
    gdn_smem_attr(gdn_state_forward_kernel<DK, BV, NST>, sm, "state_fwd");
    gdn_state_forward_kernel<DK, BV, NST><<<dim3(ncol / BV, nv, nz), GDN_THREADS, sm, st>>>(
        hs, vn, sg, b->W, b->U, k, b->G2, b->info, b->meta, mode, nk, nv, dv, ldq, tp);
    CUDA_LAUNCH_CHECK();
}

/* the tensor maps of the wgmma backward pass (gdn/state_backward_regs.cuh): dh and dv2 stored 16 columns (one
 * warp's) at a time */
template <int DK>
static GdnWgBwdMaps gdn_wg_bwd_maps(const GdnBufs *b, bf16 *dhs, bf16 *dv2, const bf16 *q, const bf16 *k,
                                    const bf16 *dvl, const bf16 *dout, int64_t T, int nk, int nv, int dv, int ldq,
                                    int ldo) {
    GdnWgBwdMaps tm;
    const int64_t ns = (T + GDN_C - 1) / GDN_C + 1;
    RS_CHECK(ns * nv * DK < INT_MAX, "gdn: state_bwd_wg: %lld dh rows exceed the TMA coordinates",
             (long long)(ns * nv * DK));
    gdn_tmap(&tm.q, q, T, (int64_t)nk * DK, ldq, GDN_C);
    gdn_tmap(&tm.k, k, T, (int64_t)nk * DK, ldq, GDN_C);
    gdn_tmap(&tm.w, b->W, T, (int64_t)nv * DK, (int64_t)nv * DK, GDN_C);
    gdn_tmap(&tm.dO, dout, T, (int64_t)nv * dv, ldo, GDN_C);
    gdn_tmap(&tm.dl, dvl, T, (int64_t)nv * dv, (int64_t)nv * dv, GDN_C);
    gdn_tmap(&tm.dh, dhs, ns * nv * DK, dv, dv, DK, 16);
    gdn_tmap(&tm.dv2, dv2, T, (int64_t)nv * dv, (int64_t)nv * dv, GDN_C, 16);
    return tm;
}

template <int DK, int BV, int NST>
static void gdn_state_bwd_launch(const GdnBufs *b, bf16 *dhs, bf16 *dv2, GdnSeg sg, int nz, int ncol, const bf16 *q,
                              const bf16 *k, const bf16 *dvl, const bf16 *dout, int mode, int64_t T, int nk, int nv,
                              int dv, int ldq, int ldo, float scale, cudaStream_t st, long long *tp) {
    if (gdn_sbwd_cur) { /* the wgmma pass: 64 columns per warpgroup, one or two warpgroups per block */
        RS_CHECK(ncol % 64 == 0, "gdn: state_bwd_wg needs columns in 64s, has %d", ncol);
        const GdnWgBwdMaps tm = gdn_wg_bwd_maps<DK>(b, dhs, dv2, q, k, dvl, dout, T, nk, nv, dv, ldq, ldo);
        auto run = [&](auto kernel, int nwg, int bytes, int64_t need) {
            RS_CHECK(ncol % (64 * nwg) == 0 && dv % (64 * nwg) == 0,
                     "gdn: state_bwd_wg in %d-column blocks: %d columns, dim_v %d", 64 * nwg, ncol, dv);
            gdn_smem_attr(kernel, bytes, "state_bwd_wg");
            kernel<<<dim3(ncol / (64 * nwg), nv, nz), GDN_THREADS * nwg, bytes, st>>>(
                dhs, dv2, sg, tm, b->G2, b->info, b->meta, mode, T, nk, nv, dv, scale, tp, (int)need);
            CUDA_LAUNCH_CHECK();
        };
        auto one = [&](int64_t need) {
            run(gdn_state_backward_regs_kernel<DK, 2, 1>, 1, GdnStateBwdSmemRg<DK, 2, 1>::BYTES, need);
        };
        auto two = [&](int64_t need) { /* plan keeps one warpgroup where dim_k is 64: no kernel is built for it */
            if constexpr (DK % 128 != 0) RS_FATAL("gdn: state_bwd_wg with two warpgroups needs dim_k in 128s, has %d", DK);
            else run(gdn_state_backward_regs_kernel<DK, 2, 2>, 2, GdnStateBwdSmemRg<DK, 2, 2>::BYTES, need);
        };
        if (!gdn_sbcols_cur && sg.cuts) { /* document segments: the device counts those with work, one runs */
            one(gdn_wide_need());
            two(gdn_wide_need());
        } else if (gdn_sbcols_cur == 128 || (!gdn_sbcols_cur && gdn_wide_pick((int64_t)(ncol / 64) * nv * nz))) two(0);
        else one(0);
        return;
    }
    const size_t sm = GdnStateBwdSmem<DK, BV, NST>(NULL).bytes;
    gdn_smem_attr(gdn_state_backward_kernel<DK, BV, NST>, sm, "state_bwd");
    gdn_state_backward_kernel<DK, BV, NST><<<dim3(ncol / BV, nv, nz), GDN_THREADS, sm, st>>>(
        dhs, dv2, sg, q, k, b->W, dvl, dout, b->G2, b->info, b->meta, mode, T, nk, nv, dv, ldq, ldo, scale, tp);
    CUDA_LAUNCH_CHECK();
}

/* the forward state pass over the chunks of `mode` from S0 in nseg segments: h, vn (NULL: not
 * stored), S_final (NULL: not written); with M_out (nseg == 1 only) the transition columns too */
template <int DK, int BV, int NST>
static void gdn_state_fwd_pass(const GdnBufs *b, float *segE, float *segH, float *segM, int nseg, int dseg, bf16 *hs,
                             bf16 *vn, float *S_final, float *M_out, const float *S0, const bf16 *k, int mode, int nk,
                             int nv, int dv, int ldq, cudaStream_t st, long long *tp, int want = -1) {
    const int64_t nsz = (int64_t)nv * DK * dv, nmz = (int64_t)nv * DK * DK;
    RS_CHECK(nseg == 1 || !M_out, "gdn: a segmented transition pass");
    if (dseg > 1 || want >= 0) { /* document segments side by side (want >= 0: one half of a dual launch) */
        RS_CHECK(nseg == 1 && !M_out && mode == GDN_RANGE_ALL, "gdn: document segments with nseg or M");
        const GdnSeg d = {S0,    NULL, S_final, NULL, NULL, NULL, dseg, 0, -1, b->cuts + (want == 1 ? GDN_CUTS_B : 0),
                          want >= 0 ? b->cuts + GDN_CUTS_PICK : NULL, want};
        gdn_state_fwd_launch<DK, BV, NST>(b, hs, vn, d, dseg, dv, k, mode, nk, nv, dv, ldq, st, tp);
        return;
    }
    if (nseg > 1) { /* phase A, then the fold */
        const GdnSeg a = {S0, NULL, NULL, segE + nsz, segH, segM, nseg, 0, 0, NULL};
        gdn_state_fwd_launch<DK, BV, NST>(b, NULL, NULL, a, nseg - 1, dv + DK, k, mode, nk, nv, dv, ldq, st, NULL);
        for (int p = 1; p <= nseg - 2; p++)
            gdn_affine_launch(segE + (p + 1) * nsz, segM + p * nmz, segE + p * nsz, segH + p * nsz, nv, DK, dv, st);
    }
    const GdnSeg c = {S0, segE, S_final, NULL, NULL, M_out, nseg, 0, -1, NULL};
    gdn_state_fwd_launch<DK, BV, NST>(b, hs, vn, c, nseg, dv + (M_out ? DK : 0), k, mode, nk, nv, dv, ldq, st, tp);
}

/* the reverse state pass over the chunks of `mode` from dS_final in nseg segments: dh, dv2 (NULL:
 * not stored), dS0 (NULL: not written) */
template <int DK, int BV, int NST>
static void gdn_state_bwd_pass(const GdnBufs *b, float *segE, float *segH, float *segM, int nseg, int dseg, bf16 *dhs,
                             bf16 *dv2, float *dS0, const float *dS_final, const bf16 *q, const bf16 *k,
                             const bf16 *dvl, const bf16 *dout, int mode, int64_t T, int nk, int nv, int dv, int ldq,
                             int ldo, float scale, cudaStream_t st, long long *tp, int want = -1) {
    const int64_t nsz = (int64_t)nv * DK * dv, nmz = (int64_t)nv * DK * DK;
    if (dseg > 1 || want >= 0) { /* document segments side by side (want >= 0: one half of a dual launch) */
        RS_CHECK(nseg == 1 && mode == GDN_RANGE_ALL, "gdn: document segments with nseg");
        const GdnSeg d = {dS_final, NULL, dS0, NULL, NULL, NULL, dseg, 0, -1, b->cuts + (want == 1 ? GDN_CUTS_B : 0),
                          want >= 0 ? b->cuts + GDN_CUTS_PICK : NULL, want};
        gdn_state_bwd_launch<DK, BV, NST>(b, dhs, dv2, d, dseg, dv, q, k, dvl, dout, mode, T, nk, nv, dv, ldq,
                                                  ldo, scale, st, tp);
        return;
    }
    if (nseg > 1) { /* phase A on segments nseg-1 .. 1, then the fold */
        const GdnSeg a = {dS_final, NULL, NULL, segE + (nseg - 2) * nsz, segH, segM, nseg, 1, nseg - 1, NULL};
        gdn_state_bwd_launch<DK, BV, NST>(b, NULL, NULL, a, nseg - 1, dv + DK, q, k, dvl, dout, mode, T, nk, nv, dv,
                                            ldq, ldo, scale, st, NULL);
        for (int p = nseg - 2; p >= 1; p--)
            gdn_affine_launch(segE + (p - 1) * nsz, segM + p * nmz, segE + p * nsz, segH + p * nsz, nv, DK, dv, st);
    }
    const GdnSeg c = {dS_final, segE, dS0, NULL, NULL, NULL, nseg, 0, -1, NULL};
    gdn_state_bwd_launch<DK, BV, NST>(b, dhs, dv2, c, nseg, dv, q, k, dvl, dout, mode, T, nk, nv, dv, ldq, ldo,
                                        scale, st, tp);
}

/* The state passes of a forward / backward over all chunks, from the plan: one launch, or the dual
 * launch (pl.dual: the plan's column block and document segments, then 32 columns in GDN_DUAL_ZB
 * document segments, on wgmma (64 columns) with pl.dwg; the blocks of the one the index did not pick
 * exit at once). */

/* the running entry's wgmma switch (gdn_sfwd_cur / gdn_sbwd_cur) set to `on` for one launch of the dual
 * launch's second configuration, back to the entry's value when it goes out of scope */
struct GdnWgScope {
    int *cur, was;
    GdnWgScope(int *c, int on) : cur(c), was(*c) {
        if (on && !*c) *c = on;
    }
    ~GdnWgScope() { *cur = was; }
};

template <int DK>
static void gdn_pass_fwd(const GdnPlan &pl, const GdnBufs *b, float *segE, float *segH, float *segM, bf16 *hs,
                            bf16 *vn, float *S_final, const float *S0, const bf16 *k, int nk, int nv, int dv, int ldq,
                            cudaStream_t st, long long *tp) {
    if (!pl.dual) {
        GDN_STATE_BVNST(pl, gdn_state_fwd_pass, b, segE, segH, segM, pl.nseg_f, pl.dseg, hs, vn, S_final, NULL, S0, k,
                     GDN_RANGE_ALL, nk, nv, dv, ldq, st, tp);
        return;
    }
    GdnPlan pb = pl;
    pb.bv = 32;
    GDN_STATE_BVNST(pl, gdn_state_fwd_pass, b, NULL, NULL, NULL, 1, pl.dseg, hs, vn, S_final, NULL, S0, k, GDN_RANGE_ALL,
                 nk, nv, dv, ldq, st, tp, 0);
    const GdnWgScope wg(&gdn_sfwd_cur, pl.dwg ? 2 : 0);
    GDN_STATE_BVNST(pb, gdn_state_fwd_pass, b, NULL, NULL, NULL, 1, GDN_DUAL_ZB, hs, vn, S_final, NULL, S0, k,
                 GDN_RANGE_ALL, nk, nv, dv, ldq, st, tp, 1);
}

template <int DK>
static void gdn_pass_bwd(const GdnPlan &pl, const GdnBufs *b, float *segE, float *segH, float *segM, bf16 *dhs,
                            bf16 *dv2, float *dS0, const float *dS_final, const bf16 *q, const bf16 *k,
                            const bf16 *dvl, const bf16 *dout, int64_t T, int nk, int nv, int dv, int ldq, int ldo,
                            float scale, cudaStream_t st, long long *tp) {
    if (!pl.dual) {
        GDN_STATE_BVNST(pl, gdn_state_bwd_pass, b, segE, segH, segM, pl.nseg_b, pl.dseg, dhs, dv2, dS0, dS_final, q, k, dvl,
                     dout, GDN_RANGE_ALL, T, nk, nv, dv, ldq, ldo, scale, st, tp);
        return;
    }
    GdnPlan pb = pl;
    pb.bv = 32;
    GDN_STATE_BVNST(pl, gdn_state_bwd_pass, b, NULL, NULL, NULL, 1, pl.dseg, dhs, dv2, dS0, dS_final, q, k, dvl, dout,
                 GDN_RANGE_ALL, T, nk, nv, dv, ldq, ldo, scale, st, tp, 0);
    const GdnWgScope wg(&gdn_sbwd_cur, pl.dwg);
    GDN_STATE_BVNST(pb, gdn_state_bwd_pass, b, NULL, NULL, NULL, 1, GDN_DUAL_ZB, dhs, dv2, dS0, dS_final, q, k, dvl, dout,
                 GDN_RANGE_ALL, T, nk, nv, dv, ldq, ldo, scale, st, tp, 1);
}

/* the index of a forward / backward under the plan (the dual launch's cuts and choice with it) */
static void gdn_index_plan(const GdnBufs *b, const GdnPlan &pl, const int32_t *doc_pos, int64_t T, int nv, int dv) {
    gdn_index(b, doc_pos, T, pl.dseg, pl.dual, nv * dv / 32, pl.dual_need, pl.dual_wave);
}

/* o NULL: the state pass alone (kept with states: its h, vn stay there); states_in: the output alone, from
 * the prep and states in kept (a forward with o NULL on the same inputs wrote them) */
template <int DK, int DV>
static void gdn_forward_run(const GdnPlan &pl, bf16 *o, float *S_final, const bf16 *q, const bf16 *k, const bf16 *v,
                           const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T,
                           int nk, int nv, int ldq, int ldv, int ldo, void *kept, int kept_kind, int prep_in,
                           int states_in) {
    const float scale = (float)(1.0 / sqrt((double)DK));
    cudaStream_t st = cuda_stream();
    GdnBufs b = gdn_buffers(GDN_WS_FORWARD, T, nv, DK, DV, pl.nseg_f, kept && (kept_kind & GDN_KEPT_STATES));
    /* prep writes W, U, G2 (Tinv, and the state pass h, vn, as kept_kind asks) where the backward finds them;
       prep_in: gdn_prep_run wrote the prep there already */
    if (kept) gdn_kept_carve(&b, kept, T, nv, DK, DV, kept_kind);
    gdn_prof_start(pl.prof);
    gdn_index_plan(&b, pl, doc_pos, T, nv, DV);
    gdn_prof_mark("index");
    if (!prep_in && !states_in) gdn_launch_prep<DK, DV>(&b, true, k, v, g, beta, GDN_RANGE_ALL, T, nk, nv, ldq, ldv);
    gdn_prof_mark("prep");
    if (!states_in) {
        gdn_pass_fwd<DK>(pl, &b, b.segE, b.segH, b.segM, b.hs, b.vn, S_final, S0, k, nk, nv, DV, ldq, st, pl.tp);
        gdn_prof_mark(gdn_sfwd_cur ? "state_fwd_wg" : "state_fwd");
    }
    if (!o) {
        gdn_prof_end("forward state pass", T, nv);
        return;
    }
    const size_t sm = GdnOutSmem<DK, DV>(NULL, true).bytes;
    gdn_smem_attr(gdn_output_kernel<DK, DV>, sm, "output");
    gdn_output_kernel<DK, DV><<<dim3(gdn_chunk_grid(T), nv, 1), GDN_OUT_THREADS, sm, st>>>(
        o, q, k, b.vn, b.hs, b.G2, doc_pos, b.starts, b.meta, nk, nv, DV, ldq, ldo, scale);
    CUDA_LAUNCH_CHECK();
    gdn_prof_mark("output");
    if (pl.prof)
        printf("gdn plan: nseg %d, dseg %d, bv %d, nst %d, dual %d\n", pl.nseg_f, pl.dseg, pl.bv, pl.nst, pl.dual);
    gdn_prof_end("forward", T, nv);
    gdn_tp_print(pl, 0);
}

/* stage 0: the whole backward; GDN_BWD_DOUT / _STATE / _GRADS: that stage alone, what it carries in dkept
 * (gdn_dkept_carve; kept with states required) */
template <int DK, int DV>
static void gdn_backward_run(const GdnPlan &pl, int stage, void *dkept, bf16 *dq, bf16 *dk, bf16 *dv, float *dg,
                            float *dbeta, float *dS0, const bf16 *dout, const float *dS_final, const bf16 *q,
                            const bf16 *k, const bf16 *v, const float *g, const float *beta, const float *S0,
                            const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq, int ldv, int ldo,
                            const void *kept, int kept_kind) {
    static_assert(DV <= 2 * DK, "gdn: dv_loc (bf16, dv) lives in dqv (fp32, dk)");
    const float scale = (float)(1.0 / sqrt((double)DK));
    cudaStream_t st = cuda_stream();
    const int nseg = pl.nseg_f > pl.nseg_b ? pl.nseg_f : pl.nseg_b;
    const int states = kept && (kept_kind & GDN_KEPT_STATES); /* h, vn from the forward: no state_fwd recompute */
    GdnBufs b = gdn_buffers(GDN_WS_BACKWARD, T, nv, DK, DV, nseg, states);
    bf16 *dvl = (bf16 *)b.dqv; /* dv_loc until dqkwg writes dqv (the whole backward) */
    bf16 *dw = b.W;            /* the workspace's W: dw once the state passes are done with W */
    if (kept) gdn_kept_carve(&b, (void *)kept, T, nv, DK, DV, kept_kind); /* the forward's: read only */
    if (stage) gdn_dkept_carve(&b, &dvl, dkept, T, nv, DK, DV);                  /* dv_loc, dh, dv2 */
    gdn_prof_start(pl.prof);
    gdn_index_plan(&b, pl, doc_pos, T, nv, DV);
    gdn_prof_mark("index");
    if (!kept) gdn_launch_prep<DK, DV>(&b, true, k, v, g, beta, GDN_RANGE_ALL, T, nk, nv, ldq, ldv);
    gdn_prof_mark("prep");
    if (!states) { /* the forward's h, vn again (kept: the forward's own) */
        gdn_pass_fwd<DK>(pl, &b, b.segE, b.segH, b.segM, b.hs, b.vn, NULL, S0, k, nk, nv, DV, ldq, st, pl.tp);
        gdn_prof_mark(gdn_sfwd_cur ? "state_fwd_wg" : "state_fwd");
    }
    if (!stage || stage == GDN_BWD_DOUT) {
        gdn_launch_dvlocal<DK, DV>(&b, dvl, q, k, dout, GDN_RANGE_ALL, T, nk, nv, ldq, ldo, scale);
        gdn_prof_mark("dvlocal");
    }
    if (!stage || stage == GDN_BWD_STATE) {
        gdn_pass_bwd<DK>(pl, &b, b.segE2, b.segH2, b.segM2, b.dhs, b.dv2, dS0, dS_final, q, k, dvl, dout, T, nk, nv,
                         DV, ldq, ldo, scale, st, pl.tp ? pl.tp + GDN_TP_SLOTS : NULL);
        gdn_prof_mark(gdn_sbwd_cur ? "state_bwd_wg" : "state_bwd");
    }
    if (stage && stage != GDN_BWD_GRADS) {
        gdn_prof_end(stage == GDN_BWD_DOUT ? "backward dout stage" : "backward state stage", T, nv);
        return;
    }
    const float *dgp2 = b.dgp + (size_t)T * nv;
    {
        const size_t sm = GdnDqkwgSmem<DK, DV>(NULL).bytes;
        gdn_smem_attr(gdn_dqkwg_kernel<DK, DV>, sm, "dqkwg");
        gdn_carveout_max(gdn_dqkwg_kernel<DK, DV>);
        gdn_dqkwg_kernel<DK, DV><<<dim3(2 * gdn_chunk_grid(T), nv), GDN_DQKWG_THREADS, sm, st>>>(
            b.dqv, nv == nk ? dq : NULL, b.dkv, dw, b.dgp, b.dgp + (size_t)T * nv, q, k, b.vn, dout, b.dv2,
            b.hs, b.dhs, b.G2, doc_pos, b.starts, b.meta, T, nk, nv, ldq, ldo, scale);
        CUDA_LAUNCH_CHECK();
    }
    gdn_prof_mark("dqkwg");
    if (b.Tb) /* the kept Tinv (GDN_KEPT_TINV) */
        gdn_launch_wy_bwd<DK, DV, false>(&b, dk, dv, dg, dbeta, dw, dgp2, k, v, beta, T, nk, nv, ldq, ldv);
    else
        gdn_launch_wy_bwd<DK, DV, true>(&b, dk, dv, dg, dbeta, dw, dgp2, k, v, beta, T, nk, nv, ldq, ldv);
    gdn_prof_mark(b.Tb ? "wy_bwd" : "wy_bwd_solve");
    if (nv != nk) {
        const int64_t n = T * nk * (DK / 2);
        gdn_group_reduce_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(dq, dk, b.dqv, b.dkv, T, nk, nv, DK,
                                                                             ldq);
        CUDA_LAUNCH_CHECK();
        gdn_prof_mark("group_reduce");
    }
    if (pl.prof)
        printf("gdn plan: nseg fwd %d bwd %d, dseg %d, bv %d, nst %d, dual %d\n", pl.nseg_f, pl.nseg_b, pl.dseg, pl.bv,
               pl.nst, pl.dual);
    gdn_prof_end("backward", T, nv);
    gdn_tp_print(pl, 1);
}

/* kept's W, U, G2 (and Tinv; gdn_kept_carve) = the prep of every chunk: the bytes gdn_forward_run writes there */
template <int DK, int DV>
static void gdn_prep_run(void *kept, const bf16 *k, const bf16 *v, const float *g, const float *beta,
                         const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq, int ldv, int kept_kind) {
    GdnBufs b = gdn_buffers(GDN_WS_TRANSITION, T, nv, DK, DV); /* the index; the prep goes to kept */
    gdn_kept_carve(&b, kept, T, nv, DK, DV, kept_kind);
    gdn_index(&b, doc_pos, T);
    gdn_launch_prep<DK, DV>(&b, true, k, v, g, beta, GDN_RANGE_ALL, T, nk, nv, ldq, ldv);
}

/* kept (not NULL): W, U, G2 from it (gdn_prep_run's or the forward's), the chunks from the last reset read
 * as the prep below would write them */
template <int DK, int DV>
static void gdn_transition_run(const GdnPlan &pl, float *M, float *H, const bf16 *k, const bf16 *v, const float *g,
                              const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq, int ldv,
                              const void *kept, int kept_kind) {
    GdnBufs b = gdn_buffers(GDN_WS_TRANSITION, T, nv, DK, DV);
    if (kept) gdn_kept_carve(&b, (void *)kept, T, nv, DK, DV, kept_kind); /* read only */
    gdn_index(&b, doc_pos, T);
    if (!kept) gdn_launch_prep<DK, DV>(&b, true, k, v, g, beta, GDN_RANGE_FROM_LAST_RESET, T, nk, nv, ldq, ldv);
    GDN_STATE_BVNST(pl, gdn_state_fwd_pass, &b, NULL, NULL, NULL, 1, 1, NULL, NULL, H, M, NULL, k,
                 GDN_RANGE_FROM_LAST_RESET, nk, nv, DV, ldq, cuda_stream(), pl.tp);
}

/* kept (not NULL): W and G2 from it (the forward's or gdn_prep_run's; U stays the workspace's: dvlocal writes
 * there). A pieced kept buffer (R: the piece rows, T > R) has each piece's W, G2 apart: they are copied into
 * the workspace's, where they are the bytes the prep below would write for every chunk before the first
 * document start (those chunks start at multiples of 64 from token 0, as each piece's do) */
template <int DK, int DV>
static void gdn_dstate_run(const GdnPlan &pl, float *dS0, const bf16 *dout, const bf16 *q, const bf16 *k,
                          const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv,
                          int ldq, int ldo, const void *kept, int kept_kind, int64_t R, const size_t *at) {
    const float scale = (float)(1.0 / sqrt((double)DK));
    GdnBufs b = gdn_buffers(GDN_WS_DSTATE, T, nv, DK, DV);
    gdn_index(&b, doc_pos, T);
    for (int64_t r0 = 0, p = 0; kept && r0 < T; r0 += R, p++) {
        GdnBufs kb = GdnBufs{};
        const int64_t n = T - r0 < R ? T - r0 : R;
        gdn_kept_carve(&kb, (char *)kept + (T > R ? at[p] : 0), n, nv, DK, DV, kept_kind);
        if (T <= R) {
            b.W = kb.W;
            b.G2 = kb.G2;
            break;
        }
        CUDA_CHECK(cudaMemcpyAsync(b.W + r0 * nv * DK, kb.W, (size_t)n * nv * DK * sizeof(bf16),
                                   cudaMemcpyDeviceToDevice, cuda_stream()));
        CUDA_CHECK(cudaMemcpyAsync(b.G2 + r0 * nv, kb.G2, (size_t)n * nv * sizeof(float), cudaMemcpyDeviceToDevice,
                                   cuda_stream()));
    }
    if (!kept)
        gdn_launch_prep<DK, DV>(&b, false, k, NULL, g, beta, GDN_RANGE_BEFORE_FIRST_RESET, T, nk, nv, ldq, 0);
    gdn_launch_dvlocal<DK, DV>(&b, b.U, q, k, dout, GDN_RANGE_BEFORE_FIRST_RESET, T, nk, nv, ldq, ldo, scale);
    GDN_STATE_BVNST(pl, gdn_state_bwd_pass, &b, NULL, NULL, NULL, 1, 1, NULL, NULL, dS0, NULL, q, k, b.U, dout,
                 GDN_RANGE_BEFORE_FIRST_RESET, T, nk, nv, DV, ldq, ldo, scale, cuda_stream(),
                 pl.tp ? pl.tp + GDN_TP_SLOTS : NULL);
}

/* the entries under the plan */
template <int DK, int DV>
static void gdn_forward_impl(bf16 *o, float *S_final, const bf16 *q, const bf16 *k, const bf16 *v, const float *g,
                             const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv,
                             int ldq, int ldv, int ldo, void *kept, int kept_kind, int prep_in, int states_in) {
    const GdnPlan pl = gdn_plan<DK>(T, nv, DV);
    gdn_cur_set(pl);
    gdn_forward_run<DK, DV>(pl, o, S_final, q, k, v, g, beta, S0, doc_pos, T, nk, nv, ldq, ldv, ldo, kept, kept_kind,
                            prep_in, states_in);
}

template <int DK, int DV>
static void gdn_backward_impl(int stage, void *dkept, bf16 *dq, bf16 *dk, bf16 *dv, float *dg, float *dbeta,
                              float *dS0, const bf16 *dout, const float *dS_final, const bf16 *q, const bf16 *k,
                              const bf16 *v, const float *g, const float *beta, const float *S0,
                              const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq, int ldv, int ldo,
                              const void *kept, int kept_kind) {
    const GdnPlan pl = gdn_plan<DK>(T, nv, DV);
    gdn_cur_set(pl);
    gdn_backward_run<DK, DV>(pl, stage, dkept, dq, dk, dv, dg, dbeta, dS0, dout, dS_final, q, k, v, g, beta, S0,
                             doc_pos, T, nk, nv, ldq, ldv, ldo, kept, kept_kind);
}

template <int DK, int DV>
static void gdn_transition_impl(float *M, float *H, const bf16 *k, const bf16 *v, const float *g, const float *beta,
                                const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq, int ldv, const void *kept,
                                int kept_kind) {
    const GdnPlan pl = gdn_plan<DK>(T, nv, DV);
    gdn_cur_set(pl);
    gdn_transition_run<DK, DV>(pl, M, H, k, v, g, beta, doc_pos, T, nk, nv, ldq, ldv, kept, kept_kind);
}

template <int DK, int DV>
static void gdn_dstate_impl(float *dS0, const bf16 *dout, const bf16 *q, const bf16 *k, const float *g,
                            const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq, int ldo,
                            const void *kept, int kept_kind, int64_t R, const size_t *at) {
    const GdnPlan pl = gdn_plan<DK>(T, nv, DV);
    gdn_cur_set(pl);
    gdn_dstate_run<DK, DV>(pl, dS0, dout, q, k, g, beta, doc_pos, T, nk, nv, ldq, ldo, kept, kept_kind, R, at);
}

/* ------------------------------------------------------------------------------------------------ */
/* the Backend entries                                                                                */

static int gdn_aligned(const void *p) { return ((uintptr_t)p & 15) == 0; }

static void gdn_check_args(const char *who, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv,
                           int ldo) {
    RS_CHECK(T >= 0 && T < (int64_t)INT32_MAX - 128, "%s: T = %lld", who, (long long)T);
    RS_CHECK(nk > 0 && nv > 0 && nv % nk == 0, "%s: nk = %d, nv = %d (nv must be a multiple of nk)", who, nk, nv);
    RS_CHECK((dim_k == 64 || dim_k == 128) && (dim_v == 64 || dim_v == 128),
             "%s: dim_k = %d, dim_v = %d: the cuda kernels are built for head dims 64 and 128", who, dim_k, dim_v);
    RS_CHECK((int64_t)ldq >= (int64_t)nk * dim_k && ldq % 8 == 0, "%s: ldq = %d (>= nk*dim_k = %d, multiple of 8)",
             who, ldq, nk * dim_k);
    RS_CHECK(ldv == 0 || ((int64_t)ldv >= (int64_t)nv * dim_v && ldv % 8 == 0),
             "%s: ldv = %d (>= nv*dim_v = %d, multiple of 8)", who, ldv, nv * dim_v);
    RS_CHECK(ldo == 0 || ((int64_t)ldo >= (int64_t)nv * dim_v && ldo % 8 == 0),
             "%s: ldo = %d (>= nv*dim_v = %d, multiple of 8)", who, ldo, nv * dim_v);
}

#define GDN_DISPATCH(dim_k, dim_v, FN, ...)                                          \
    do {                                                                             \
        if (dim_k == 64 && dim_v == 64) FN<64, 64>(__VA_ARGS__);                     \
        else if (dim_k == 64 && dim_v == 128) FN<64, 128>(__VA_ARGS__);              \
        else if (dim_k == 128 && dim_v == 64) FN<128, 64>(__VA_ARGS__);              \
        else FN<128, 128>(__VA_ARGS__);                                              \
    } while (0)

/* fp32 copy on the stream, or zero when src is NULL */
static void gdn_copy_or_zero(float *dst, const float *src, size_t n) {
    if (src) CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, cuda_stream()));
    else CUDA_CHECK(cudaMemsetAsync(dst, 0, n * sizeof(float), cuda_stream()));
}


extern "C" void cuda_gdn_chunk_forward(void *o /* (T,ldo) nv heads of dim_v */,
                                       float *S_final /* (nv,dim_k,dim_v) or NULL */,
                                       const void *q /* (T,ldq) nk heads of dim_k */, const void *k /* (T,ldq) */,
                                       const void *v /* (T,ldv) nv heads of dim_v */, const float *g /* (T,nv) */,
                                       const float *beta /* (T,nv) */, const float *S0 /* (nv,dim_k,dim_v) or NULL */,
                                       const int32_t *doc_pos /* (T) */, int64_t T, int nk, int nv, int dim_k,
                                       int dim_v, int ldq, int ldv, int ldo,
                                       void *kept /* cuda_gdn_kept_bytes(T, nv, dim_k, dim_v,
                                                     kept_flags & GDN_KEPT_STATES), written; or NULL */,
                                       int kept_flags /* GDN_KEPT_STATES | GDN_KEPT_PREP_IN (backend.h) */) {
    gdn_check_args("cuda_gdn_chunk_forward", T, nk, nv, dim_k, dim_v, ldq, ldv, ldo);
    RS_CHECK(gdn_aligned(o) && gdn_aligned(q) && gdn_aligned(k) && gdn_aligned(v),
             "cuda_gdn_chunk_forward: o, q, k, v must be 16-byte aligned");
    const char *fault = gdn_kept_flags_fault(o, S_final, kept, kept_flags);
    RS_CHECK(!fault, "cuda_gdn_chunk_forward: %s (kept_flags = %d)", fault ? fault : "", kept_flags);
    const int kept_kind = kept_flags & (GDN_KEPT_STATES | GDN_KEPT_TINV);
    const int prep_in = (kept_flags & GDN_KEPT_PREP_IN) != 0, states_in = (kept_flags & GDN_KEPT_STATES_IN) != 0;
    if (T == 0) {
        if (S_final) gdn_copy_or_zero(S_final, S0, (size_t)nv * dim_k * dim_v);
        return;
    }
    const int64_t R = gdn_piece_rows();
    if (T <= R) {
        GDN_DISPATCH(dim_k, dim_v, gdn_forward_impl, (bf16 *)o, S_final, (const bf16 *)q, (const bf16 *)k,
                     (const bf16 *)v, g, beta, S0, doc_pos, T, nk, nv, ldq, ldv, ldo, kept, kept_kind, prep_in,
                     states_in);
        return;
    }
    static size_t at[GDN_PIECE_MAX + 1];
    const int64_t np = gdn_pieces("cuda_gdn_chunk_forward", T, R, nv, dim_k, dim_v, kept_kind, at);
    const size_t sn = (size_t)nv * dim_k * dim_v;
    /* the states entering pieces 1..np-1: kept for the backward, or two scratch states taken in turn */
    float *entry = kept ? (float *)((char *)kept + at[np]) : gdn_piece_scratch(2 * sn);
#define GDN_ENTRY(p) (kept ? entry + (size_t)((p) - 1) * sn : entry + (size_t)((p) % 2) * sn)
    for (int64_t p = 0; p < np; p++) {
        const int64_t r0 = p * R, n = T - r0 < R ? T - r0 : R;
        GDN_DISPATCH(dim_k, dim_v, gdn_forward_impl, o ? (bf16 *)o + r0 * ldo : NULL,
                     p == np - 1 || states_in ? S_final : GDN_ENTRY(p + 1), (const bf16 *)q + r0 * ldq,
                     (const bf16 *)k + r0 * ldq, (const bf16 *)v + r0 * ldv, g + r0 * nv, beta + r0 * nv,
                     p == 0 ? S0 : GDN_ENTRY(p), doc_pos + r0, n, nk, nv, ldq, ldv, ldo,
                     kept ? (char *)kept + at[p] : NULL, kept_kind, prep_in, states_in);
    }
#undef GDN_ENTRY
}

/* The backward's pieces (see the header), whole (stage 0) or one stage of backend.h's staged backward (dkept:
 * each piece's gdn_dkept_carve part in order); `who` names the entry */
static void gdn_backward_pieces(const char *who, int stage, void *dkept, void *dq, void *dk, void *dv, float *dg,
                                float *dbeta, float *dS0, const void *dout, const float *dS_final, const void *q,
                                const void *k, const void *v, const float *g, const float *beta, const float *S0,
                                const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq,
                                int ldv, int ldo, const void *kept, int kept_kind) {
    gdn_check_args(who, T, nk, nv, dim_k, dim_v, ldq, ldv, ldo);
    RS_CHECK(gdn_aligned(dq) && gdn_aligned(dk) && gdn_aligned(dv) && gdn_aligned(dout) && gdn_aligned(q) &&
                 gdn_aligned(k) && gdn_aligned(v),
             "%s: dq, dk, dv, dout, q, k, v must be 16-byte aligned", who);
    if (T == 0) {
        if (dS0 && stage != GDN_BWD_DOUT && stage != GDN_BWD_GRADS)
            gdn_copy_or_zero(dS0, dS_final, (size_t)nv * dim_k * dim_v);
        return;
    }
    const int64_t R = gdn_piece_rows();
    if (T <= R) {
        GDN_DISPATCH(dim_k, dim_v, gdn_backward_impl, stage, dkept, (bf16 *)dq, (bf16 *)dk, (bf16 *)dv, dg, dbeta,
                     dS0, (const bf16 *)dout, dS_final, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, g, beta, S0,
                     doc_pos, T, nk, nv, ldq, ldv, ldo, kept, kept_kind);
        return;
    }
    static size_t at[GDN_PIECE_MAX + 1];
    const int64_t np = gdn_pieces(who, T, R, nv, dim_k, dim_v, kept_kind, at);
    const size_t sn = (size_t)nv * dim_k * dim_v;
    /* scratch: two state gradients taken in turn; without kept, the entry states */
    float *scr = gdn_piece_scratch(2 * sn + (kept ? 0 : (size_t)(np - 1) * sn));
    float *dcarry = scr;
    const float *entry = kept ? (const float *)((const char *)kept + at[np]) : scr + 2 * sn;
    if (!kept) /* the forward of pieces 0..np-2 again for the states leaving them (the forward's bits), each
                  piece's output into its rows of dv (the shape of o; the piece's backward overwrites them) */
        for (int64_t p = 0; p + 1 < np; p++) {
            const int64_t r0 = p * R;
            GDN_DISPATCH(dim_k, dim_v, gdn_forward_impl, (bf16 *)dv + r0 * ldv, (float *)entry + (size_t)p * sn,
                         (const bf16 *)q + r0 * ldq, (const bf16 *)k + r0 * ldq, (const bf16 *)v + r0 * ldv,
                         g + r0 * nv, beta + r0 * nv, p == 0 ? S0 : entry + (size_t)(p - 1) * sn, doc_pos + r0, R, nk,
                         nv, ldq, ldv, ldv, NULL, 0, 0, 0);
        }
    /* the last piece first; piece p's dS0 is piece p-1's dS_final; dat: the piece's part of dkept (every piece
       before the last has R rows) */
    size_t dat = 0;
    for (int64_t p = 0; stage && p + 1 < np; p++) dat += gdn_dkept_carve(NULL, NULL, NULL, R, nv, dim_k, dim_v);
    for (int64_t p = np - 1; p >= 0; p--) {
        const int64_t r0 = p * R, n = T - r0 < R ? T - r0 : R;
        float *d_entry = dcarry + (size_t)(p % 2) * sn;     /* written: dL/d(state entering p) */
        float *d_exit = dcarry + (size_t)((p + 1) % 2) * sn; /* read: piece p+1's d_entry */
        GDN_DISPATCH(dim_k, dim_v, gdn_backward_impl, stage, stage ? (char *)dkept + dat : NULL, (bf16 *)dq + r0 * ldq,
                     (bf16 *)dk + r0 * ldq, (bf16 *)dv + r0 * ldv, dg + r0 * nv, dbeta + r0 * nv,
                     p == 0 ? dS0 : d_entry, (const bf16 *)dout + r0 * ldo, p == np - 1 ? dS_final : d_exit,
                     (const bf16 *)q + r0 * ldq, (const bf16 *)k + r0 * ldq, (const bf16 *)v + r0 * ldv, g + r0 * nv,
                     beta + r0 * nv, p == 0 ? S0 : entry + (size_t)(p - 1) * sn, doc_pos + r0, n, nk, nv, ldq, ldv,
                     ldo, kept ? (const char *)kept + at[p] : NULL, kept_kind);
        if (p) dat -= gdn_dkept_carve(NULL, NULL, NULL, R, nv, dim_k, dim_v);
    }
}

extern "C" void cuda_gdn_chunk_backward(void *dq /* (T,ldq) */, void *dk /* (T,ldq) */, void *dv /* (T,ldv) */,
                                        float *dg /* (T,nv) */, float *dbeta /* (T,nv) */,
                                        float *dS0 /* (nv,dim_k,dim_v) or NULL */, const void *dout /* (T,ldo) */,
                                        const float *dS_final /* (nv,dim_k,dim_v) or NULL */, const void *q,
                                        const void *k, const void *v, const float *g, const float *beta,
                                        const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k,
                                        int dim_v, int ldq, int ldv, int ldo,
                                        const void *kept /* the forward's, same inputs; or NULL */,
                                        int kept_kind /* the forward's */) {
    gdn_backward_pieces("cuda_gdn_chunk_backward", 0, NULL, dq, dk, dv, dg, dbeta, dS0, dout, dS_final, q, k, v, g,
                        beta, S0, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv, ldo, kept, kept_kind);
}

extern "C" void cuda_gdn_chunk_backward_stage(int stage /* GDN_BWD_DOUT, _STATE, _GRADS (backend.h) */,
                                              void *dkept /* cuda_gdn_dkept_bytes(T, nv, dim_k, dim_v) */, void *dq,
                                              void *dk, void *dv, float *dg, float *dbeta, float *dS0,
                                              const void *dout, const float *dS_final, const void *q, const void *k,
                                              const void *v, const float *g, const float *beta, const float *S0,
                                              const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k,
                                              int dim_v, int ldq, int ldv, int ldo,
                                              const void *kept /* the forward's */,
                                              int kept_kind /* the forward's, with GDN_KEPT_STATES */) {
    RS_CHECK(stage == GDN_BWD_DOUT || stage == GDN_BWD_STATE || stage == GDN_BWD_GRADS,
             "cuda_gdn_chunk_backward_stage: stage %d (GDN_BWD_DOUT, _STATE or _GRADS)", stage);
    RS_CHECK(dkept && kept && (kept_kind & GDN_KEPT_STATES), "cuda_gdn_chunk_backward_stage: the staged backward "
             "needs dkept and the forward's kept buffer with its chunk states (kept_kind %d)", kept_kind);
    gdn_backward_pieces("cuda_gdn_chunk_backward_stage", stage, dkept, dq, dk, dv, dg, dbeta, dS0, dout, dS_final, q, k,
                        v, g, beta, S0, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv, ldo, kept, kept_kind);
}

extern "C" size_t cuda_gdn_dkept_bytes(int64_t T, int nv, int dim_k, int dim_v) {
    const int64_t R = gdn_piece_rows();
    size_t b = 0;
    for (int64_t r0 = 0; r0 < T; r0 += R) b += gdn_dkept_carve(NULL, NULL, NULL, T - r0 < R ? T - r0 : R, nv, dim_k, dim_v);
    return b;
}

extern "C" size_t cuda_gdn_kept_bytes(int64_t T, int nv, int dim_k, int dim_v, int kept_kind) {
    const int64_t R = gdn_piece_rows();
    return T <= R ? gdn_kept_carve(NULL, NULL, T, nv, dim_k, dim_v, kept_kind)
                  : gdn_kept_pieces(T, R, nv, dim_k, dim_v, kept_kind, NULL);
}

extern "C" void cuda_gdn_chunk_prep(void *kept /* cuda_gdn_kept_bytes(T, nv, dim_k, dim_v, kept_kind) */,
                                    const void *k /* (T,ldq) nk heads */, const void *v /* (T,ldv) nv heads */,
                                    const float *g /* (T,nv) */, const float *beta /* (T,nv) */,
                                    const int32_t *doc_pos /* (T) */, int64_t T, int nk, int nv, int dim_k, int dim_v,
                                    int ldq, int ldv, int kept_kind) {
    gdn_check_args("cuda_gdn_chunk_prep", T, nk, nv, dim_k, dim_v, ldq, ldv, 0);
    RS_CHECK(gdn_aligned(k) && gdn_aligned(v), "cuda_gdn_chunk_prep: k, v must be 16-byte aligned");
    RS_CHECK(kept || T == 0, "cuda_gdn_chunk_prep: no kept buffer");
    static size_t at[GDN_PIECE_MAX + 1];
    const int64_t R = gdn_piece_rows();
    const int64_t np = gdn_pieces("cuda_gdn_chunk_prep", T, R, nv, dim_k, dim_v, kept_kind, at);
    for (int64_t p = 0; p < np; p++) { /* piece by piece, as the forward (one piece: at[0] = 0) */
        const int64_t r0 = p * R, n = T - r0 < R ? T - r0 : R;
        GDN_DISPATCH(dim_k, dim_v, gdn_prep_run, (char *)kept + at[p], (const bf16 *)k + r0 * ldq,
                     (const bf16 *)v + r0 * ldv, g + r0 * nv, beta + r0 * nv, doc_pos + r0, n, nk, nv, ldq, ldv,
                     kept_kind);
    }
}

/* M = I, H = 0: the transition of an empty call */
__global__ void gdn_identity_kernel(float *M /* (nv,dk,dk) */, int64_t n, int dk) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) M[i] = (i % ((int64_t)dk * dk)) / dk == i % dk ? 1.0f : 0.0f;
}

extern "C" void cuda_gdn_chunk_transition(float *M /* (nv,dim_k,dim_k) */, float *H /* (nv,dim_k,dim_v) */,
                                          const void *k /* (T,ldq) nk heads */, const void *v /* (T,ldv) nv heads */,
                                          const float *g /* (T,nv) */, const float *beta /* (T,nv) */,
                                          const int32_t *doc_pos /* (T) */, int64_t T, int nk, int nv, int dim_k,
                                          int dim_v, int ldq, int ldv,
                                          const void *kept /* its prep (cuda_gdn_chunk_prep, the forward's), or NULL */,
                                          int kept_kind) {
    gdn_check_args("cuda_gdn_chunk_transition", T, nk, nv, dim_k, dim_v, ldq, ldv, 0);
    RS_CHECK(gdn_aligned(k) && gdn_aligned(v), "cuda_gdn_chunk_transition: k, v must be 16-byte aligned");
    if (T == 0) {
        const int64_t n = (int64_t)nv * dim_k * dim_k;
        gdn_identity_kernel<<<(unsigned)((n + 255) / 256), 256, 0, cuda_stream()>>>(M, n, dim_k);
        CUDA_LAUNCH_CHECK();
        gdn_copy_or_zero(H, NULL, (size_t)nv * dim_k * dim_v);
        return;
    }
    const int64_t R = gdn_piece_rows();
    if (T <= R) {
        GDN_DISPATCH(dim_k, dim_v, gdn_transition_impl, M, H, (const bf16 *)k, (const bf16 *)v, g, beta, doc_pos, T,
                     nk, nv, ldq, ldv, kept, kept_kind);
        return;
    }
    /* pieces, as the forward's (so a pieced kept buffer serves): (M, H) = piece 0's, then for each next piece
     * (Mp, Hp): H = Mp H + Hp, M = Mp M (+ 0), fp32 in this order (a reset in piece p zeroes Mp: nothing
     * before it passes) */
    static size_t at[GDN_PIECE_MAX + 1];
    const int64_t np = gdn_pieces("cuda_gdn_chunk_transition", T, R, nv, dim_k, dim_v, kept_kind, at);
    const size_t mm = (size_t)nv * dim_k * dim_k, hh = (size_t)nv * dim_k * dim_v;
    float *Mp = gdn_piece_scratch(3 * mm + 2 * hh), *Mt = Mp + mm, *zero = Mt + mm, *Hp = zero + mm, *Ht = Hp + hh;
    gdn_copy_or_zero(zero, NULL, mm);
    for (int64_t p = 0; p < np; p++) {
        const int64_t r0 = p * R, n = T - r0 < R ? T - r0 : R;
        GDN_DISPATCH(dim_k, dim_v, gdn_transition_impl, p ? Mp : M, p ? Hp : H, (const bf16 *)k + r0 * ldq,
                     (const bf16 *)v + r0 * ldv, g + r0 * nv, beta + r0 * nv, doc_pos + r0, n, nk, nv, ldq, ldv,
                     kept ? (const char *)kept + at[p] : NULL, kept_kind);
        if (!p) continue;
        cuda_gdn_state_affine(Ht, Mp, H, Hp, 0, nv, dim_k, dim_v);
        cuda_gdn_state_affine(Mt, Mp, M, zero, 0, nv, dim_k, dim_k);
        gdn_copy_or_zero(H, Ht, hh);
        gdn_copy_or_zero(M, Mt, mm);
    }
}

extern "C" void cuda_gdn_chunk_dstate(float *dS0 /* (nv,dim_k,dim_v) */, const void *dout /* (T,ldo) */,
                                      const void *q /* (T,ldq) */, const void *k /* (T,ldq) */,
                                      const float *g /* (T,nv) */, const float *beta /* (T,nv) */,
                                      const int32_t *doc_pos /* (T) */, int64_t T, int nk, int nv, int dim_k,
                                      int dim_v, int ldq, int ldo,
                                      const void *kept /* its prep (the forward's, cuda_gdn_chunk_prep's), or NULL */,
                                      int kept_kind) {
    gdn_check_args("cuda_gdn_chunk_dstate", T, nk, nv, dim_k, dim_v, ldq, 0, ldo);
    RS_CHECK(gdn_aligned(dout) && gdn_aligned(q) && gdn_aligned(k),
             "cuda_gdn_chunk_dstate: dout, q, k must be 16-byte aligned");
    if (T == 0) {
        gdn_copy_or_zero(dS0, NULL, (size_t)nv * dim_k * dim_v);
        return;
    }
    const int64_t R = gdn_piece_rows(); /* the pieces of the forward that kept `kept` */
    static size_t at[GDN_PIECE_MAX + 1];
    if (kept) gdn_pieces("cuda_gdn_chunk_dstate", T, R, nv, dim_k, dim_v, kept_kind, at);
    GDN_DISPATCH(dim_k, dim_v, gdn_dstate_impl, dS0, (const bf16 *)dout, (const bf16 *)q, (const bf16 *)k, g, beta,
                 doc_pos, T, nk, nv, ldq, ldo, kept, kept_kind, R, at);
}

extern "C" void cuda_gdn_state_affine(float *S_out /* (nv,dim_k,dim_v) */, const float *M /* (nv,dim_k,dim_k) */,
                                      const float *S_in /* (nv,dim_k,dim_v) or NULL */,
                                      const float *H /* (nv,dim_k,dim_v) */, int transpose_M, int nv, int dim_k,
                                      int dim_v) {
    RS_CHECK(S_out != S_in && S_out != H, "cuda_gdn_state_affine: S_out must not alias S_in or H");
    RS_CHECK(nv > 0 && dim_k > 0 && dim_v > 0, "cuda_gdn_state_affine: nv = %d, dim_k = %d, dim_v = %d", nv, dim_k,
             dim_v);
    const dim3 grid((dim_v + 31) / 32, (dim_k + 31) / 32, nv);
    gdn_state_affine_kernel<<<grid, dim3(32, 8), 0, cuda_stream()>>>(S_out, M, S_in, H, transpose_M, dim_k, dim_v);
    CUDA_LAUNCH_CHECK();
}
