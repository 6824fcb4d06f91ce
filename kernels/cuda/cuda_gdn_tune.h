/*
 * cuda_gdn_tune.h — the switches of the Gated DeltaNet kernels (kernels/cuda/cuda_gdn.cu), for
 * tests/cuda/test_cuda_gdn.cu and for measurement. The Backend entries never need them: every field
 * at 0 means "the built-in choice". The environment can set the same fields for a whole process
 * (RS_GDN_V2, RS_GDN_SPLIT, RS_GDN_NST, RS_GDN_BV, RS_GDN_OVERLAP, RS_GDN_PROF, RS_GDN_ILP, RS_GDN_WY,
 * RS_GDN_BULK, RS_GDN_DSEG, RS_GDN_DQS, RS_GDN_DUAL, RS_GDN_WIDE, RS_GDN_HILO, RS_GDN_KEEP, RS_GDN_SFWD,
 * RS_GDN_SBWD, RS_GDN_DWG, RS_GDN_SFBV); a call of
 * cuda_gdn_tune_set overrides it. Not thread-safe (one compute stream, as the kernels).
 */
#ifndef RS_CUDA_GDN_TUNE_H
#define RS_CUDA_GDN_TUNE_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CudaGdnTune {
    int v2;      /* kernel set: 1 = v2 (segmented, pipelined state passes; wy_bwd with dk in registers),
                    2 = v1 (the first kernels), 0 = built-in default */
    int split;   /* v2: segments per sequence of the state passes (1 = none), 0 = automatic */
    int nst;     /* v2: pipeline stages of the state passes (2 or 3), 0 = automatic */
    int bv;      /* v2: state columns per block of the state passes (16, 32 or 64; 64 runs 2 stages), 0 = automatic */
    int overlap; /* v2 backward: the forward recompute and the reverse state pass on two streams
                    (1 = on, 2 = off, 0 = automatic) */
    int prof;    /* 1: after each entry, synchronise and print the time of every kernel (stdout); 2: also the
                    cycles per phase of the v2 state passes (block 0, warp 0) */
    int ilp;     /* v2 state passes: shorter dependent MMA chains (1 = on, 2 = off, 0 = automatic) */
    int wy;      /* v2 backward: wy_bwd in 110 KB, two blocks per SM (1 = on, 2 = off, 0 = automatic) */
    int bulk;    /* v2 state passes: tiles in and h / vn / dh / dv2 out by bulk copies (cp.async.bulk, one per
                    row, mbarriers) instead of cp.async and register stores (1 = on, 2 = off, 0 = automatic) */
    int dseg;    /* v2 forward / backward state passes: document segments side by side (1 = none, n > 1: n
                    segments cut at document starts, 0 = automatic); exact: the same bits for every n */
    int dqs;     /* v2 backward: dqkwg split over the two halves of dk, two blocks per SM (1 = on, 2 = off,
                    0 = automatic) */
    int dual;    /* v2 state passes, where bv, dseg and split are automatic: launch both the automatic
                    configuration and 32 columns in 8 document segments, the device picks by the documents
                    (1 = on, 2 = off, 3 / 4 = on with the pick forced to the second / first; 0 = automatic) */
    int wide;    /* v2 state passes, where bv is automatic: 64 columns per block when such blocks fill the SMs
                    (many heads), one block per SM (1 = on, 2 = off, 3 = 64 columns at every shape (tests),
                    0 = automatic) */
    int hilo;    /* v2 state passes: the carried state's MMA operand as two bf16 terms, hi + lo (1 = on, the
                    built-in choice), or hi only (2: FLA's precision, half the state-operand MMAs; measurement
                    only, the error is larger) */
    int keep;    /* the kept buffer of gdn_chunk_forward / _backward (W, U, G2, and h, vn where the caller asks
                    for the states): 1 = used as the caller gives it (the built-in choice), 2 = ignored (the
                    forward keeps nothing, the backward runs its own prep, as before GDN v4.1), 3 = W, U, G2
                    only (the states recomputed, as before GDN v4.4); measurement only: the same bits */
    int sfwd;    /* v2 forward state passes on wgmma (cuda_gdn_wg.h: 64 columns per block, one warpgroup; every
                    forward pass but the bulk-copy one, bv ignored there): 1 = on (2 stages), 3 = on with 3
                    stages, 2 = off, 0 = automatic (on where nv dim_v / 64 >= 128: 64 heads of 128) */
    int sbwd;    /* v2 backward state passes on wgmma (cuda_gdn_wg_bwd.h: 64 columns per block, one warpgroup;
                    every backward pass but the bulk-copy one, bv ignored there): 1 = on, 2 = off, 0 = automatic
                    (on where nv dim_v / 64 >= 128: 64 heads of 128) */
    int dwg;     /* dual launch (dual): its second, many-document configuration on the wgmma state passes (64
                    columns in 8 document segments, forward and backward) where sfwd / sbwd leave the automatic
                    configuration on mma.sync (16 heads of 128): 1 = on, 2 = off (32 columns on mma.sync, as
                    GDN v3.1), 0 = automatic (on: GDN_DWG_DEFAULT) */
    int sfbv;    /* wgmma forward state pass (sfwd, and the dual launch's second form with dwg): state columns per
                    block, 64 or 32 (GDN v4.5: m64n32k16, ~100 KB of shared memory, two blocks per SM); 0 =
                    automatic (32: GDN_SFBV_DEFAULT) */
} CudaGdnTune;

/* NULL: back to the environment / built-in choices */
void cuda_gdn_tune_set(const CudaGdnTune *t);
/* the switches as set (0 where automatic) */
void cuda_gdn_tune_get(CudaGdnTune *t);

#ifdef __cplusplus
}
#endif

#endif
