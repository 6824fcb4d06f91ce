/*
 * cuda_gdn_tune.h — the configuration choices of the Gated DeltaNet state passes (kernels/cuda/gdn/gdn.cu)
 * that the built-in planner makes by shape, for tests/cuda/test_cuda_gdn.cu (to reach every configuration
 * at small shapes) and for `ringscan bench gdn --gdn-tune` (to measure them). The Backend entries never set
 * them: every field at 0 is the built-in choice, and nothing reads the environment. Every configuration
 * gives the same bits (the passes are exact). Not thread-safe (one compute stream, as the kernels).
 */
#ifndef RS_CUDA_GDN_TUNE_H
#define RS_CUDA_GDN_TUNE_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CudaGdnTune {
    int split; /* segments per sequence of the state passes (1 = none), 0 = automatic */
    int nst;   /* pipeline stages of the mma.sync state passes (2 or 3), 0 = automatic (2) */
    int bv;    /* state columns per block of the mma.sync state passes (16, 32 or 64; 64 runs 2 stages),
                  0 = automatic (16 or 32 by the head count) */
    int dseg;  /* forward / backward state passes: document segments side by side (1 = none, n > 1: n
                  segments cut at document starts, 0 = automatic) */
    int dual;  /* where bv, dseg and split are automatic: launch both the automatic configuration and 32
                  columns in 16 document segments, the device picks by the documents (1 = on, 2 = off, 3 / 4
                  = on with the pick forced to the second / first; 0 = automatic: on) */
    /* the wgmma switches; their `ringscan bench gdn --gdn-tune` keys (bench/bench.c) say what each
     * chooses: state_fwd_wgmma, state_bwd_wgmma, dual_wgmma, state_fwd_wgmma_cols and, after piece,
     * state_bwd_wgmma_cols */
    int sfwd;  /* state_fwd_wgmma: forward state passes on wgmma (gdn/state_forward_wgmma.cuh): 1 = on (2 stages),
                  3 = on with 3 stages, 2 = off, 0 = automatic (on where nv dim_v / 64 >= 128: 64 heads of 128) */
    int sbwd;  /* state_bwd_wgmma: backward state passes on wgmma with dL/dS in registers
                  (gdn/state_backward_regs.cuh): 1 = on, 2 = off,
                  0 = automatic (as state_fwd_wgmma) */
    int dwg;   /* dual_wgmma: the dual launch's second configuration on the wgmma passes (64 columns in 16 document
                  segments) where state_fwd_wgmma / state_bwd_wgmma leave the first on mma.sync: 1 = on, 2 = off
                  (32 columns on mma.sync), 0 = automatic (on) */
    int sfbv;  /* state_fwd_wgmma_cols: wgmma forward state pass: state columns per block, 32
                  (gdn/state_forward_wgmma.cuh, two blocks per SM), 64 (the state in registers as the A operand,
                  gdn/state_forward_regs.cuh: one warpgroup, two blocks per SM) or 128 (the same, two warpgroups
                  sharing the W, K tiles, where dim_k and dim_v are multiples of 128; 32 at other shapes);
                  0 = automatic (64 where dim_k and dim_v are multiples of 128 and the launch's 64-column blocks
                  with work exceed one per SM, else 32) */
    int piece; /* rows per piece of a call (a multiple of 64), 0 = GDN_PIECE_ROWS (backend.h); tests set it
                  small to reach the pieced path. It changes the kept buffer's size (cuda_gdn_kept_bytes):
                  set it before sizing one, and keep it until that buffer's backward has run */
    int sbcols; /* state_bwd_wgmma_cols: wgmma backward state pass: state columns per block, 64 (one warpgroup)
                   or 128 (two warpgroups sharing the Q, K, W tiles, where dim_k and dim_v are multiples of 128;
                   64 at other shapes); 0 = automatic (128 where the shape allows it and the launch's 64-column
                   blocks with work exceed one per SM) */
} CudaGdnTune;

/* NULL: every choice back to the built-in one */
void cuda_gdn_tune_set(const CudaGdnTune *t);
/* the choices as set (0 where automatic) */
void cuda_gdn_tune_get(CudaGdnTune *t);
/* the per-kernel profile of every GDN entry, for `ringscan bench gdn --profile`: 0 off (the built-in
 * state), 1 = after each entry, synchronise and print the time of every kernel (stdout), 2 = also the
 * cycles per phase of the mma.sync / wgmma state passes (block 0, warp 0) */
void cuda_gdn_profile(int level);

#ifdef __cplusplus
}
#endif

#endif
