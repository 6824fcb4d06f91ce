/*
 * kda.cu — Kimi Delta Attention's chunked delta rule on the GPU: the Backend entries kda_chunk_forward,
 * kda_chunk_backward (whole or by stage), kda_chunk_prep, the context-parallel kda_chunk_transition and
 * kda_chunk_dstate, and the sizes kda_kept_bytes / kda_dkept_bytes (lib/backend/backend.h, "Kimi Delta
 * Attention"; kernels/cpu/cpu_kda.c is the fp32 oracle, docs/design/kda.md the algebra). The kernels are the
 * .cuh files beside it, one stage each, compiled in this one translation unit; the fold link is GDN's
 * gdn_state_affine (the transition's M has the same shape).
 *
 * Shapes: T tokens (T < 2^31 - 128), nk key heads and nv value heads (nv a multiple of nk), dim_k = dim_v in {64, 128}
 * (the kernels keep the two apart, but only equal dims are tested, and the model has no other); q, k (T, ldq), v (T,
 * ldv), o (T, ldo) bf16 (any row stride at least the width; no alignment asked); g (T, nv, dim_k) and beta (T, nv)
 * fp32; states (nv, dim_k, dim_v) fp32; the gradients dq, dk, dv bf16, dg, dbeta fp32. Chunks of 64 tokens restart at
 * every document start (index.cuh, on the device).
 *
 * A forward runs index, prep_qk (Tinv and the decay-weighted Q K^T per chunk in one pass: prep.cuh's
 * kda_prep_qk_kernel; with a kept prep, PREP_IN, qk alone), wu (the state pass's chunk-parallel factors: W, dec * K,
 * U, gam_{L-1}), the state pass (sequential over chunks; one block per value head and 16, 32 or 64 state columns,
 * kda_state_bv) and the output. prep and qk apart (the kept prep, the backward's prep) give prep_qk's bits. A
 * backward runs index, prep, wu and the forward state pass unless kept holds them (wu runs for the reverse pass
 * too), qk's backward form (scale gam * q and P = scale QK^T dO, the reverse pass's other factors), the reverse
 * state pass (dS0, the chunk state gradients and dvn), grad_dense, grad_wy (its products, then grad_wy_pairs per
 * key channel and dbeta's sum) and grad_qk per chunk, and the sum over each key head's value heads (nv > nk; with
 * nv = nk grad_qk writes dq, dk itself). The staged backward (GDN_BWD_*): DOUT is what needs no state gradient, wu
 * (with_u 0) and qk's backward form into dkept, so that a rank waiting for a state gradient (the cp 2 chain's rank 1)
 * has it done before; STATE is the reverse state pass alone from them into dkept (and dS0), GRADS the per-chunk
 * gradients from kept and dkept. The same launches on the same inputs as the whole backward: the same bits.
 * The transition runs wu and the state pass with the dk columns of M carried beside S from [0 | I]; dstate wu, qk's
 * backward form and the reverse pass from 0.
 *
 * Buffers: kept = Tinv (T, nv, 64) fp32 (cpu_kda.c's layout) and, with states (checkpoint.gdn_keep: states), the
 * state entering each chunk hs (ns, nv, dk, dv) bf16, ns = ceil(T / 64), and vn (T, nv, dv) bf16; dkept = the
 * state gradient leaving each chunk dhs (ns, nv, dk, dv) bf16 and dvn (T, nv, dv) bf16, and the DOUT stage's
 * factors of the reverse pass (the workspace's in a whole backward: W, dec * K, scale gam * q (T, nv, dk) bf16, P
 * (T, nv, dv) and gam_{L-1} (ns, nv, dk) fp32; ~1.3 KB per token and value head of 128); each on a 256-byte
 * boundary. vn, dvn, qk, hs and dhs are bf16: every tensor-core reader took them as operands rounded to bf16
 * (round to nearest even), and the writer rounds the same fp32 value once instead, so those readers see the same
 * bits in half the bytes. The one other reader, grad_dense's row dots S_a . D_a (dL/dG_{L-1}'s term), takes the
 * bf16 values of hs and dhs with fp32 products and sum (every MMA's kind: operands rounded to bf16 once, fp32
 * accumulation); only dg's bits differ from fp32 storage. S0, S_final, dS0, dS_final and M stay fp32.
 * A chunk's slot is t0 / 64: among the chunks that store an entering state (no document start) or a leaving
 * gradient (a state leaves it: it is 64 rows long or the call's last), no two share a 64-row block, since such
 * a chunk either covers its block to the end or is the last one to start in it. The workspace (grown, never
 * shrunk, through cuda_internal_alloc) holds the index, qk (T, nv, 64) bf16 (the forward's), the state passes'
 * factors (KdaBufs: wb, xb, gq (T, nv, dk) bf16, ux (T, nv, dv) and gl (ns, nv, dk) fp32; ux and gl are
 * reused by the gradients once the passes are done) and whatever kept / dkept does not: O(T nv dk dv / 64) bytes,
 * no pieces (GDN_PIECE_ROWS does not apply here).
 *
 * Numerics (GDN's kind: common.cuh): the products run on tensor cores (cuda_gdn_mma.h's gdn_warp_mma: wu's W and
 * U, the state passes, the output, prep's A and qk's QK and P, grad_dense's products of S and D, grad_wy's dT, dXu,
 * M1, dA, dXw and A pairs, grad_qk's dP and QK pairs), every operand formed in fp32 rounded to bf16 once and one
 * MMA per product into fp32 accumulators (test_cuda_kda.cu's bounds: 1e-2, as GDN's); the solve for Tinv, the
 * carried states, G and the exponents fp32 (G summed in double); the pairwise decay in 16-row sub-chunks (prep.cuh,
 * grads.cuh), fp32 on the diagonal blocks. Every decay factor e^{later - earlier} <= 1 (pairs j > r never
 * evaluated), every output element one warp's or thread's fixed order of operations, no atomics: deterministic,
 * the same bits run to run.
 *
 * Callers: the cuda backend table (the model's KDA layers, lib/cp/cp_gdn_fragment.c), tests/cuda/test_cuda_kda.cu.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h" /* GDN_KEPT_*, GDN_BWD_*, gdn_kept_flags_fault */
#include "cuda_common.h"
#include "cuda_gdn_mma.h"
#include "cuda_kernels.h"

/* the per-kernel profile of `ringscan bench kda --profile 1` (kernels/cuda/gdn/gdn_profile.cu): events on the
 * stream after each kernel, printed at the entry's end; off (no event) unless a bench turned it on */
extern int gdn_prof_level;
void gdn_prof_start(int on);
void gdn_prof_mark(const char *name);
void gdn_prof_end(const char *who, int64_t T, int nv);

#include "common.cuh"
#include "index.cuh"
#include "prep.cuh"
#include "wu.cuh"
#include "state_pass.cuh"
#include "output.cuh"
#include "grads.cuh"

/* ------------------------------------------------------------------------------------------------ */
/* buffers                                                                                            */

typedef struct KdaBufs {
    int32_t *starts, *meta; /* the index: (T+1), (KDA_META_N) */
    float *tinv;            /* (T,nv,64) */
    bf16 *qk;               /* (T,nv,64) */
    bf16 *hs, *dhs;         /* (ns,nv,dk,dv) */
    bf16 *vn, *dvn;         /* (T,nv,dv) */
    float *dqv, *dkv;       /* (T,nv,dk): per value head, before the key-head sum (over wb, xb where both exist) */
    bf16 *wb, *xb;          /* (T,nv,dk): the passes' W and dec * K (wu.cuh), each at the start of a region of
                             * (T,nv,dk) fp32 that dqv, dkv take after the passes */
    float *ux;              /* (T,nv,dv): U for the forward pass, then P = scale QK^T dO for the backward's */
    float *gl;              /* (ns,nv,dk): gam_{L-1} by slot (chunks without a document start) */
    bf16 *gq;               /* (T,nv,dk): scale gam * q, for the backward pass */
    float *da, *dbp;        /* (T,nv,64), (T,nv,2): grad_wy's dA and the pairs' dbeta partial sums */
} KdaBufs;

/* PASS: the factors of either state pass (wb, xb, ux, gl); BPASS: the backward pass's gq */
enum {
    KDA_NEED_TINV = 1,
    KDA_NEED_QK = 2,
    KDA_NEED_STATES = 4,
    KDA_NEED_DSTATES = 8,
    KDA_NEED_DQK = 16,
    KDA_NEED_PASS = 32,
    KDA_NEED_BPASS = 64
};

/* host-side carving on 256-byte boundaries (base NULL: sizes only); a base (the workspace, a caller's kept or dkept
 * buffer) must be 16-byte aligned: the kernels copy the bf16 rows of vn, dvn and qk by 16-byte cp.async */
struct KdaHostCarve {
    unsigned char *base;
    size_t off;
    explicit KdaHostCarve(void *b) : base((unsigned char *)b), off(0) {
        RS_CHECK(((uintptr_t)b & 15) == 0, "kda: a kept, dkept or workspace buffer at %p is not 16-byte aligned", b);
    }
    template <class X> X *take(size_t n) {
        X *r = base ? (X *)(base + off) : NULL;
        off += (n * sizeof(X) + 255) & ~(size_t)255;
        return r;
    }
};

static int64_t kda_slots(int64_t T) { return (T + KDA_C - 1) / KDA_C; }

static size_t kda_kept_carve(KdaBufs *b, void *kept, int64_t T, int nv, int dk, int dv, int states) {
    KdaHostCarve c(kept);
    const size_t tv = (size_t)T * nv;
    float *tinv = c.take<float>(tv * KDA_C);
    bf16 *hs = states ? c.take<bf16>((size_t)kda_slots(T) * nv * dk * dv) : NULL;
    bf16 *vn = states ? c.take<bf16>(tv * dv) : NULL;
    if (b) {
        b->tinv = tinv;
        if (states) {
            b->hs = hs;
            b->vn = vn;
        }
    }
    return c.off;
}

/* dkept: the reverse pass's results dhs, dvn and the DOUT stage's factors for the STATE stage (wb, xb, gq, P, gl:
 * wu's with_u 0 and qk's backward form, kept per fragment because other calls reuse the workspace between the two
 * stages); factors 0 leaves b's factor buffers the workspace's (GRADS: its scratch, and dqv, dkv over wb, xb) */
static size_t kda_dkept_carve(KdaBufs *b, void *dkept, int64_t T, int nv, int dk, int dv, int factors) {
    KdaHostCarve c(dkept);
    bf16 *dhs = c.take<bf16>((size_t)kda_slots(T) * nv * dk * dv);
    bf16 *dvn = c.take<bf16>((size_t)T * nv * dv);
    if (b) {
        b->dhs = dhs;
        b->dvn = dvn;
    }
    const size_t tv = (size_t)T * nv;
    bf16 *wb = c.take<bf16>(tv * dk), *xb = c.take<bf16>(tv * dk), *gq = c.take<bf16>(tv * dk);
    float *p = c.take<float>(tv * dv), *gl = c.take<float>((size_t)kda_slots(T) * nv * dk);
    if (b && factors) {
        b->wb = wb;
        b->xb = xb;
        b->gq = gq;
        b->ux = p;
        b->gl = gl;
    }
    return c.off;
}

static size_t kda_ws_carve(KdaBufs *b, void *base, int64_t T, int nv, int dk, int dv, int need) {
    KdaHostCarve c(base);
    const size_t tv = (size_t)T * nv, hsz = (size_t)kda_slots(T) * nv * dk * dv;
    *b = KdaBufs{};
    b->starts = c.take<int32_t>((size_t)T + 1);
    b->meta = c.take<int32_t>(KDA_META_N);
    if (need & KDA_NEED_TINV) b->tinv = c.take<float>(tv * KDA_C);
    if (need & KDA_NEED_QK) b->qk = c.take<bf16>(tv * KDA_C);
    if (need & KDA_NEED_STATES) {
        b->hs = c.take<bf16>(hsz);
        b->vn = c.take<bf16>(tv * dv);
    }
    if (need & KDA_NEED_DSTATES) {
        b->dhs = c.take<bf16>(hsz);
        b->dvn = c.take<bf16>(tv * dv);
    }
    if (need & KDA_NEED_PASS) {
        b->wb = (bf16 *)c.take<float>(tv * dk);
        b->xb = (bf16 *)c.take<float>(tv * dk);
        b->ux = c.take<float>(tv * dv);
        b->gl = c.take<float>((size_t)kda_slots(T) * nv * dk);
    }
    if (need & KDA_NEED_BPASS) b->gq = c.take<bf16>(tv * dk);
    if ((need & KDA_NEED_DQK) && (need & KDA_NEED_PASS)) { /* the gradients run after the passes: over wb, xb */
        b->dqv = (float *)b->wb;
        b->dkv = (float *)b->xb;
    } else if (need & KDA_NEED_DQK) {
        b->dqv = c.take<float>(tv * dk);
        b->dkv = c.take<float>(tv * dk);
    }
    if (need & KDA_NEED_DQK) {
        b->da = c.take<float>(tv * KDA_C);
        b->dbp = c.take<float>(tv * 2);
    }
    return c.off;
}

static size_t kda_ws_grown(size_t bytes) {
    return (bytes + bytes / 8 + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
}

/* The workspace the entries grow to for fragments of frag tokens (BackendSizes, for plan and model_acts): the
 * larger of the forward's and the backward's of a whole fragment without a kept buffer (the backward's is the
 * larger by far; with kept_states its states live in kept), grown as kda_buffers grows it. cp changes nothing:
 * the transition and dstate need less. */
extern "C" size_t cuda_kda_workspace_bytes(int64_t frag, int cp, int nv, int dk, int dv, int kept_states) {
    KdaBufs b;
    const int states = kept_states ? 0 : KDA_NEED_STATES;
    const int fwd = KDA_NEED_TINV | KDA_NEED_QK | states | KDA_NEED_PASS;
    const int bwd = KDA_NEED_TINV | states | KDA_NEED_DSTATES | KDA_NEED_DQK | KDA_NEED_PASS | KDA_NEED_BPASS;
    const size_t f = kda_ws_carve(&b, NULL, frag, nv, dk, dv, fwd), w = kda_ws_carve(&b, NULL, frag, nv, dk, dv, bwd);
    return kda_ws_grown(f > w ? f : w);
}

static void *kda_ws;        /* the device workspace */
static size_t kda_ws_bytes; /* its size */

/* the call's buffers carved from the workspace, grown (never shrunk) through cuda_internal_alloc: the old
 * buffer is freed after the device is idle (growth only) */
static KdaBufs kda_buffers(int64_t T, int nv, int dk, int dv, int need) {
    KdaBufs b;
    const size_t bytes = kda_ws_carve(&b, NULL, T, nv, dk, dv, need);
    if (bytes > kda_ws_bytes) {
        const size_t want = kda_ws_grown(bytes);
        if (kda_ws) {
            CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
            cuda_internal_free(kda_ws, kda_ws_bytes);
        }
        kda_ws = cuda_internal_alloc(want);
        kda_ws_bytes = want;
    }
    kda_ws_carve(&b, kda_ws, T, nv, dk, dv, need);
    return b;
}

/* ------------------------------------------------------------------------------------------------ */
/* launches                                                                                           */

static int kda_max_smem(void) {
    static int v = -1;
    if (v < 0) {
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    }
    return v;
}

/* raises the kernel's dynamic shared memory limit to `bytes` (checked against the device's) */
template <class K> static void kda_smem_attr(K kernel, size_t bytes, const char *name) {
    RS_CHECK((int)bytes <= kda_max_smem(), "kda: %s needs %zu bytes of shared memory, the device allows %d", name,
             bytes, kda_max_smem());
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

/* per-chunk kernels: blocks stride over the chunks (their count is on the device) */
static dim3 kda_chunk_grid(int64_t T, int nv) {
    int64_t n = (T + KDA_C - 1) / KDA_C;
    if (n < 1) n = 1;
    if (n > (1 << 20)) n = 1 << 20;
    return dim3((unsigned)n, (unsigned)nv);
}

static void kda_index(const KdaBufs *b, const int32_t *doc_pos, int64_t T) {
    kda_index_kernel<<<1, 1024, 0, cuda_stream()>>>(b->starts, b->meta, doc_pos, T);
    CUDA_LAUNCH_CHECK();
    gdn_prof_mark("index");
}

template <int DK>
static void kda_prep_dk(float *tinv, const bf16 *k, const float *g, const float *beta, const KdaBufs *b,
                        const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq) {
    const size_t smem = KdaPairSmem<DK, true>(NULL).bytes;
    kda_smem_attr(kda_prep_kernel<DK>, smem, "prep");
    kda_prep_kernel<DK><<<kda_chunk_grid(T, nv), KDA_THREADS, smem, cuda_stream()>>>(tinv, k, g, beta, b->starts,
                                                                                    b->meta, doc_pos, T, nk, nv, ldq);
    CUDA_LAUNCH_CHECK();
    gdn_prof_mark("prep");
}

static void kda_prep(const KdaBufs *b, float *tinv, const bf16 *k, const float *g, const float *beta,
                     const int32_t *doc_pos, int64_t T, int nk, int nv, int dk, int ldq) {
    if (dk == 128) kda_prep_dk<128>(tinv, k, g, beta, b, doc_pos, T, nk, nv, ldq);
    else kda_prep_dk<64>(tinv, k, g, beta, b, doc_pos, T, nk, nv, ldq);
}

/* the forward's prep and qk in one launch (kda_prep_qk_kernel): Tinv into tinv, QK into b->qk, the bits of
 * kda_prep and kda_qk */
template <int DK>
static void kda_prep_qk_dk(float *tinv, const bf16 *q, const bf16 *k, const float *g, const float *beta,
                           const KdaBufs *b, const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq) {
    const size_t smem = KdaPrepQkSmem<DK>(NULL).bytes;
    kda_smem_attr(kda_prep_qk_kernel<DK>, smem, "prep_qk");
    kda_prep_qk_kernel<DK><<<kda_chunk_grid(T, nv), KDA_THREADS, smem, cuda_stream()>>>(
        tinv, b->qk, q, k, g, beta, b->starts, b->meta, doc_pos, T, nk, nv, ldq);
    CUDA_LAUNCH_CHECK();
    gdn_prof_mark("prep_qk");
}

static void kda_prep_qk(const KdaBufs *b, float *tinv, const bf16 *q, const bf16 *k, const float *g,
                        const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dk, int ldq) {
    if (dk == 128) kda_prep_qk_dk<128>(tinv, q, k, g, beta, b, doc_pos, T, nk, nv, ldq);
    else kda_prep_qk_dk<64>(tinv, q, k, g, beta, b, doc_pos, T, nk, nv, ldq);
}

/* QK into b->qk (the forward's), or with dout (BWD) the backward pass's gq and P (into b->ux) from it */
template <int DK, bool BWD>
static void kda_qk_dk(const KdaBufs *b, const bf16 *q, const bf16 *k, const float *g, const bf16 *dout,
                      const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq, int ldo) {
    const size_t smem = KdaPairSmem<DK, false>(NULL).bytes;
    kda_smem_attr(kda_qk_kernel<DK, BWD>, smem, "qk");
    const float scale = (float)(1.0 / sqrt((double)DK));
    kda_qk_kernel<DK, BWD><<<kda_chunk_grid(T, nv), KDA_THREADS, smem, cuda_stream()>>>(
        b->qk, b->gq, b->ux, q, k, g, dout, b->starts, b->meta, doc_pos, T, nk, nv, ldq, ldo, scale);
    CUDA_LAUNCH_CHECK();
    gdn_prof_mark("qk");
}

static void kda_qk(const KdaBufs *b, const bf16 *q, const bf16 *k, const float *g, const int32_t *doc_pos, int64_t T,
                   int nk, int nv, int dk, int ldq) {
    if (dk == 128) kda_qk_dk<128, false>(b, q, k, g, NULL, doc_pos, T, nk, nv, ldq, 0);
    else kda_qk_dk<64, false>(b, q, k, g, NULL, doc_pos, T, nk, nv, ldq, 0);
}

static void kda_qk_bwd(const KdaBufs *b, const bf16 *q, const bf16 *k, const float *g, const bf16 *dout,
                       const int32_t *doc_pos, int64_t T, int nk, int nv, int dk, int dv, int ldq, int ldo) {
    RS_CHECK(dv == dk, "kda qk: dim_v = %d != dim_k = %d", dv, dk);
    if (dk == 128) kda_qk_dk<128, true>(b, q, k, g, dout, doc_pos, T, nk, nv, ldq, ldo);
    else kda_qk_dk<64, true>(b, q, k, g, dout, doc_pos, T, nk, nv, ldq, ldo);
}

/* the state passes' chunk-parallel factors (wu.cuh): W, dec * K, gam_{L-1}, and U where with_u (the forward pass
 * runs) */
template <int DK>
static void kda_wu_dk(const KdaBufs *b, int with_u, const float *tinv, const bf16 *k, const bf16 *v, const float *g,
                      const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq, int ldv) {
    const size_t smem = KdaWuSmem<DK>(NULL).bytes;
    kda_smem_attr(kda_wu_kernel<DK>, smem, "wu");
    kda_wu_kernel<DK><<<kda_chunk_grid(T, nv), KDA_THREADS, smem, cuda_stream()>>>(
        b->wb, b->xb, with_u ? b->ux : NULL, b->gl, k, v, g, beta, tinv, b->starts, b->meta, doc_pos, T, nk, nv, ldq,
        ldv);
    CUDA_LAUNCH_CHECK();
    gdn_prof_mark("wu");
}

static void kda_wu(const KdaBufs *b, int with_u, const float *tinv, const bf16 *k, const bf16 *v, const float *g,
                   const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dk, int dv, int ldq,
                   int ldv) {
    RS_CHECK(dv == dk, "kda wu: dim_v = %d != dim_k = %d", dv, dk);
    if (dk == 128) kda_wu_dk<128>(b, with_u, tinv, k, v, g, beta, doc_pos, T, nk, nv, ldq, ldv);
    else kda_wu_dk<64>(b, with_u, tinv, k, v, g, beta, doc_pos, T, nk, nv, ldq, ldv);
}

/* The state passes' columns per block: the smallest of 16, 32, 64 whose grid of (columns / BV) x nv blocks fits one
 * wave on the device (one block per SM counted: a pass is sequential over the chunks, so a second wave would
 * double its time), else 64 (fewer, larger blocks). Fixed by the shape and the device, so the bits are the same on
 * every run; every BV gives the same bits per column (each column's products run in the same order). */
static int kda_num_sms(void) {
    static int v = -1;
    if (v < 0) {
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    }
    return v;
}

static int kda_state_bv(int ncol, int nv) {
    for (int bv = 16; bv < 64; bv *= 2)
        if ((int64_t)(ncol / bv) * nv <= kda_num_sms()) return bv;
    return 64;
}

/* the forward state pass over dv columns (and dk more for the transition's M when M_out), from wu's factors */
template <int DK, int BV>
static void kda_state_fwd_dk(bf16 *hs, bf16 *vn, float *S_out, float *M_out, const float *S0, const KdaBufs *b,
                             const int32_t *doc_pos, int64_t T, int nv, int dv) {
    const size_t smem = KdaSfwdSmem<DK, BV>(NULL).bytes;
    kda_smem_attr(kda_state_fwd_kernel<DK, BV>, smem, "state_fwd");
    const int ncol = dv + (M_out ? DK : 0);
    kda_state_fwd_kernel<DK, BV><<<dim3((unsigned)(ncol / BV), (unsigned)nv), KDA_THREADS, smem, cuda_stream()>>>(
        hs, vn, S_out, M_out, S0, b->wb, b->xb, b->ux, b->gl, b->starts, b->meta, doc_pos, T, nv, dv);
    CUDA_LAUNCH_CHECK();
    gdn_prof_mark("state_fwd");
}

static void kda_state_fwd(const KdaBufs *b, bf16 *hs, bf16 *vn, float *S_out, float *M_out, const float *S0,
                          const int32_t *doc_pos, int64_t T, int nv, int dk, int dv) {
    const int bv = kda_state_bv(dv + (M_out ? dk : 0), nv);
#define KDA_SFWD(DK_, BV_) kda_state_fwd_dk<DK_, BV_>(hs, vn, S_out, M_out, S0, b, doc_pos, T, nv, dv)
    if (dk == 128) {
        if (bv == 16) KDA_SFWD(128, 16);
        else if (bv == 32) KDA_SFWD(128, 32);
        else KDA_SFWD(128, 64);
    } else {
        if (bv == 16) KDA_SFWD(64, 16);
        else if (bv == 32) KDA_SFWD(64, 32);
        else KDA_SFWD(64, 64);
    }
#undef KDA_SFWD
}

/* the backward state pass, from wu's factors and kda_qk_bwd's */
template <int DK, int BV>
static void kda_state_bwd_dk(bf16 *dhs, bf16 *dvn, float *dS0, const float *dS_final, const bf16 *dout,
                             const KdaBufs *b, const int32_t *doc_pos, int64_t T, int nv, int dv, int ldo) {
    const size_t smem = KdaSbwdSmem<DK, BV>(NULL).bytes;
    kda_smem_attr(kda_state_bwd_kernel<DK, BV>, smem, "state_bwd");
    kda_state_bwd_kernel<DK, BV><<<dim3((unsigned)(dv / BV), (unsigned)nv), KDA_THREADS, smem, cuda_stream()>>>(
        dhs, dvn, dS0, dS_final, b->wb, b->xb, b->gq, b->ux, b->gl, dout, b->starts, b->meta, doc_pos, T, nv, dv,
        ldo);
    CUDA_LAUNCH_CHECK();
    gdn_prof_mark("state_bwd");
}

static void kda_state_bwd(const KdaBufs *b, bf16 *dhs, bf16 *dvn, float *dS0, const float *dS_final,
                          const bf16 *dout, const int32_t *doc_pos, int64_t T, int nv, int dk, int dv, int ldo) {
    const int bv = kda_state_bv(dv, nv);
#define KDA_SBWD(DK_, BV_) kda_state_bwd_dk<DK_, BV_>(dhs, dvn, dS0, dS_final, dout, b, doc_pos, T, nv, dv, ldo)
    if (dk == 128) {
        if (bv == 16) KDA_SBWD(128, 16);
        else if (bv == 32) KDA_SBWD(128, 32);
        else KDA_SBWD(128, 64);
    } else {
        if (bv == 16) KDA_SBWD(64, 16);
        else if (bv == 32) KDA_SBWD(64, 32);
        else KDA_SBWD(64, 64);
    }
#undef KDA_SBWD
}

template <int DK>
static void kda_output_dk(const KdaBufs *b, bf16 *o, const bf16 *q, const float *g, const bf16 *hs, const bf16 *vn,
                          const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq, int ldo) {
    const size_t smem = KdaOutSmem<DK>(NULL).bytes;
    kda_smem_attr(kda_output_kernel<DK>, smem, "output");
    const float scale = (float)(1.0 / sqrt((double)DK));
    kda_output_kernel<DK><<<kda_chunk_grid(T, nv), KDA_THREADS, smem, cuda_stream()>>>(
        o, q, g, hs, vn, b->qk, b->starts, b->meta, doc_pos, T, nk, nv, ldq, ldo, scale);
    CUDA_LAUNCH_CHECK();
    gdn_prof_mark("output");
}

static void kda_output(const KdaBufs *b, bf16 *o, const bf16 *q, const float *g, const bf16 *hs, const bf16 *vn,
                       const int32_t *doc_pos, int64_t T, int nk, int nv, int dk, int dv, int ldq, int ldo) {
    RS_CHECK(dv == dk, "kda output: dim_v = %d != dim_k = %d", dv, dk);
    if (dk == 128) kda_output_dk<128>(b, o, q, g, hs, vn, doc_pos, T, nk, nv, ldq, ldo);
    else kda_output_dk<64>(b, o, q, g, hs, vn, doc_pos, T, nk, nv, ldq, ldo);
}

template <int DK>
static void kda_grad_dense(const KdaBufs *b, float *dg, const bf16 *dout, const int32_t *doc_pos, int64_t T, int nv,
                           int ldo) {
    const size_t smem = KdaGdSmem<DK>(NULL).bytes;
    kda_smem_attr(kda_grad_dense_kernel<DK>, smem, "grad_dense");
    kda_grad_dense_kernel<DK><<<kda_chunk_grid(T, nv), KDA_THREADS, smem, cuda_stream()>>>(
        (bf16 *)dg, b->dqv, b->ux, b->gl, b->hs, b->dhs, b->vn, b->dvn, dout, b->starts, b->meta, doc_pos, T, nv, ldo);
    CUDA_LAUNCH_CHECK();
    gdn_prof_mark("grad_dense");
}

template <int DK>
static void kda_grad_wy(const KdaBufs *b, float *dg, bf16 *dv_out, float *dbeta, const bf16 *k, const bf16 *v,
                        const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq,
                        int ldv) {
    const size_t smem = KdaGwySmem<DK>(NULL).bytes, smem_p = KdaGwpSmem<DK>(NULL).bytes;
    kda_smem_attr(kda_grad_wy_kernel<DK>, smem, "grad_wy");
    kda_smem_attr(kda_grad_wy_pairs_kernel<DK>, smem_p, "grad_wy_pairs");
    kda_grad_wy_kernel<DK><<<kda_chunk_grid(T, nv), KDA_THREADS, smem, cuda_stream()>>>(
        dv_out, dbeta, b->dkv, b->da, (const bf16 *)dg, k, v, g, beta, b->tinv, b->dvn, b->starts, b->meta, doc_pos, T,
        nk, nv, ldq, ldv);
    CUDA_LAUNCH_CHECK();
    dim3 grid = kda_chunk_grid(T, nv);
    grid.z = 2; /* the two halves of the key channels */
    kda_grad_wy_pairs_kernel<DK><<<grid, KDA_THREADS, smem_p, cuda_stream()>>>(
        b->dbp, b->dkv, dg, b->da, k, g, beta, b->starts, b->meta, doc_pos, T, nk, nv, ldq);
    CUDA_LAUNCH_CHECK();
    const int64_t n = T * nv;
    if (n > 0) {
        kda_dbeta_sum_kernel<<<(unsigned)((n + 255) / 256), 256, 0, cuda_stream()>>>(dbeta, b->dbp, n);
        CUDA_LAUNCH_CHECK();
    }
    gdn_prof_mark("grad_wy");
}

template <int DK>
static void kda_grad_qk(const KdaBufs *b, bf16 *dq, bf16 *dk_out, float *dg, const bf16 *dout, const bf16 *q,
                        const bf16 *k, const float *g, const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq,
                        int ldo) {
    const size_t smem = KdaGqkSmem<DK>(NULL).bytes;
    kda_smem_attr(kda_grad_qk_kernel<DK>, smem, "grad_qk");
    const float scale = (float)(1.0 / sqrt((double)DK));
    dim3 grid = kda_chunk_grid(T, nv);
    grid.z = 2; /* the two halves of the key channels */
    kda_grad_qk_kernel<DK><<<grid, KDA_THREADS, smem, cuda_stream()>>>(
        b->dqv, b->dkv, dq, dk_out, dg, q, k, g, dout, b->vn, b->ux, b->gl, b->starts, b->meta, doc_pos, T, nk, nv,
        ldq, ldo, scale);
    CUDA_LAUNCH_CHECK();
    gdn_prof_mark("grad_qk");
}

/* the per-chunk gradients: grad_dense (dW in bf16 into dg's storage, S_a . dO_r into dqv's: both read by the next
 * kernels before they write there; D_a . vn_r into ux and S_a . D_a into gl, the state passes' buffers, free by now),
 * grad_wy, grad_qk, the sum over the value heads (with one value head per key head, nv = nk, grad_qk writes dq and
 * dk in bf16 itself, the sum's bits, and the sum is not run) */
static void kda_grads(const KdaBufs *b, bf16 *dq, bf16 *dk_out, bf16 *dv_out, float *dg, float *dbeta,
                      const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v, const float *g, const float *beta,
                      const int32_t *doc_pos, int64_t T, int nk, int nv, int dk, int dv, int ldq, int ldv, int ldo) {
    RS_CHECK(dv == dk, "kda grads: dim_v = %d != dim_k = %d", dv, dk);
    if (dk == 128) kda_grad_dense<128>(b, dg, dout, doc_pos, T, nv, ldo);
    else kda_grad_dense<64>(b, dg, dout, doc_pos, T, nv, ldo);
    if (dk == 128) kda_grad_wy<128>(b, dg, dv_out, dbeta, k, v, g, beta, doc_pos, T, nk, nv, ldq, ldv);
    else kda_grad_wy<64>(b, dg, dv_out, dbeta, k, v, g, beta, doc_pos, T, nk, nv, ldq, ldv);
    bf16 *dq1 = nv == nk ? dq : NULL, *dk1 = nv == nk ? dk_out : NULL;
    if (dk == 128) kda_grad_qk<128>(b, dq1, dk1, dg, dout, q, k, g, doc_pos, T, nk, nv, ldq, ldo);
    else kda_grad_qk<64>(b, dq1, dk1, dg, dout, q, k, g, doc_pos, T, nk, nv, ldq, ldo);
    if (nv == nk) return;
    const int64_t n = T * nk * dk;
    kda_group_reduce_kernel<<<(unsigned)((n + 255) / 256), 256, 0, cuda_stream()>>>(dq, dk_out, b->dqv, b->dkv, T, nk,
                                                                                     nv, dk, ldq);
    CUDA_LAUNCH_CHECK();
    gdn_prof_mark("group_reduce");
}

/* ------------------------------------------------------------------------------------------------ */
/* the Backend entries                                                                                */

static void kda_check_args(const char *who, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv,
                           int ldo) {
    RS_CHECK(T >= 0 && T < (int64_t)INT32_MAX - 128, "%s: T = %lld", who, (long long)T);
    RS_CHECK(nk > 0 && nv > 0 && nv % nk == 0, "%s: nk = %d, nv = %d (nv must be a multiple of nk)", who, nk, nv);
    RS_CHECK((dim_k == 64 || dim_k == 128) && dim_v == dim_k,
             "%s: dim_k = %d, dim_v = %d: the cuda KDA kernels take dim_k = dim_v = 64 or 128 (kimi_linear's one "
             "head_dim; dim_k != dim_v is written for but not tested)", who, dim_k, dim_v);
    RS_CHECK((int64_t)ldq >= (int64_t)nk * dim_k, "%s: ldq = %d < nk*dim_k = %d", who, ldq, nk * dim_k);
    RS_CHECK(ldv == 0 || (int64_t)ldv >= (int64_t)nv * dim_v, "%s: ldv = %d < nv*dim_v = %d", who, ldv, nv * dim_v);
    RS_CHECK(ldo == 0 || (int64_t)ldo >= (int64_t)nv * dim_v, "%s: ldo = %d < nv*dim_v = %d", who, ldo, nv * dim_v);
}

static void kda_copy_or_zero(float *dst, const float *src, size_t n) {
    if (src) CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, cuda_stream()));
    else CUDA_CHECK(cudaMemsetAsync(dst, 0, n * sizeof(float), cuda_stream()));
}

extern "C" size_t cuda_kda_kept_bytes(int64_t T, int nv, int dim_k, int dim_v, int states) {
    return kda_kept_carve(NULL, NULL, T, nv, dim_k, dim_v, states);
}

extern "C" size_t cuda_kda_dkept_bytes(int64_t T, int nv, int dim_k, int dim_v) {
    return kda_dkept_carve(NULL, NULL, T, nv, dim_k, dim_v, 1);
}

extern "C" void cuda_kda_chunk_forward(void *o_ /* (T,ldo) nv heads of dim_v; NULL: the state pass alone */,
                                       float *S_final /* (nv,dim_k,dim_v) or NULL */, const void *q_ /* (T,ldq) */,
                                       const void *k_ /* (T,ldq) */, const void *v_ /* (T,ldv) */,
                                       const float *g /* (T,nv,dim_k) */, const float *beta /* (T,nv) */,
                                       const float *S0 /* (nv,dim_k,dim_v) or NULL */, const int32_t *doc_pos,
                                       int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo,
                                       void *kept /* cuda_kda_kept_bytes, or NULL */, int kept_flags) {
    kda_check_args("cuda_kda_chunk_forward", T, nk, nv, dim_k, dim_v, ldq, ldv, ldo);
    const char *fault = gdn_kept_flags_fault(o_, S_final, kept, kept_flags);
    RS_CHECK(!fault, "cuda_kda_chunk_forward: %s (kept_flags = %d)", fault ? fault : "", kept_flags);
    /* GDN_KEPT_STATES without a kept buffer keeps nothing (the model's first forward under checkpoint.activations
     * full / remat with gdn_keep states): the states then live in the workspace, as without the flag */
    const int kept_states = kept && (kept_flags & GDN_KEPT_STATES) != 0;
    const int states_in = (kept_flags & GDN_KEPT_STATES_IN) != 0;
    const int prep_in = (kept_flags & GDN_KEPT_PREP_IN) != 0 || states_in;
    if (T == 0) {
        if (S_final) kda_copy_or_zero(S_final, S0, (size_t)nv * dim_k * dim_v);
        return;
    }
    bf16 *o = (bf16 *)o_;
    const bf16 *q = (const bf16 *)q_, *k = (const bf16 *)k_, *v = (const bf16 *)v_;
    const int need = (kept ? 0 : KDA_NEED_TINV) | (o ? KDA_NEED_QK : 0) | (kept_states ? 0 : KDA_NEED_STATES) |
                     (states_in ? 0 : KDA_NEED_PASS);
    KdaBufs b = kda_buffers(T, nv, dim_k, dim_v, need);
    if (kept) kda_kept_carve(&b, kept, T, nv, dim_k, dim_v, kept_states);
    gdn_prof_start(gdn_prof_level > 0);
    kda_index(&b, doc_pos, T);
    /* prep and qk in one pass where both run (the same bits as apart: the kept prep's path) */
    if (!prep_in && o) kda_prep_qk(&b, b.tinv, q, k, g, beta, doc_pos, T, nk, nv, dim_k, ldq);
    else if (!prep_in) kda_prep(&b, b.tinv, k, g, beta, doc_pos, T, nk, nv, dim_k, ldq);
    if (!states_in) {
        kda_wu(&b, 1, b.tinv, k, v, g, beta, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv);
        kda_state_fwd(&b, b.hs, b.vn, S_final, NULL, S0, doc_pos, T, nv, dim_k, dim_v);
    }
    if (o) {
        if (prep_in) kda_qk(&b, q, k, g, doc_pos, T, nk, nv, dim_k, ldq);
        kda_output(&b, o, q, g, b.hs, b.vn, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldo);
    }
    gdn_prof_end("kda forward", T, nv);
}

/* the backward, whole (stage 0) or one stage (the header) */
static void kda_backward(const char *who, int stage, void *dkept, void *dq, void *dk, void *dv, float *dg,
                         float *dbeta, float *dS0, const void *dout_, const float *dS_final, const void *q_,
                         const void *k_, const void *v_, const float *g, const float *beta, const float *S0,
                         const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv,
                         int ldo, const void *kept, int kept_states) {
    kda_check_args(who, T, nk, nv, dim_k, dim_v, ldq, ldv, ldo);
    if (T == 0) {
        if (dS0 && (stage == 0 || stage == GDN_BWD_STATE)) kda_copy_or_zero(dS0, dS_final, (size_t)nv * dim_k * dim_v);
        return;
    }
    const bf16 *dout = (const bf16 *)dout_, *q = (const bf16 *)q_, *k = (const bf16 *)k_, *v = (const bf16 *)v_;
    /* the parts: DOUT the reverse pass's factors (into dkept when staged), STATE the pass, GRADS the rest */
    const int run_dout = stage == 0 || stage == GDN_BWD_DOUT, run_state = stage == 0 || stage == GDN_BWD_STATE,
              run_grads = stage == 0 || stage == GDN_BWD_GRADS;
    const int run_fwd = !(kept && kept_states) && stage == 0;
    const int need = (kept ? 0 : KDA_NEED_TINV) | (kept && kept_states ? 0 : KDA_NEED_STATES) |
                     (stage == 0 ? KDA_NEED_DSTATES | KDA_NEED_BPASS : 0) |
                     (run_grads ? KDA_NEED_DQK | KDA_NEED_PASS : 0); /* PASS: the grads use ux and gl too */
    KdaBufs b = kda_buffers(T, nv, dim_k, dim_v, need);
    if (kept) kda_kept_carve(&b, (void *)kept, T, nv, dim_k, dim_v, kept_states);
    if (stage) kda_dkept_carve(&b, dkept, T, nv, dim_k, dim_v, stage != GDN_BWD_GRADS);
    gdn_prof_start(gdn_prof_level > 0);
    kda_index(&b, doc_pos, T);
    if (!kept) kda_prep(&b, b.tinv, k, g, beta, doc_pos, T, nk, nv, dim_k, ldq);
    if (run_dout) kda_wu(&b, run_fwd, b.tinv, k, v, g, beta, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv);
    if (run_fwd) kda_state_fwd(&b, b.hs, b.vn, NULL, NULL, S0, doc_pos, T, nv, dim_k, dim_v);
    if (run_dout) kda_qk_bwd(&b, q, k, g, dout, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldo); /* P takes U's place */
    if (run_state) kda_state_bwd(&b, b.dhs, b.dvn, dS0, dS_final, dout, doc_pos, T, nv, dim_k, dim_v, ldo);
    if (run_grads)
        kda_grads(&b, (bf16 *)dq, (bf16 *)dk, (bf16 *)dv, dg, dbeta, dout, q, k, v, g, beta, doc_pos, T, nk, nv, dim_k,
                  dim_v, ldq, ldv, ldo);
    static const char *const names[] = {"kda backward", "kda backward dout stage", "kda backward state stage",
                                        "kda backward grads stage"};
    gdn_prof_end(names[stage], T, nv);
}

extern "C" void cuda_kda_chunk_backward(void *dq /* (T,ldq) */, void *dk /* (T,ldq) */, void *dv /* (T,ldv) */,
                                        float *dg /* (T,nv,dim_k) */, float *dbeta /* (T,nv) */,
                                        float *dS0 /* (nv,dim_k,dim_v) or NULL */, const void *dout /* (T,ldo) */,
                                        const float *dS_final /* or NULL */, const void *q, const void *k,
                                        const void *v, const float *g, const float *beta, const float *S0,
                                        const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v,
                                        int ldq, int ldv, int ldo, const void *kept /* the forward's, or NULL */,
                                        int kept_states) {
    kda_backward("cuda_kda_chunk_backward", 0, NULL, dq, dk, dv, dg, dbeta, dS0, dout, dS_final, q, k, v, g, beta, S0,
                 doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv, ldo, kept, kept_states);
}

extern "C" void cuda_kda_chunk_backward_stage(int stage /* GDN_BWD_DOUT, _STATE, _GRADS */,
                                              void *dkept /* cuda_kda_dkept_bytes */, void *dq, void *dk, void *dv,
                                              float *dg, float *dbeta, float *dS0, const void *dout,
                                              const float *dS_final, const void *q, const void *k, const void *v,
                                              const float *g, const float *beta, const float *S0,
                                              const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v,
                                              int ldq, int ldv, int ldo, const void *kept,
                                              int kept_states /* GDN_KEPT_STATES (backend.h: KDA takes no other) */) {
    RS_CHECK(stage == GDN_BWD_DOUT || stage == GDN_BWD_STATE || stage == GDN_BWD_GRADS,
             "cuda_kda_chunk_backward_stage: stage %d (GDN_BWD_DOUT, _STATE or _GRADS)", stage);
    RS_CHECK(dkept && kept && kept_states == GDN_KEPT_STATES, "cuda_kda_chunk_backward_stage: the staged backward "
             "needs dkept and the forward's kept buffer kept with its chunk states (kept_kind %d)", kept_states);
    kda_backward("cuda_kda_chunk_backward_stage", stage, dkept, dq, dk, dv, dg, dbeta, dS0, dout, dS_final, q, k, v, g,
                 beta, S0, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv, ldo, kept, 1);
}

extern "C" void cuda_kda_chunk_prep(void *kept /* cuda_kda_kept_bytes(T, nv, dim_k, dim_v, kept_states) */,
                                    const void *k /* (T,ldq) */, const void *v /* (T,ldv), unread */,
                                    const float *g /* (T,nv,dim_k) */, const float *beta /* (T,nv) */,
                                    const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq,
                                    int ldv, int kept_states) {
    kda_check_args("cuda_kda_chunk_prep", T, nk, nv, dim_k, dim_v, ldq, ldv, 0);
    RS_CHECK(kept || T == 0, "cuda_kda_chunk_prep: no kept buffer");
    if (T == 0) return;
    KdaBufs b = kda_buffers(T, nv, dim_k, dim_v, 0);
    kda_kept_carve(&b, kept, T, nv, dim_k, dim_v, kept_states);
    kda_index(&b, doc_pos, T);
    kda_prep(&b, b.tinv, (const bf16 *)k, g, beta, doc_pos, T, nk, nv, dim_k, ldq);
}

/* M = I: the transition of an empty call */
__global__ void kda_identity_kernel(float *M /* (nv,dk,dk) */, int64_t n, int dk) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) M[i] = (i % ((int64_t)dk * dk)) / dk == i % dk ? 1.0f : 0.0f;
}

extern "C" void cuda_kda_chunk_transition(float *M /* (nv,dim_k,dim_k) */, float *H /* (nv,dim_k,dim_v) */,
                                          const void *k /* (T,ldq) */, const void *v /* (T,ldv) */,
                                          const float *g /* (T,nv,dim_k) */, const float *beta /* (T,nv) */,
                                          const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v,
                                          int ldq, int ldv, const void *kept /* its prep, or NULL */,
                                          int kept_states) {
    kda_check_args("cuda_kda_chunk_transition", T, nk, nv, dim_k, dim_v, ldq, ldv, 0);
    if (T == 0) {
        const int64_t n = (int64_t)nv * dim_k * dim_k;
        kda_identity_kernel<<<(unsigned)((n + 255) / 256), 256, 0, cuda_stream()>>>(M, n, dim_k);
        CUDA_LAUNCH_CHECK();
        kda_copy_or_zero(H, NULL, (size_t)nv * dim_k * dim_v);
        return;
    }
    KdaBufs b = kda_buffers(T, nv, dim_k, dim_v, (kept ? 0 : KDA_NEED_TINV) | KDA_NEED_PASS);
    if (kept) kda_kept_carve(&b, (void *)kept, T, nv, dim_k, dim_v, kept_states);
    kda_index(&b, doc_pos, T);
    if (!kept) kda_prep(&b, b.tinv, (const bf16 *)k, g, beta, doc_pos, T, nk, nv, dim_k, ldq);
    /* [S | M] from [0 | I] over every chunk: a document start zeroes both, which is M = 0 and H from there */
    kda_wu(&b, 1, b.tinv, (const bf16 *)k, (const bf16 *)v, g, beta, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv);
    kda_state_fwd(&b, NULL, NULL, H, M, NULL, doc_pos, T, nv, dim_k, dim_v);
}

extern "C" void cuda_kda_chunk_dstate(float *dS0 /* (nv,dim_k,dim_v) */, const void *dout /* (T,ldo) */,
                                      const void *q /* (T,ldq) */, const void *k /* (T,ldq) */,
                                      const float *g /* (T,nv,dim_k) */, const float *beta /* (T,nv) */,
                                      const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq,
                                      int ldo, const void *kept /* its prep, or NULL */, int kept_states) {
    kda_check_args("cuda_kda_chunk_dstate", T, nk, nv, dim_k, dim_v, ldq, 0, ldo);
    if (T == 0) {
        kda_copy_or_zero(dS0, NULL, (size_t)nv * dim_k * dim_v);
        return;
    }
    KdaBufs b = kda_buffers(T, nv, dim_k, dim_v, (kept ? 0 : KDA_NEED_TINV) | KDA_NEED_PASS | KDA_NEED_BPASS);
    if (kept) kda_kept_carve(&b, (void *)kept, T, nv, dim_k, dim_v, kept_states);
    kda_index(&b, doc_pos, T);
    if (!kept) kda_prep(&b, b.tinv, (const bf16 *)k, g, beta, doc_pos, T, nk, nv, dim_k, ldq);
    kda_wu(&b, 0, b.tinv, (const bf16 *)k, NULL, g, beta, doc_pos, T, nk, nv, dim_k, dim_v, ldq, 0);
    kda_qk_bwd(&b, (const bf16 *)q, (const bf16 *)k, g, (const bf16 *)dout, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldo);
    /* the reverse pass from 0 over every chunk: a document start zeroes the gradient, so what reaches the call's
     * start comes from the tokens before its first document start alone */
    kda_state_bwd(&b, NULL, NULL, dS0, NULL, (const bf16 *)dout, doc_pos, T, nv, dim_k, dim_v, ldo);
}
