/*
 * gdn_host.h — the host side of the GDN launches (gdn.cu) that lives in files of its own: the built-in
 * choices and the plan of a call (gdn_tune.cu: which state-pass configuration, from the shape and
 * cuda_gdn_tune.h's switches), the per-kernel profile (gdn_profile.cu) and the device buffers
 * (gdn_buffers.cu: the workspace, the buffers of a call carved from it, the layouts of the kept and
 * dkept buffers, the pieces of a long call). C++, internal to kernels/cuda/gdn/;
 * docs/design/gdn-kernels.md says what each buffer and configuration is for.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "cuda_common.h"
#include "cuda_gdn_tune.h"

/* the built-in choices (docs/performance.md has the measurements behind them) */
#define GDN_NST_DEFAULT 2     /* mma.sync state passes: pipeline stages */
#define GDN_DSEG_MAX 64       /* document segments of a state pass, at most */
#define GDN_DSEG_WAVES 2      /* automatic document segments: about this many blocks per SM */
#define GDN_SBWD_BLOCKS 128   /* backward state pass on wgmma where its 64-column blocks are at least this many
                                 (64 heads of 128) */
#define GDN_SFWD_BLOCKS 128   /* forward state pass on wgmma where its 64-column blocks are at least this many
                                 (64 heads of 128), 2 stages */
#define GDN_DUAL_DEFAULT 1    /* state passes: dual launch, the configuration chosen on the device */
#define GDN_DUAL_ZB 16        /* dual launch, second configuration: 32 columns in this many document segments, or
                                 half as many where more have work than fill the GPU once (GdnPlan.dual_wave) */
#define GDN_DUAL_WAVES 2      /* ... chosen when its non-empty segments give this many blocks per SM */
#define GDN_DWG_DEFAULT 1     /* dual launch: its second configuration on the wgmma state passes */
#define GDN_CUTS_B (GDN_DSEG_MAX + 1)         /* the second configuration's cuts in GdnBufs.cuts */
#define GDN_CUTS_PICK (2 * (GDN_DSEG_MAX + 1)) /* the device's choice in GdnBufs.cuts */

#define GDN_PIECE_MAX 4096 /* pieces of one call (2^28 tokens at the default piece) */

enum { GDN_WS_FORWARD, GDN_WS_BACKWARD, GDN_WS_TRANSITION, GDN_WS_DSTATE };

/* the buffers of one call, carved from the workspace (NULL where the call needs none) */
typedef struct GdnBufs {
    int64_t T;                    /* tokens of the call */
    int32_t *blk, *meta, *starts; /* index: (nb,3), (GDN_META_N), (T+1) */
    int4 *info;                   /* (T+1) per chunk: t0, L, flags (gdn_index_info_kernel) */
    int32_t *cuts;                /* (2 (GDN_DSEG_MAX+1) + 1) document segments of the state passes: the
                                     first configuration's, at GDN_CUTS_B the dual launch's second, then
                                     the device's choice between them (GDN_CUTS_PICK) */
    float *G2;                    /* (T,nv) log2-unit chunk-local cumsum */
    bf16 *W;                      /* (T,nv,dk); the backward reuses it for dw */
    bf16 *U;                      /* (T,nv,dv); the backward reuses it for dv_loc */
    bf16 *Tb;                     /* (T,nv,64) each chunk's Tinv by rows, bf16: prep writes it, wy_bwd reads it
                                     (a kept buffer with GDN_KEPT_TINV; else NULL and wy_bwd solves) */
    bf16 *vn;                     /* (T,nv,dv) */
    bf16 *hs, *dhs;               /* (ns,nv,dk,dv) */
    bf16 *dv2;                    /* (T,nv,dv) */
    float *dqv, *dkv, *dgp;       /* (T,nv,dk), (T,nv,dk), (2,T,nv) */
    float *segE, *segH, *segM;    /* segmented state passes: (nseg,nv,dk,dv) x 2, (nseg,nv,dk,dk) */
    float *segE2, *segH2, *segM2; /* the same for the backward's reverse pass (it may overlap the forward's) */
} GdnBufs;

typedef struct GdnPlan {
    int nst, bv, nseg_f, nseg_b, prof;
    int dseg; /* forward / backward state passes: document segments (> 1: on, replaces nseg) */
    int dual; /* state passes: dual launch (bv / dseg as above, and 32 columns in GDN_DUAL_ZB document
                 segments), the device picks by the documents; 0: off */
    int64_t dual_need; /* blocks of the second configuration that make the device pick it */
    int dual_wave;     /* the second configuration's document segments with work that fill the GPU once (a
                          128-column block per SM): more, and it runs half as many (gdn_index_cuts_kernel) */
    long long *tp; /* prof == 2: the state passes' per-phase cycles and chunks (device, 2 x GDN_TP_SLOTS) */
    int sfwd;      /* forward state passes on wgmma (gdn/state_forward_wgmma.cuh): 0 off, else its pipeline stages (2, 3) */
    int sbwd;      /* backward state passes on wgmma (gdn/state_backward_regs.cuh): 0 off, 1 on */
    int dwg;       /* dual launch: its second configuration on wgmma (both passes, 2 stages) */
    int sfbv;      /* wgmma forward state pass: state columns per block, 32 (gdn/state_forward_wgmma.cuh), 64 or
                      128 (gdn/state_forward_regs.cuh: one or two warpgroups); 0: 32 or 64 by the launch's blocks
                      with work (gdn_wide_pick) */
    int sbcols;    /* wgmma backward state pass: state columns per block, 64 or 128 (two warpgroups), 0: by
                      the launch (gdn_wide_pick) */
} GdnPlan;

/* ---- gdn_tune.cu ---- */
/* the switches as set (cuda_gdn_tune_set; all 0: the built-in choices) */
CudaGdnTune gdn_tune(void);
/* the plan of a forward or backward of T tokens, nv value heads of dim dv, key dim DK (64, 128) */
template <int DK> GdnPlan gdn_plan(int64_t T, int nv, int dv);
extern template GdnPlan gdn_plan<64>(int64_t T, int nv, int dv);
extern template GdnPlan gdn_plan<128>(int64_t T, int nv, int dv);

/* the 64-column blocks with work above which a wgmma state pass runs its wide form where its width is automatic:
 * pass 1, the backward's two warpgroups per block (one per SM); 0, the forward's four warpgroups of 32 columns
 * (1.5 per SM); 2, the forward with the state in registers (one per SM) */
int64_t gdn_wide_need(void);
/* the wide form for a launch whose blocks64 64-column blocks all have work (blocks64 > gdn_wide_need) */
bool gdn_wide_pick(int64_t blocks64);

/* ---- gdn_profile.cu ---- */
extern int gdn_prof_level; /* cuda_gdn_profile: 0 off, 1 per-kernel times, 2 also the state passes' cycles */
/* events on the compute stream between the launches of one entry: start, a mark after each kernel, end */
void gdn_prof_start(int on);
void gdn_prof_mark(const char *name);
void gdn_prof_end(const char *who, int64_t T, int nv);
/* prof == 2: the per-phase cycles of the state passes per chunk (block 0, warp 0, over the chunks it walked) */
void gdn_tp_print(const GdnPlan &pl, int bwd);

/* ---- gdn_buffers.cu ---- */
/* the buffers of a call of kind `what` (GDN_WS_*) carved from the workspace, which grows as needed. nseg:
 * slots of the segmented state passes (0: none); kept_states: h and vn live in the caller's kept buffer */
GdnBufs gdn_buffers(int what, int64_t T, int nv, int dk, int dv, int nseg = 0, int kept_states = 0);
/* What the forward keeps for the backward (gdn_chunk_forward's kept buffer, cuda_gdn_kept_bytes), by its kind
 * (backend.h GDN_KEPT_*): the prep's outputs W (T,nv,dk) bf16, U (T,nv,dv) bf16 and G2 (T,nv) fp32; with
 * GDN_KEPT_TINV each chunk's Tinv by rows (T,nv,64) bf16; with GDN_KEPT_STATES the forward state pass's h
 * (ns,nv,dk,dv) bf16 and vn (T,nv,dv) bf16; in this order, each on a 256-byte boundary (as the workspace's).
 * With it the backward skips its prep (K K^T, the solve, the W and U products), with Tinv wy_bwd's solve, and
 * with the states its state_fwd recompute: the same kernels on the same inputs wrote these, so the results
 * are the recompute's bits. The backward is told the forward's kind (backend.h asks it).
 * b NULL: the size only. Returns the bytes, a multiple of 256 (fragments of one buffer stay aligned). */
size_t gdn_kept_carve(GdnBufs *b, void *kept, int64_t T, int nv, int dk, int dv, int kind);
/* What the staged backward carries between its stages in one piece's part of dkept (dv_loc, dh, dv2);
 * b NULL: the size only. Returns the bytes, a multiple of 256. */
size_t gdn_dkept_carve(GdnBufs *b, bf16 **dvl, void *dkept, int64_t T, int nv, int dk, int dv);
/* rows per piece: the tune's piece, or GDN_PIECE_ROWS (backend.h) */
int64_t gdn_piece_rows(void);
/* the kept bytes of a call of T tokens in pieces of R; at[p] (np + 1 entries, or NULL) the offsets */
size_t gdn_kept_pieces(int64_t T, int64_t R, int nv, int dk, int dv, int kind, size_t *at);
/* the pieces of a call (at most GDN_PIECE_MAX; `who` names the entry), with the kept offsets at[] */
int64_t gdn_pieces(const char *who, int64_t T, int64_t R, int nv, int dk, int dv, int kind, size_t *at);
/* the pieces' own device scratch (fp32), grown like the workspace */
float *gdn_piece_scratch(size_t floats);
