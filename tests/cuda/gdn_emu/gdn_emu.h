/*
 * gdn_emu.h (gdn_emu) — what the two sides of gdn_emu_cmp share: the KDA emulation's headers (tests/cuda/kda_emu/inc,
 * which hold the bf16 pair helpers and warp shuffles the GDN kernels use too), and GdnEmuBufs, one call's inputs and
 * output buffers (the layouts of gdn.cu's backward: token-major, nv value heads, nk key heads).
 */
#pragma once
#include "cuda_common.h"
#include "cuda_gdn_mma.h"

struct GdnEmuBufs {
    int64_t T;
    int nk, nv, ldq, ldv, ldo;
    float scale;
    const int32_t *starts, *meta, *doc_pos;
    const bf16 *k, *v, *q, *dout, *vn, *dv2, *hs, *dhs; /* hs, dhs: (ns,nv,DK,DV) */
    const float *g, *beta;
    bf16 *W, *U;                                      /* prep */
    bf16 *Tb;                                         /* prep's kept Tinv (T,nv,64), where a side keeps it */
    float *G2;
    float *dqv, *dkv, *dgp, *dgp2;                    /* dqkwg (dkv also wy_bwd's input and, nv != nk, output) */
    bf16 *dq_out, *dw;
    bf16 *dk_out, *dv_out;                            /* wy_bwd */
    float *dg_out, *dbeta_out;
};
