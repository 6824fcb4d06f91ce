/*
 * side.cpp (gdn_emu) — one side of gdn_emu_cmp: the per-chunk kernels of the .cuh files on the include path (a base
 * revision's or the working tree's, build.sh), launched as gdn.cu's backward launches them (prep on GDN_PREP_THREADS
 * over every chunk, dqkwg on 2 blocks of GDN_DQKWG_THREADS per chunk, wy_bwd on GDN_WY_THREADS), exported as
 * GDN_EMU_SIDE(bufs, shape, solve). The kernels sit in an unnamed namespace so that the two sides' template instances
 * stay apart at link time.
 */
#include "gdn_emu.h"

namespace {
alignas(16) unsigned char gdn_smem[EMU_SMEM_MAX]; /* the kernels' extern shared memory */
#include "common.cuh"
#include "prep.cuh"
#include "wy_backward.cuh"
#include "dqkwg.cuh"
/* a revision before prep, dqkwg and wy_bwd ran on 8 warps: each on GDN_THREADS */
#ifndef GDN_PREP_THREADS
#define GDN_PREP_THREADS GDN_THREADS
#endif
#ifndef GDN_DQKWG_THREADS
#define GDN_DQKWG_THREADS GDN_THREADS
#endif
#ifndef GDN_WY_THREADS
#define GDN_WY_THREADS GDN_THREADS
#endif

/* GDN_EMU_KEPT_TINV (build.sh: a revision whose wy_bwd has the SOLVE parameter): prep also writes the kept Tinv
 * and wy_bwd reads it, or with solve prep writes none and wy_bwd solves for it (the backward without a kept Tinv) */
template <int DK, int DV, bool SOLVE> void gdn_emu_wy(GdnEmuBufs *b, int nc, const bf16 *Tb) {
#ifdef GDN_EMU_KEPT_TINV
    emu_launch(gdn_wy_backward_kernel<DK, DV, SOLVE>,
               emu_cfg(dim3(nc, b->nv), dim3(GDN_WY_THREADS), GdnWySmem<DK, DV, SOLVE>(NULL).bytes), b->dkv,
               b->dk_out, b->dv_out, b->dg_out, b->dbeta_out, (const bf16 *)b->dw, b->dv2, (const float *)b->dgp,
               (const float *)b->dgp2, b->k, b->v, Tb, (const float *)b->G2, b->beta, b->starts, b->meta, b->nk, b->nv,
               b->ldq, b->ldv);
#else
    emu_launch(gdn_wy_backward_kernel<DK, DV>,
               emu_cfg(dim3(nc, b->nv), dim3(GDN_WY_THREADS), GdnWySmem<DK, DV>(NULL).bytes), b->dkv, b->dk_out,
               b->dv_out, b->dg_out, b->dbeta_out, (const bf16 *)b->dw, b->dv2, (const float *)b->dgp,
               (const float *)b->dgp2, b->k, b->v, (const float *)b->G2, b->beta, b->starts, b->meta, b->nk, b->nv,
               b->ldq, b->ldv);
#endif
}

template <int DK, int DV> void gdn_emu_run(GdnEmuBufs *b, int solve) {
    const int nc = b->meta[GDN_META_NC];
#ifdef GDN_EMU_KEPT_TINV
    bf16 *Tb = solve ? NULL : b->Tb;
#define GDN_EMU_PREP_TINV Tb,
#else
    const bf16 *Tb = NULL;
#define GDN_EMU_PREP_TINV
#endif
    memset(gdn_smem, 0xcd, sizeof gdn_smem);
    emu_launch(gdn_prep_kernel<DK, DV>,
               emu_cfg(dim3(nc, b->nv), dim3(GDN_PREP_THREADS), GdnPrepSmem<DK, DV>(NULL).bytes), b->W, b->U, b->G2,
               GDN_EMU_PREP_TINV b->k, b->v, b->g, b->beta, b->starts, b->meta, (int)GDN_RANGE_ALL, b->nk, b->nv,
               b->ldq, b->ldv);
    memset(gdn_smem, 0xcd, sizeof gdn_smem);
    emu_launch(gdn_dqkwg_kernel<DK, DV>,
               emu_cfg(dim3(2 * nc, b->nv), dim3(GDN_DQKWG_THREADS), GdnDqkwgSmem<DK, DV>(NULL).bytes), b->dqv,
               b->dq_out, b->dkv, b->dw, b->dgp, b->dgp2, b->q, b->k, b->vn, b->dout, b->dv2, b->hs, b->dhs,
               (const float *)b->G2, b->doc_pos, b->starts, b->meta, b->T, b->nk, b->nv, b->ldq, b->ldo, b->scale);
    memset(gdn_smem, 0xcd, sizeof gdn_smem);
    if (solve) gdn_emu_wy<DK, DV, true>(b, nc, Tb);
    else gdn_emu_wy<DK, DV, false>(b, nc, Tb);
}
} // namespace

extern "C" void GDN_EMU_SIDE(GdnEmuBufs *b, int dk, int dv, int solve) {
    if (dk == 64 && dv == 64) gdn_emu_run<64, 64>(b, solve);
    else if (dk == 128 && dv == 128) gdn_emu_run<128, 128>(b, solve);
    else if (dk == 128 && dv == 64) gdn_emu_run<128, 64>(b, solve);
    else gdn_emu_run<64, 128>(b, solve);
}
