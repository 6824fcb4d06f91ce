/*
 * gdn.cu — the chunked gated delta rule on the GPU (the host side; the kernels are the .cuh files beside): the Backend entries
 * gdn_chunk_forward, gdn_chunk_backward and the context-parallel entries
 * gdn_chunk_transition, gdn_chunk_dstate, gdn_state_affine (lib/backend/backend.h has
 * the contract; kernels/cpu/cpu_gdn.c is the fp32 oracle, its header has the
 * algebra). Callers: the cuda backend table (model forward/backward, lib/cp*),
 * tests/cuda/test_cuda_gdn.cu.
 *
 * Kernel split (research/gdn_cp.md §1-2, FLA's validated boundaries). Every
 * per-chunk kernel runs 128 threads (4 warps) on one (chunk, value head) and
 * multiplies bf16 tiles in shared memory with mma.sync m16n8k16 (fp32
 * accumulation, cuda_gdn_mma.h); the state passes run one block per (value
 * head, column block of the state) and walk the chunks in order, the state
 * (or its gradient) in fp32 registers.
 *   index     count / scan / write / info: chunk starts from doc_pos on the device (a
 *             chunk starts every 64 tokens of a document, counted from the document's
 *             first token or from token 0 of the call), the first and last chunk
 *             that starts a document, (t0, L, flags) per chunk (no host round trip)
 *   prep      per chunk: fp32 cumsum of g (log2 units), K K^T, A, Tinv = (I+A)^-1
 *             (fp32, 16x16 blocks: substitution on the diagonal, then the blocks below
 *             from their diagonal neighbours), W = Tinv diag(beta gam) K,
 *             U = Tinv diag(beta) V (Tinv split hi+lo bf16, so W, U are not
 *             limited by Tinv's rounding), stored bf16
 *   state_fwd sequential over chunks: store the entering state h (bf16), vn = U - W S,
 *             S = gam_L S + K^T (dec * vn); S operand split hi+lo bf16; cp.async
 *             prefetch of the next chunk's tiles, its (t0, L, flags) two chunks ahead
 *             (no dependent global load on the sequential path). Transition mode carries [S | M] from
 *             [0 | I] (research/gdn_cp.md §8.2): M comes out of the same pass.
 *   output    per chunk: o = scale (gam * (Q h) + (Q K^T * Gam * causal) vn)
 *   backward: prep (skipped when the forward kept W, U, G2: GDN v4.1 below), state_fwd (recompute h, vn;
 *             skipped when the forward kept them: GDN v4.4), dvlocal (dv_loc = scale P^T dO),
 *             state_bwd (reverse pass: dv2 = dv_loc + dec * (K D), D <- gam_L D +
 *             scale (Q*gam)^T dO - W^T dv2, dS_final in, dS0 out), dqkwg (dq, dk from
 *             the states, dw = -dv2 h^T, dG terms), wy_bwd (Tinv recomputed: dk, dv,
 *             dbeta, dG of the WY factors; dg reverse cumsum; dk summed in fp32), and for
 *             GVA group_reduce (dq, dk per key head: the fp32 per-value-head partials
 *             of the group summed in head order, one bf16 rounding); without GVA
 *             dqkwg and wy_bwd write the final bf16 dq and dk themselves.
 *   dstate    = prep, dvlocal, state_bwd on the chunks before the first document start.
 *   staged (lib/cp/cp_gdn.c's cp 2 chain; the bits of the whole calls): the forward with o NULL = index, prep,
 *             state_fwd (h, vn into kept), then with GDN_KEPT_STATES_IN = index, output; the backward's
 *             stages (cuda_gdn_chunk_backward_stage, kept with states) DOUT = dvlocal, STATE = state_bwd,
 *             GRADS = dqkwg, wy_bwd (group_reduce), each with its index, dv_loc, dh and dv2 carried in the
 *             caller's dkept (gdn_dkept_carve, per piece) instead of the workspace.
 *   state_affine: fp32 IEEE (no TF32) tiled S_out = op(M) S_in + H.
 *
 * Numerics: states, gate cumsums, dg, dbeta and the dq/dk partials are fp32; gate
 * factors are exp2 of non-positive exponents only (masked entries are selected,
 * never multiplied); W, U, vn, h, dh, dv_loc, dv2, dw are stored bf16 (the MMA
 * operand precision, as in FLA); the carried state's MMA operand is split into two
 * bf16 terms. Offsets into token-major buffers are 64-bit. Tiles are fixed and no
 * atomics are used: the same inputs give the same bits on every run.
 *
 * Chunk bookkeeping: a chunk that starts a document (doc_pos == 0) starts from
 * state 0 and needs no stored state; every other chunk starts 64 tokens after the
 * previous chunk of its document (or at token 0), so the starts of such chunks are
 * >= 64 apart and slot t0 / 64 is unique: h[slot] is the state entering the
 * chunk at t0, dh[slot] the gradient arriving at that boundary; the call's end has
 * its own slot ceil(T/64) (dh of the last chunk). ns = ceil(T/64) + 1 slots.
 *
 * Workspace: backend.h gives these entries none, so this file owns one device
 * buffer (gdn_ws, counted in memory_stats' internal bytes) that grows when a call
 * needs more than it holds and is reused as is otherwise: no allocation in steady
 * state. Pieces: a forward or backward of more than GDN_PIECE_ROWS tokens (backend.h; the tune's piece
 * in tests) runs as consecutive calls of at most that many, the state entering each piece passed in fp32
 * (the backward's state gradient the other way), so T below is at most a piece for these two; the
 * transition runs the same pieces, each piece's (M, H) composed in fp32 (cuda_gdn_chunk_transition), and
 * dstate runs whole (given a pieced kept buffer it copies the pieces' W, G2 together). The kept buffer of a
 * pieced call is each piece's, in order, then the states entering pieces 1.. (fp32); without a kept buffer
 * the backward runs the pieces' forward again for those states (the same bits, as the backend.h contract
 * asks). Per call (T tokens, nv value heads): forward 2 T nv (dk + 2 dv) + 2 ns nv dk dv bytes plus small;
 * backward adds 2 T nv dv + 8 T nv dk + 2 ns nv dk dv. Not thread-safe (one compute stream).
 * The kept buffer (the entries' `kept`, cuda_gdn_kept_bytes(T, nv, dk, dv, states) = T nv (2 dk + 2 dv + 4)
 * bytes, with states + 2 ns nv dk dv + 2 T nv dv, each part on 256 bytes; the caller's): the forward's prep
 * writes W, U, G2 there instead of the workspace, and with kept_states its state pass h and vn (GDN v4.4);
 * a backward given it skips its prep, and with kept_states its state_fwd recompute (gdn_kept_carve); the
 * workspace then has no h, vn. cuda_gdn_chunk_prep writes the W, U, G2 alone (the same launch on the same
 * index), so a forward told GDN_KEPT_PREP_IN, a transition and a dstate given kept skip their prep
 * (lib/cp/cp_gdn.c's chain computes a fragment's prep once, off its critical path).
 *
 * Configurations (cuda_gdn_tune.h; every one gives the same bits): the mma.sync state passes
 * (gdn/state_pass.cuh) run in 16 or 32 columns per block (by the head count), two pipeline stages, in
 * segments folded like the CP scan where the heads are few, or in document segments side by side; the
 * dual launch starts both the automatic configuration and a many-document one (32 columns in 8
 * document segments, on wgmma) and the device picks by the documents. From 128 blocks of 64 columns
 * (64 heads of 128) both passes run on wgmma (gdn/state_forward_wgmma.cuh, gdn/state_backward_wgmma.cuh). dqkwg runs split
 * over the two halves of dk (two blocks per SM), wy_bwd keeps dk in registers (two blocks per SM).
 * The forward keeps W, U, G2 and, asked, the chunk states for the backward (the `kept` buffer).
 * Measurements and the history of each choice: docs/benchmarks.md (GDN v1 .. v4.5, v0.5).
 *
 * Limits: dim_k, dim_v in {64, 128}. 256 is not built: the backward's per-chunk
 * tiles (q, k, vn, dO, dv2 rows plus the two 256x256 states) exceed the 227 KB of
 * shared memory a block can have, so it needs a column-split dqkwg first. Rows of
 * q, k, v, o and the gradients must be 16-byte aligned (ld % 8 == 0, aligned
 * pointers); T < 2^31 - 128.
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
#include "state_backward_wgmma.cuh"
#include "reduce.cuh"


/* ------------------------------------------------------------------------------------------------ */
/* switches (cuda_gdn_tune.h), per-kernel profile                                                     */

/* built-in choices (GDN v2 in docs/benchmarks.md has the measurements behind them) */
#define GDN_NST_DEFAULT 2     /* mma.sync state passes: pipeline stages */
#define GDN_DSEG_MAX 64       /* document segments of a state pass, at most */
#define GDN_DSEG_WAVES 2      /* automatic document segments: about this many blocks per SM */
#define GDN_SBWD_BLOCKS 128   /* v2 backward state pass on wgmma (GDN v4.3) where its 64-column blocks are at
                                 least this many (64 heads of 128: fwd+bwd -11%; 16 heads: 32 blocks, +17%
                                 with one document, -9% with 16) */
#define GDN_SFWD_BLOCKS 128   /* v2 forward state pass on wgmma (GDN v4.2) where its 64-column blocks are at
                                 least this many (64 heads of 128: -3 to -4% fwd+bwd; 16 heads: 32 blocks,
                                 +25% with one document), 2 stages */
#define GDN_DUAL_DEFAULT 1    /* v2 state passes: dual launch, the configuration chosen on the device (GDN v3.1) */
#define GDN_DUAL_ZB 8         /* dual launch, second configuration: 32 columns in this many document segments */
#define GDN_DUAL_WAVES 2      /* ... chosen when its non-empty segments give this many blocks per SM */
#define GDN_SFBV_DEFAULT 32   /* wgmma forward state pass: columns per block (GDN v4.5, H100 2026-11-23: 32k / 64
                                 heads fwd+bwd 17.86 -> 16.96 ms, 16 heads / 16 documents with dwg 4.66 -> 4.46) */
#define GDN_DWG_DEFAULT 1     /* dual launch: its second configuration on the wgmma state passes (GDN v4.5, H100
                                 2026-11-23: 32k / 16 heads / 16 documents fwd+bwd 5.41 -> 4.66 ms) */
#define GDN_CUTS_B (GDN_DSEG_MAX + 1)         /* the second configuration's cuts in GdnBufs.cuts */
#define GDN_CUTS_PICK (2 * (GDN_DSEG_MAX + 1)) /* the device's choice in GdnBufs.cuts */

static CudaGdnTune gdn_tune_set; /* all 0 (the built-in choices) unless a test or a benchmark set them */
static int gdn_prof_level;       /* cuda_gdn_profile */

static CudaGdnTune gdn_tune(void) { return gdn_tune_set; }

extern "C" void cuda_gdn_tune_set(const CudaGdnTune *t) {
    if (t) gdn_tune_set = *t;
    else memset(&gdn_tune_set, 0, sizeof gdn_tune_set);
}

extern "C" void cuda_gdn_tune_get(CudaGdnTune *t) { *t = gdn_tune_set; }

extern "C" void cuda_gdn_profile(int level) {
    RS_CHECK(level >= 0 && level <= 2, "cuda_gdn_profile: level %d (want 0, 1 or 2)", level);
    gdn_prof_level = level;
}

/* per-kernel times of one entry (cuda_gdn_profile): events on the compute stream between the launches */
#define GDN_PROF_MAX 40
static struct {
    cudaEvent_t ev[GDN_PROF_MAX];
    const char *name[GDN_PROF_MAX];
    int n, on;
} gdn_prof;

static void gdn_prof_mark(const char *name) {
    if (!gdn_prof.on || gdn_prof.n == GDN_PROF_MAX) return;
    cudaEvent_t *e = &gdn_prof.ev[gdn_prof.n];
    if (!*e) CUDA_CHECK(cudaEventCreate(e));
    gdn_prof.name[gdn_prof.n++] = name;
    CUDA_CHECK(cudaEventRecord(*e, cuda_stream()));
}

static void gdn_prof_start(int on) {
    gdn_prof.on = on;
    gdn_prof.n = 0;
    gdn_prof_mark("start");
}

static void gdn_prof_end(const char *who, int64_t T, int nv) {
    if (!gdn_prof.on) return;
    gdn_prof.on = 0;
    const int n = gdn_prof.n;
    CUDA_CHECK(cudaEventSynchronize(gdn_prof.ev[n - 1]));
    float tot = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&tot, gdn_prof.ev[0], gdn_prof.ev[n - 1]));
    printf("gdn prof %s T=%lld nv=%d:", who, (long long)T, nv);
    for (int i = 1; i < n; i++) {
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, gdn_prof.ev[i - 1], gdn_prof.ev[i]));
        printf(" %s %.3f", gdn_prof.name[i], ms);
    }
    printf(" | %.3f ms\n", tot);
    fflush(stdout);
}

/* ------------------------------------------------------------------------------------------------ */
/* host side: workspace, launches                                                                     */

static void *gdn_ws;        /* the device workspace (see the header) */
static size_t gdn_ws_bytes; /* its size */

/* Grows (never shrinks) through cuda_internal_alloc, so memory_stats counts it: the old buffer is freed
 * after the device is idle (a host synchronisation, on growth only: the first step's first call of each
 * size; a stream-ordered free would leave the old block reserved in the pool, uncounted) */
static unsigned char *gdn_workspace(size_t bytes) {
    if (bytes > gdn_ws_bytes) {
        size_t want = bytes + bytes / 8;
        want = (want + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
        if (gdn_ws) {
            CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
            cuda_internal_free(gdn_ws, gdn_ws_bytes);
        }
        gdn_ws = cuda_internal_alloc(want);
        gdn_ws_bytes = want;
    }
    return (unsigned char *)gdn_ws;
}

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
    bf16 *vn;                     /* (T,nv,dv) */
    bf16 *hs, *dhs;               /* (ns,nv,dk,dv) */
    bf16 *dv2;                    /* (T,nv,dv) */
    float *dqv, *dkv, *dgp;       /* (T,nv,dk), (T,nv,dk), (2,T,nv) */
    float *segE, *segH, *segM;    /* segmented state passes: (nseg,nv,dk,dv) x 2, (nseg,nv,dk,dk) */
    float *segE2, *segH2, *segM2; /* the same for the backward's reverse pass (it may overlap the forward's) */
} GdnBufs;

/* What the forward keeps for the backward (gdn_chunk_forward's kept buffer, cuda_gdn_kept_bytes): the
 * prep's outputs W (T,nv,dk) bf16, U (T,nv,dv) bf16 and G2 (T,nv) fp32, and with states the forward state
 * pass's h (ns,nv,dk,dv) bf16 and vn (T,nv,dv) bf16, each on a 256-byte boundary (as the workspace's). With
 * it the backward skips its prep (K K^T, the solve, the W and U products), and with states its state_fwd
 * recompute too: the same kernels on the same inputs wrote these, so the results are the recompute's bits.
 * The states come after W, U, G2, so a buffer kept with states serves a backward told states = 0 as well
 * (in one piece; a pieced call's backward must be told the forward's kept_states, as backend.h asks).
 * b NULL: the size only. Returns the bytes, a multiple of 256 (fragments of one buffer stay aligned). */
static size_t gdn_kept_carve(struct GdnBufs *b, void *kept, int64_t T, int nv, int dk, int dv, int states);

/* nseg: slots of the segmented state passes (0: none); a backward gets two sets. kept_states: h and vn
 * live in the caller's kept buffer (gdn_kept_carve), so the workspace has none */
static size_t gdn_carve(GdnBufs *b, unsigned char *base, int what, int64_t T, int nv, int dk, int dv,
                        int nseg = 0, int kept_states = 0) {
    const int64_t nb = (T + 1023) / 1024, ns = (T + GDN_C - 1) / GDN_C + 1;
    const size_t tv = (size_t)T * nv;
    GdnCarve c(base, 256); /* global buffers on 256-byte boundaries: whole sectors for every tile row
                              (16-byte alignment alone made the h / vn stores of the state passes 2-3x slower) */
    *b = GdnBufs{};
    b->blk = c.take<int32_t>((size_t)3 * (nb > 0 ? nb : 1));
    b->meta = c.take<int32_t>(GDN_META_N);
    b->starts = c.take<int32_t>((size_t)T + 1);
    b->info = c.take<int4>((size_t)T + 1);
    b->cuts = c.take<int32_t>(GDN_CUTS_PICK + 1);
    b->G2 = c.take<float>(tv);
    b->W = c.take<bf16>(tv * dk);
    b->U = c.take<bf16>(tv * dv);
    if ((what == GDN_WS_FORWARD || what == GDN_WS_BACKWARD) && !kept_states) {
        b->vn = c.take<bf16>(tv * dv);
        b->hs = c.take<bf16>((size_t)ns * nv * dk * dv);
    }
    if (what == GDN_WS_BACKWARD) {
        b->dhs = c.take<bf16>((size_t)ns * nv * dk * dv);
        b->dv2 = c.take<bf16>(tv * dv);
        b->dqv = c.take<float>(tv * dk);
        b->dkv = c.take<float>(tv * dk);
        b->dgp = c.take<float>(2 * tv); /* two partials for the split dqkwg */
    }
    if (nseg > 1) {
        const size_t nsz = (size_t)nseg * nv * dk * dv, nmz = (size_t)nseg * nv * dk * dk;
        b->segE = c.take<float>(nsz);
        b->segH = c.take<float>(nsz);
        b->segM = c.take<float>(nmz);
        if (what == GDN_WS_BACKWARD) {
            b->segE2 = c.take<float>(nsz);
            b->segH2 = c.take<float>(nsz);
            b->segM2 = c.take<float>(nmz);
        }
    }
    return c.off;
}

static size_t gdn_kept_carve(GdnBufs *b, void *kept, int64_t T, int nv, int dk, int dv, int states) {
    const size_t tv = (size_t)T * nv, ns = (size_t)(T + GDN_C - 1) / GDN_C + 1;
    GdnCarve c(kept, 256);
    bf16 *W = c.take<bf16>(tv * dk), *U = c.take<bf16>(tv * dv);
    float *G2 = c.take<float>(tv);
    bf16 *hs = states ? c.take<bf16>(ns * nv * dk * dv) : NULL, *vn = states ? c.take<bf16>(tv * dv) : NULL;
    if (b) {
        b->W = W;
        b->U = U;
        b->G2 = G2;
        if (states) {
            b->hs = hs;
            b->vn = vn;
        }
    }
    return (c.off + 255) / 256 * 256;
}

static GdnBufs gdn_buffers(int what, int64_t T, int nv, int dk, int dv, int nseg = 0, int kept_states = 0) {
    GdnBufs b;
    const size_t bytes = gdn_carve(&b, NULL, what, T, nv, dk, dv, nseg, kept_states);
    gdn_carve(&b, gdn_workspace(bytes), what, T, nv, dk, dv, nseg, kept_states);
    b.T = T;
    return b;
}

/* dual (> 0): also the dual launch's second cuts (GDN_DUAL_ZB segments, bps column blocks each) and the
 * device's choice (need: blocks of the second configuration that make it the one to run); then the first
 * configuration's cuts are written even for dseg == 1 */
static void gdn_index(const GdnBufs *b, const int32_t *doc_pos, int64_t T, int dseg = 1, int dual = 0, int bps = 0,
                      int64_t need = 0) {
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
        gdn_index_cuts_kernel<<<1, 1024, 0, st>>>(b->cuts, b->info, b->meta, dseg > 1 ? dseg : 1, NULL, 0, 0);
        CUDA_LAUNCH_CHECK();
    }
    if (dual) {
        gdn_index_cuts_kernel<<<1, 1024, 0, st>>>(b->cuts + GDN_CUTS_B, b->info, b->meta, GDN_DUAL_ZB,
                                                  b->cuts + GDN_CUTS_PICK, bps, need);
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

/* grid.x of the per-chunk kernels: one block per 64 tokens, the rest (more chunks when documents
 * are short) by the grid-stride loop */
static int gdn_chunk_grid(int64_t T) { return (int)((T + GDN_C - 1) / GDN_C > 0 ? (T + GDN_C - 1) / GDN_C : 1); }

/* wide state passes fill more SMs with 16-column blocks when there are few heads */
static int gdn_state_bv(int nv, int dv) { return (int64_t)nv * dv / 32 >= 128 ? 32 : 16; }

template <int DK, int DV>
static void gdn_launch_prep(const GdnBufs *b, bool with_U, const bf16 *k, const bf16 *v, const float *g,
                               const float *beta, int mode, int64_t T, int nk, int nv, int ldq, int ldv) {
    const size_t sm = GdnPrepSmem<DK, DV>(NULL).bytes;
    gdn_smem_attr(gdn_prep_kernel<DK, DV>, sm, "prep");
    gdn_prep_kernel<DK, DV><<<dim3(gdn_chunk_grid(T), nv), GDN_THREADS, sm, cuda_stream()>>>(
        b->W, with_U ? b->U : NULL, b->G2, k, v, g, beta, b->starts, b->meta, mode, nk, nv, ldq, ldv);
    CUDA_LAUNCH_CHECK();
}

/* dv_loc into dst */
template <int DK, int DV>
static void gdn_launch_dvlocal(const GdnBufs *b, bf16 *dst, const bf16 *q, const bf16 *k, const bf16 *dout, int mode,
                               int64_t T, int nk, int nv, int ldq, int ldo, float scale) {
    const size_t sm = GdnOutSmem<DK, DV>(NULL, false).bytes;
    gdn_smem_attr(gdn_dvlocal_kernel<DK, DV>, sm, "dvlocal");
    gdn_dvlocal_kernel<DK, DV><<<dim3(gdn_chunk_grid(T), nv, 1), GDN_THREADS, sm, cuda_stream()>>>(
        dst, q, k, dout, b->G2, b->starts, b->meta, mode, nk, nv, DV, ldq, ldo, scale);
    CUDA_LAUNCH_CHECK();
}

/* ------------------------------------------------------------------------------------------------ */
/* host side: plan (segments, stages, column block), segmented passes                                 */

typedef struct GdnPlan {
    int nst, bv, nseg_f, nseg_b, prof;
    int dseg; /* forward / backward state passes: document segments (> 1: on, replaces nseg) */
    int dual; /* state passes: dual launch (bv / dseg as above, and 32 columns in GDN_DUAL_ZB document
                 segments), the device picks by the documents; 0: off */
    int64_t dual_need; /* blocks of the second configuration that make the device pick it */
    long long *tp; /* prof == 2: per-phase cycles of the state passes (device, GDN_TP_N) */
    int sfwd;      /* forward state passes on wgmma (gdn/state_forward_wgmma.cuh): 0 off, else its pipeline stages (2, 3) */
    int sbwd;      /* backward state passes on wgmma (gdn/state_backward_wgmma.cuh): 0 off, 1 on */
    int dwg;       /* dual launch: its second configuration on wgmma (both passes, 2 stages) */
    int sfbv;      /* wgmma forward state pass: state columns per block, 64 or 32 (GDN v4.5) */
} GdnPlan;

/* the running entry's plan.sfwd / plan.sbwd, for gdn_state_fwd_launch / gdn_state_bwd_launch (set with the
 * plan; one compute stream) */
static int gdn_sfwd_cur, gdn_sbwd_cur;
static int gdn_sfbv_cur; /* the running entry's plan.sfbv: columns per block of the wgmma forward pass */

/* the running entry's switches from its plan (every entry sets them before its launches) */
static void gdn_cur_set(const GdnPlan &pl) {
    gdn_sfwd_cur = pl.sfwd;
    gdn_sfbv_cur = pl.sfbv;
    gdn_sbwd_cur = pl.sbwd;
}

static int gdn_sm_count(void) {
    static int n;
    if (!n) {
        int dev;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    }
    return n;
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
 * at 128 and 256 column blocks (16 and 64 heads of 128) every split measured slower (GDN v2 in
 * docs/benchmarks.md: a block's chunk step is bound by its own issue and store work, and a second
 * resident block runs at about half speed), so there one segment. Slots = one block per SM. */
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

template <int DK> static GdnPlan gdn_plan(int64_t T, int nv, int dv) {
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
    }
    /* wgmma forward state pass: every forward pass (segments, transition columns, document segments,
     * dual launch) */
    const int sfwd = t.sfwd == 1 ? 2 : t.sfwd == 3 ? 3 : t.sfwd == 2 ? 0 : (int64_t)nv * dv / 64 >= GDN_SFWD_BLOCKS ? 2 : 0;
    pl.sfwd = dv % 64 != 0 ? 0 : sfwd;
    /* wgmma backward state pass: every backward pass (the same contract) */
    const int sbwd = t.sbwd == 1 ? 1 : t.sbwd == 2 ? 0 : (int64_t)nv * dv / 64 >= GDN_SBWD_BLOCKS ? 1 : 0;
    pl.sbwd = dv % 64 != 0 ? 0 : sbwd;
    /* the dual launch's many-document configuration on wgmma (GDN v4.5): 64 columns in GDN_DUAL_ZB document
     * segments. The device's pick is unchanged: (nv dv / 32) x non-empty segments >= 2 blocks per SM is
     * (nv dv / 64) x non-empty segments >= 1 block per SM, what a wgmma block (one per SM) needs. */
    const int dwg = t.dwg == 1 ? 1 : t.dwg == 2 ? 0 : GDN_DWG_DEFAULT;
    pl.dwg = pl.dual && dv % 64 == 0 ? dwg : 0;
    /* the wgmma forward pass in 32-column blocks (GDN v4.5: two blocks per SM) */
    RS_CHECK(t.sfbv == 0 || t.sfbv == 32 || t.sfbv == 64, "gdn: sfbv %d (0, 32 or 64 columns)", t.sfbv);
    pl.sfbv = t.sfbv ? t.sfbv : GDN_SFBV_DEFAULT;
    if (pl.prof == 2) {
        static long long *tp;
        if (!tp) CUDA_CHECK(cudaMalloc(&tp, 2 * GDN_TP_N * sizeof(long long)));
        pl.tp = tp;
    }
    return pl;
}

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
 * of box_cols columns (64: 128 bytes, 128-byte swizzle; 32: 64 bytes, 64-byte swizzle) by box_rows rows;
 * rows past the end read as zeros and are not written. base NULL: a zeroed map, never used. */
static void gdn_tmap(CUtensorMap *m, const void *base, int64_t rows, int64_t cols, int64_t ld, int box_rows,
                     int box_cols = 64) {
    RS_CHECK(box_cols == 64 || box_cols == 32, "gdn: tensor map boxes of %d columns (64 or 32)", box_cols);
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
                              box_cols == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    RS_CHECK(r == CUDA_SUCCESS, "gdn: cuTensorMapEncodeTiled failed (%d): rows %lld cols %lld ld %lld", (int)r,
             (long long)rows, (long long)cols, (long long)ld);
}

/* the tensor maps of the wgmma forward pass (gdn/state_forward_wgmma.cuh), BV state columns per block */
template <int DK, int BV>
static GdnWgMaps gdn_wg_maps(const GdnBufs *b, bf16 *hs, bf16 *vn, const bf16 *k, int nk, int nv, int dv, int ldq) {
    GdnWgMaps tm;
    const int64_t T = b->T, ns = (T + GDN_C - 1) / GDN_C + 1;
    RS_CHECK(ns * nv * DK < INT_MAX, "gdn: state_fwd_wg: %lld h rows exceed the TMA coordinates",
             (long long)(ns * nv * DK));
    gdn_tmap(&tm.w, b->W, T, (int64_t)nv * DK, (int64_t)nv * DK, GDN_C);
    gdn_tmap(&tm.k, k, T, (int64_t)nk * DK, ldq, GDN_C);
    gdn_tmap(&tm.u, b->U, T, (int64_t)nv * dv, (int64_t)nv * dv, GDN_C, BV);
    gdn_tmap(&tm.h, hs, ns * nv * DK, dv, dv, DK, BV);
    gdn_tmap(&tm.vn, vn, T, (int64_t)nv * dv, (int64_t)nv * dv, GDN_C, BV);
    return tm;
}

/* the wgmma forward pass, WB columns per block (64, or 32: GDN v4.5), gdn_sfwd_cur's stages (2, 3) */
template <int DK, int WB>
static void gdn_wg_fwd_launch(const GdnBufs *b, bf16 *hs, bf16 *vn, const GdnSeg &sg, int nz, int ncol, const bf16 *k,
                              int mode, int nk, int nv, int dv, int ldq, cudaStream_t st, long long *tp) {
    RS_CHECK(ncol % WB == 0, "gdn: state_fwd_wg (%d columns per block) needs columns in %ds, has %d", WB, WB, ncol);
    const GdnWgMaps tm = gdn_wg_maps<DK, WB>(b, hs, vn, k, nk, nv, dv, ldq);
    auto run = [&](auto kernel, int bytes) {
        gdn_smem_attr(kernel, bytes, "state_fwd_wg");
        kernel<<<dim3(ncol / WB, nv, nz), GDN_THREADS, bytes, st>>>(hs, vn, sg, tm, b->G2, b->info, b->meta, mode, nk,
                                                                    nv, dv, tp);
        CUDA_LAUNCH_CHECK();
    };
    if (gdn_sfwd_cur == 3) run(gdn_state_forward_wgmma_kernel<DK, 3, WB>, GdnStateFwdSmemWg<DK, 3, WB>::BYTES);
    else run(gdn_state_forward_wgmma_kernel<DK, 2, WB>, GdnStateFwdSmemWg<DK, 2, WB>::BYTES);
}

template <int DK, int BV, int NST>
static void gdn_state_fwd_launch(const GdnBufs *b, bf16 *hs, bf16 *vn, GdnSeg sg, int nz, int ncol, const bf16 *k,
                              int mode, int nk, int nv, int dv, int ldq, cudaStream_t st, long long *tp) {
    if (gdn_sfwd_cur) { /* the wgmma pass: 64 (or 32: gdn_sfbv_cur) columns per block */
        if (gdn_sfbv_cur == 32) gdn_wg_fwd_launch<DK, 32>(b, hs, vn, sg, nz, ncol, k, mode, nk, nv, dv, ldq, st, tp);
        else gdn_wg_fwd_launch<DK, 64>(b, hs, vn, sg, nz, ncol, k, mode, nk, nv, dv, ldq, st, tp);
        return;
    }
    const size_t sm = GdnStateFwdSmem<DK, BV, NST>(NULL).bytes;
    gdn_smem_attr(gdn_state_forward_kernel<DK, BV, NST>, sm, "state_fwd");
    gdn_state_forward_kernel<DK, BV, NST><<<dim3(ncol / BV, nv, nz), GDN_THREADS, sm, st>>>(
        hs, vn, sg, b->W, b->U, k, b->G2, b->info, b->meta, mode, nk, nv, dv, ldq, tp);
    CUDA_LAUNCH_CHECK();
}

/* the tensor maps of the wgmma backward pass (gdn/state_backward_wgmma.cuh) */
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
    gdn_tmap(&tm.dh, dhs, ns * nv * DK, dv, dv, DK);
    gdn_tmap(&tm.dv2, dv2, T, (int64_t)nv * dv, (int64_t)nv * dv, GDN_C);
    return tm;
}

template <int DK, int BV, int NST>
static void gdn_state_bwd_launch(const GdnBufs *b, bf16 *dhs, bf16 *dv2, GdnSeg sg, int nz, int ncol, const bf16 *q,
                              const bf16 *k, const bf16 *dvl, const bf16 *dout, int mode, int64_t T, int nk, int nv,
                              int dv, int ldq, int ldo, float scale, cudaStream_t st, long long *tp) {
    if (gdn_sbwd_cur) { /* the wgmma pass: 64 columns per block */
        RS_CHECK(ncol % 64 == 0, "gdn: state_bwd_wg needs columns in 64s, has %d", ncol);
        const dim3 grid(ncol / 64, nv, nz);
        const GdnWgBwdMaps tm = gdn_wg_bwd_maps<DK>(b, dhs, dv2, q, k, dvl, dout, T, nk, nv, dv, ldq, ldo);
        gdn_smem_attr(gdn_state_backward_wgmma_kernel<DK, 2>, GdnStateBwdSmemWg<DK, 2>::BYTES, "state_bwd_wg");
        gdn_state_backward_wgmma_kernel<DK, 2><<<grid, GDN_THREADS, GdnStateBwdSmemWg<DK, 2>::BYTES, st>>>(
            dhs, dv2, sg, tm, b->G2, b->info, b->meta, mode, T, nk, nv, dv, scale, tp);
        CUDA_LAUNCH_CHECK();
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
    gdn_index(b, doc_pos, T, pl.dseg, pl.dual, nv * dv / 32, pl.dual_need);
}

/* prof == 2: the per-phase cycles of the state passes (block 0, warp 0; chunks = its chunk count) */
static void gdn_tp_print(const GdnPlan &pl, int bwd, int64_t T) {
    if (pl.prof != 2 || !pl.tp) return;
    long long h[2 * GDN_TP_N];
    CUDA_CHECK(cudaMemcpy(h, pl.tp, sizeof h, cudaMemcpyDeviceToHost));
    static const char *names[GDN_TP_N] = {"wait+sync", "issue", "split+store+sync", "mma1", "epilogue+sync", "mma2"};
    for (int d = 0; d <= bwd; d++) {
        const int nseg = pl.dseg > 1 ? pl.dseg : d ? pl.nseg_b : pl.nseg_f;
        const double nch = (double)((T + GDN_C - 1) / GDN_C) / (nseg > 0 ? nseg : 1);
        printf("gdn cycles per chunk, %s pass (block 0, ~%.0f chunks):", d ? "reverse" : "forward", nch);
        for (int i = 0; i < GDN_TP_N; i++) printf(" %s %.0f", names[i], (double)h[d * GDN_TP_N + i] / nch);
        printf("\n");
    }
    CUDA_CHECK(cudaMemset(pl.tp, 0, sizeof h));
}

/* o NULL: the state pass alone (kept with states: its h, vn stay there); states_in: the output alone, from
 * the prep and states in kept (a forward with o NULL on the same inputs wrote them) */
template <int DK, int DV>
static void gdn_forward_run(const GdnPlan &pl, bf16 *o, float *S_final, const bf16 *q, const bf16 *k, const bf16 *v,
                           const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T,
                           int nk, int nv, int ldq, int ldv, int ldo, void *kept, int kept_states, int prep_in,
                           int states_in) {
    const float scale = (float)(1.0 / sqrt((double)DK));
    cudaStream_t st = cuda_stream();
    GdnBufs b = gdn_buffers(GDN_WS_FORWARD, T, nv, DK, DV, pl.nseg_f, kept && kept_states);
    /* prep writes W, U, G2 (and the state pass h, vn) where the backward finds them; prep_in: gdn_prep_run
       wrote W, U, G2 there already */
    if (kept) gdn_kept_carve(&b, kept, T, nv, DK, DV, kept_states);
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
    gdn_output_kernel<DK, DV><<<dim3(gdn_chunk_grid(T), nv, 1), GDN_THREADS, sm, st>>>(
        o, q, k, b.vn, b.hs, b.G2, doc_pos, b.starts, b.meta, nk, nv, DV, ldq, ldo, scale);
    CUDA_LAUNCH_CHECK();
    gdn_prof_mark("output");
    if (pl.prof)
        printf("gdn plan: nseg %d, dseg %d, bv %d, nst %d, dual %d\n", pl.nseg_f, pl.dseg, pl.bv, pl.nst, pl.dual);
    gdn_prof_end("forward", T, nv);
    gdn_tp_print(pl, 0, T);
}

/* What the staged backward carries between its stages (backend.h gdn_chunk_backward_stage; one piece's part of
 * dkept): dv_loc (T,nv,dv), the chunk state gradients dh (ns,nv,dk,dv) and dv2 (T,nv,dv), bf16, each on 256
 * bytes. b NULL: the size only. Returns the bytes, a multiple of 256. */
static size_t gdn_dkept_carve(GdnBufs *b, bf16 **dvl, void *dkept, int64_t T, int nv, int dk, int dv) {
    const size_t tv = (size_t)T * nv, ns = (size_t)(T + GDN_C - 1) / GDN_C + 1;
    GdnCarve c(dkept, 256);
    bf16 *l = c.take<bf16>(tv * dv), *dhs = c.take<bf16>(ns * nv * dk * dv), *dv2 = c.take<bf16>(tv * dv);
    if (b) {
        *dvl = l;
        b->dhs = dhs;
        b->dv2 = dv2;
    }
    return (c.off + 255) / 256 * 256;
}

/* stage 0: the whole backward; GDN_BWD_DOUT / _STATE / _GRADS: that stage alone, what it carries in dkept
 * (gdn_dkept_carve; kept with states required) */
template <int DK, int DV>
static void gdn_backward_run(const GdnPlan &pl, int stage, void *dkept, bf16 *dq, bf16 *dk, bf16 *dv, float *dg,
                            float *dbeta, float *dS0, const bf16 *dout, const float *dS_final, const bf16 *q,
                            const bf16 *k, const bf16 *v, const float *g, const float *beta, const float *S0,
                            const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq, int ldv, int ldo,
                            const void *kept, int kept_states) {
    static_assert(DV <= 2 * DK, "gdn: dv_loc (bf16, dv) lives in dqv (fp32, dk)");
    const float scale = (float)(1.0 / sqrt((double)DK));
    cudaStream_t st = cuda_stream();
    const int nseg = pl.nseg_f > pl.nseg_b ? pl.nseg_f : pl.nseg_b;
    const int states = kept && kept_states; /* h, vn from the forward: no state_fwd recompute */
    GdnBufs b = gdn_buffers(GDN_WS_BACKWARD, T, nv, DK, DV, nseg, states);
    bf16 *dvl = (bf16 *)b.dqv; /* dv_loc until dqkwg writes dqv (the whole backward) */
    bf16 *dw = b.W;            /* the workspace's W: dw once the state passes are done with W */
    if (kept) gdn_kept_carve(&b, (void *)kept, T, nv, DK, DV, kept_states); /* the forward's: read only */
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
                         DV, ldq, ldo, scale, st, pl.tp ? pl.tp + GDN_TP_N : NULL);
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
        CUDA_CHECK(cudaFuncSetAttribute(gdn_dqkwg_kernel<DK, DV>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        100));
        gdn_dqkwg_kernel<DK, DV><<<dim3(2 * gdn_chunk_grid(T), nv), GDN_THREADS, sm, st>>>(
            b.dqv, nv == nk ? dq : NULL, b.dkv, dw, b.dgp, b.dgp + (size_t)T * nv, q, k, b.vn, dout, b.dv2,
            b.hs, b.dhs, b.G2, doc_pos, b.starts, b.meta, T, nk, nv, ldq, ldo, scale);
        CUDA_LAUNCH_CHECK();
    }
    gdn_prof_mark("dqkwg");
    {
        const size_t sm = GdnWySmem<DK, DV>(NULL).bytes;
        gdn_smem_attr(gdn_wy_backward_kernel<DK, DV>, sm, "wy_bwd");
        gdn_wy_backward_kernel<DK, DV><<<dim3(gdn_chunk_grid(T), nv), GDN_THREADS, sm, st>>>(
            b.dkv, nv == nk ? dk : NULL, dv, dg, dbeta, dw, b.dv2, b.dgp, dgp2, k, v, b.G2, beta, b.starts,
            b.meta, nk, nv, ldq, ldv);
        CUDA_LAUNCH_CHECK();
    }
    gdn_prof_mark("wy_bwd");
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
    gdn_tp_print(pl, 1, T);
}

/* kept's W, U, G2 (gdn_kept_carve) = the prep of every chunk: the bytes gdn_forward_run writes there */
template <int DK, int DV>
static void gdn_prep_run(void *kept, const bf16 *k, const bf16 *v, const float *g, const float *beta,
                         const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq, int ldv, int kept_states) {
    GdnBufs b = gdn_buffers(GDN_WS_TRANSITION, T, nv, DK, DV); /* the index; W, U, G2 go to kept */
    gdn_kept_carve(&b, kept, T, nv, DK, DV, kept_states);
    gdn_index(&b, doc_pos, T);
    gdn_launch_prep<DK, DV>(&b, true, k, v, g, beta, GDN_RANGE_ALL, T, nk, nv, ldq, ldv);
}

/* kept (not NULL): W, U, G2 from it (gdn_prep_run's or the forward's), the chunks from the last reset read
 * as the prep below would write them */
template <int DK, int DV>
static void gdn_transition_run(const GdnPlan &pl, float *M, float *H, const bf16 *k, const bf16 *v, const float *g,
                              const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq, int ldv,
                              const void *kept, int kept_states) {
    GdnBufs b = gdn_buffers(GDN_WS_TRANSITION, T, nv, DK, DV);
    if (kept) gdn_kept_carve(&b, (void *)kept, T, nv, DK, DV, kept_states); /* read only */
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
                          int ldq, int ldo, const void *kept, int kept_states, int64_t R, const size_t *at) {
    const float scale = (float)(1.0 / sqrt((double)DK));
    GdnBufs b = gdn_buffers(GDN_WS_DSTATE, T, nv, DK, DV);
    gdn_index(&b, doc_pos, T);
    for (int64_t r0 = 0, p = 0; kept && r0 < T; r0 += R, p++) {
        GdnBufs kb = GdnBufs{};
        const int64_t n = T - r0 < R ? T - r0 : R;
        gdn_kept_carve(&kb, (char *)kept + (T > R ? at[p] : 0), n, nv, DK, DV, kept_states);
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
                 GDN_RANGE_BEFORE_FIRST_RESET, T, nk, nv, DV, ldq, ldo, scale, cuda_stream(), pl.tp ? pl.tp + GDN_TP_N : NULL);
}

/* the entries under the plan */
template <int DK, int DV>
static void gdn_forward_impl(bf16 *o, float *S_final, const bf16 *q, const bf16 *k, const bf16 *v, const float *g,
                             const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv,
                             int ldq, int ldv, int ldo, void *kept, int kept_states, int prep_in, int states_in) {
    const GdnPlan pl = gdn_plan<DK>(T, nv, DV);
    gdn_cur_set(pl);
    gdn_forward_run<DK, DV>(pl, o, S_final, q, k, v, g, beta, S0, doc_pos, T, nk, nv, ldq, ldv, ldo, kept, kept_states,
                            prep_in, states_in);
}

template <int DK, int DV>
static void gdn_backward_impl(int stage, void *dkept, bf16 *dq, bf16 *dk, bf16 *dv, float *dg, float *dbeta,
                              float *dS0, const bf16 *dout, const float *dS_final, const bf16 *q, const bf16 *k,
                              const bf16 *v, const float *g, const float *beta, const float *S0,
                              const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq, int ldv, int ldo,
                              const void *kept, int kept_states) {
    const GdnPlan pl = gdn_plan<DK>(T, nv, DV);
    gdn_cur_set(pl);
    gdn_backward_run<DK, DV>(pl, stage, dkept, dq, dk, dv, dg, dbeta, dS0, dout, dS_final, q, k, v, g, beta, S0,
                             doc_pos, T, nk, nv, ldq, ldv, ldo, kept, kept_states);
}

template <int DK, int DV>
static void gdn_transition_impl(float *M, float *H, const bf16 *k, const bf16 *v, const float *g, const float *beta,
                                const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq, int ldv, const void *kept,
                                int kept_states) {
    const GdnPlan pl = gdn_plan<DK>(T, nv, DV);
    gdn_cur_set(pl);
    gdn_transition_run<DK, DV>(pl, M, H, k, v, g, beta, doc_pos, T, nk, nv, ldq, ldv, kept, kept_states);
}

template <int DK, int DV>
static void gdn_dstate_impl(float *dS0, const bf16 *dout, const bf16 *q, const bf16 *k, const float *g,
                            const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq, int ldo,
                            const void *kept, int kept_states, int64_t R, const size_t *at) {
    const GdnPlan pl = gdn_plan<DK>(T, nv, DV);
    gdn_cur_set(pl);
    gdn_dstate_run<DK, DV>(pl, dS0, dout, q, k, g, beta, doc_pos, T, nk, nv, ldq, ldo, kept, kept_states, R, at);
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

/* ---- pieces (see the header) ---- */

static int64_t gdn_piece_rows(void) {
    const int piece = gdn_tune().piece;
    RS_CHECK(piece >= 0 && piece % GDN_C == 0, "cuda_gdn tune: piece = %d (a multiple of %d, or 0)", piece, GDN_C);
    return piece ? piece : GDN_PIECE_ROWS;
}

/* the kept bytes of a call of T tokens in pieces of R; at[p] (when not NULL, np + 1 entries) the offset of
 * piece p's part, at[np] that of the entry states */
static size_t gdn_kept_pieces(int64_t T, int64_t R, int nv, int dk, int dv, int states, size_t *at) {
    size_t off = 0;
    int64_t p = 0;
    for (int64_t r0 = 0; r0 < T; r0 += R, p++) {
        if (at) at[p] = off;
        off += gdn_kept_carve(NULL, NULL, T - r0 < R ? T - r0 : R, nv, dk, dv, states);
    }
    if (at) at[p] = off;
    return off + (size_t)(p - 1) * nv * dk * dv * sizeof(float);
}

#define GDN_PIECE_MAX 4096 /* pieces of one call (2^28 tokens at the default piece) */

/* the pieces of a call of T tokens in pieces of R, at most GDN_PIECE_MAX (`who` names the entry), with the kept
 * offsets at[] of gdn_kept_pieces */
static int64_t gdn_pieces(const char *who, int64_t T, int64_t R, int nv, int dk, int dv, int states, size_t *at) {
    const int64_t np = (T + R - 1) / R;
    RS_CHECK(np <= GDN_PIECE_MAX, "%s: T = %lld is %lld pieces of %lld (at most %d)", who, (long long)T,
             (long long)np, (long long)R, GDN_PIECE_MAX);
    gdn_kept_pieces(T, R, nv, dk, dv, states, at);
    return np;
}

/* the pieces' own device scratch (fp32): grown through cuda_internal_alloc like the workspace */
static float *gdn_piece_scratch(size_t floats) {
    static float *buf;
    static size_t have;
    if (floats > have) {
        if (buf) {
            CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
            cuda_internal_free(buf, have * sizeof(float));
        }
        buf = (float *)cuda_internal_alloc(floats * sizeof(float));
        have = floats;
    }
    return buf;
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
    const int kept_states = (kept_flags & GDN_KEPT_STATES) != 0, prep_in = (kept_flags & GDN_KEPT_PREP_IN) != 0;
    const int states_in = (kept_flags & GDN_KEPT_STATES_IN) != 0;
    if (T == 0) {
        if (S_final) gdn_copy_or_zero(S_final, S0, (size_t)nv * dim_k * dim_v);
        return;
    }
    const int64_t R = gdn_piece_rows();
    if (T <= R) {
        GDN_DISPATCH(dim_k, dim_v, gdn_forward_impl, (bf16 *)o, S_final, (const bf16 *)q, (const bf16 *)k,
                     (const bf16 *)v, g, beta, S0, doc_pos, T, nk, nv, ldq, ldv, ldo, kept, kept_states, prep_in,
                     states_in);
        return;
    }
    static size_t at[GDN_PIECE_MAX + 1];
    const int64_t np = gdn_pieces("cuda_gdn_chunk_forward", T, R, nv, dim_k, dim_v, kept_states, at);
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
                     kept ? (char *)kept + at[p] : NULL, kept_states, prep_in, states_in);
    }
#undef GDN_ENTRY
}

/* The backward's pieces (see the header), whole (stage 0) or one stage of backend.h's staged backward (dkept:
 * each piece's gdn_dkept_carve part in order); `who` names the entry */
static void gdn_backward_pieces(const char *who, int stage, void *dkept, void *dq, void *dk, void *dv, float *dg,
                                float *dbeta, float *dS0, const void *dout, const float *dS_final, const void *q,
                                const void *k, const void *v, const float *g, const float *beta, const float *S0,
                                const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq,
                                int ldv, int ldo, const void *kept, int kept_states) {
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
                     doc_pos, T, nk, nv, ldq, ldv, ldo, kept, kept_states);
        return;
    }
    static size_t at[GDN_PIECE_MAX + 1];
    const int64_t np = gdn_pieces(who, T, R, nv, dim_k, dim_v, kept_states, at);
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
                     ldo, kept ? (const char *)kept + at[p] : NULL, kept_states);
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
                                        int kept_states /* the forward's */) {
    gdn_backward_pieces("cuda_gdn_chunk_backward", 0, NULL, dq, dk, dv, dg, dbeta, dS0, dout, dS_final, q, k, v, g,
                        beta, S0, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv, ldo, kept, kept_states);
}

extern "C" void cuda_gdn_chunk_backward_stage(int stage /* GDN_BWD_DOUT, _STATE, _GRADS (backend.h) */,
                                              void *dkept /* cuda_gdn_dkept_bytes(T, nv, dim_k, dim_v) */, void *dq,
                                              void *dk, void *dv, float *dg, float *dbeta, float *dS0,
                                              const void *dout, const float *dS_final, const void *q, const void *k,
                                              const void *v, const float *g, const float *beta, const float *S0,
                                              const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k,
                                              int dim_v, int ldq, int ldv, int ldo,
                                              const void *kept /* the forward's, kept_states 1 */) {
    RS_CHECK(stage == GDN_BWD_DOUT || stage == GDN_BWD_STATE || stage == GDN_BWD_GRADS,
             "cuda_gdn_chunk_backward_stage: stage %d (GDN_BWD_DOUT, _STATE or _GRADS)", stage);
    RS_CHECK(dkept && kept, "cuda_gdn_chunk_backward_stage: the staged backward needs dkept and the forward's kept "
                            "buffer (kept with its chunk states)");
    gdn_backward_pieces("cuda_gdn_chunk_backward_stage", stage, dkept, dq, dk, dv, dg, dbeta, dS0, dout, dS_final, q, k,
                        v, g, beta, S0, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv, ldo, kept, 1);
}

extern "C" size_t cuda_gdn_dkept_bytes(int64_t T, int nv, int dim_k, int dim_v) {
    const int64_t R = gdn_piece_rows();
    size_t b = 0;
    for (int64_t r0 = 0; r0 < T; r0 += R) b += gdn_dkept_carve(NULL, NULL, NULL, T - r0 < R ? T - r0 : R, nv, dim_k, dim_v);
    return b;
}

extern "C" size_t cuda_gdn_kept_bytes(int64_t T, int nv, int dim_k, int dim_v, int states) {
    const int64_t R = gdn_piece_rows();
    return T <= R ? gdn_kept_carve(NULL, NULL, T, nv, dim_k, dim_v, states)
                  : gdn_kept_pieces(T, R, nv, dim_k, dim_v, states, NULL);
}

extern "C" void cuda_gdn_chunk_prep(void *kept /* cuda_gdn_kept_bytes(T, nv, dim_k, dim_v, kept_states) */,
                                    const void *k /* (T,ldq) nk heads */, const void *v /* (T,ldv) nv heads */,
                                    const float *g /* (T,nv) */, const float *beta /* (T,nv) */,
                                    const int32_t *doc_pos /* (T) */, int64_t T, int nk, int nv, int dim_k, int dim_v,
                                    int ldq, int ldv, int kept_states) {
    gdn_check_args("cuda_gdn_chunk_prep", T, nk, nv, dim_k, dim_v, ldq, ldv, 0);
    RS_CHECK(gdn_aligned(k) && gdn_aligned(v), "cuda_gdn_chunk_prep: k, v must be 16-byte aligned");
    RS_CHECK(kept || T == 0, "cuda_gdn_chunk_prep: no kept buffer");
    static size_t at[GDN_PIECE_MAX + 1];
    const int64_t R = gdn_piece_rows();
    const int64_t np = gdn_pieces("cuda_gdn_chunk_prep", T, R, nv, dim_k, dim_v, kept_states, at);
    for (int64_t p = 0; p < np; p++) { /* piece by piece, as the forward (one piece: at[0] = 0) */
        const int64_t r0 = p * R, n = T - r0 < R ? T - r0 : R;
        GDN_DISPATCH(dim_k, dim_v, gdn_prep_run, (char *)kept + at[p], (const bf16 *)k + r0 * ldq,
                     (const bf16 *)v + r0 * ldv, g + r0 * nv, beta + r0 * nv, doc_pos + r0, n, nk, nv, ldq, ldv,
                     kept_states);
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
                                          int kept_states) {
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
                     nk, nv, ldq, ldv, kept, kept_states);
        return;
    }
    /* pieces, as the forward's (so a pieced kept buffer serves): (M, H) = piece 0's, then for each next piece
     * (Mp, Hp): H = Mp H + Hp, M = Mp M (+ 0), fp32 in this order (a reset in piece p zeroes Mp: nothing
     * before it passes) */
    static size_t at[GDN_PIECE_MAX + 1];
    const int64_t np = gdn_pieces("cuda_gdn_chunk_transition", T, R, nv, dim_k, dim_v, kept_states, at);
    const size_t mm = (size_t)nv * dim_k * dim_k, hh = (size_t)nv * dim_k * dim_v;
    float *Mp = gdn_piece_scratch(3 * mm + 2 * hh), *Mt = Mp + mm, *zero = Mt + mm, *Hp = zero + mm, *Ht = Hp + hh;
    gdn_copy_or_zero(zero, NULL, mm);
    for (int64_t p = 0; p < np; p++) {
        const int64_t r0 = p * R, n = T - r0 < R ? T - r0 : R;
        GDN_DISPATCH(dim_k, dim_v, gdn_transition_impl, p ? Mp : M, p ? Hp : H, (const bf16 *)k + r0 * ldq,
                     (const bf16 *)v + r0 * ldv, g + r0 * nv, beta + r0 * nv, doc_pos + r0, n, nk, nv, ldq, ldv,
                     kept ? (const char *)kept + at[p] : NULL, kept_states);
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
                                      int kept_states) {
    gdn_check_args("cuda_gdn_chunk_dstate", T, nk, nv, dim_k, dim_v, ldq, 0, ldo);
    RS_CHECK(gdn_aligned(dout) && gdn_aligned(q) && gdn_aligned(k),
             "cuda_gdn_chunk_dstate: dout, q, k must be 16-byte aligned");
    if (T == 0) {
        gdn_copy_or_zero(dS0, NULL, (size_t)nv * dim_k * dim_v);
        return;
    }
    const int64_t R = gdn_piece_rows(); /* the pieces of the forward that kept `kept` */
    static size_t at[GDN_PIECE_MAX + 1];
    if (kept) gdn_pieces("cuda_gdn_chunk_dstate", T, R, nv, dim_k, dim_v, kept_states, at);
    GDN_DISPATCH(dim_k, dim_v, gdn_dstate_impl, dS0, (const bf16 *)dout, (const bf16 *)q, (const bf16 *)k, g, beta,
                 doc_pos, T, nk, nv, ldq, ldo, kept, kept_states, R, at);
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
