/*
 * backend.h — the kernel interface the model is written against.
 *
 * The model code (forward, backward, optimizer, CP algorithms) is written once
 * and calls kernels through a Backend table. Two tables implement it:
 * `backend_cpu` (kernels/cpu: fp32, plain loops and CBLAS, deterministic: the
 * oracle) and `backend_cuda` (kernels/cuda, built with nvcc: bf16
 * activations, fp32 accumulation and statistics). Every cuda kernel is tested against the cpu
 * kernel of the same entry.
 *
 * Conventions (every entry follows them; exceptions are stated on the entry):
 *   - Outputs first, then inputs, then weights, then sizes (llm.c).
 *   - Pointer types say the storage type: `float *` is fp32 on every backend
 *     (statistics, gates, recurrent states, parameter gradients, master
 *     weights); `void *` is the activation type (fp32 on cpu, bf16 on cuda),
 *     used for activations, their gradients and the weights GEMMs read.
 *   - Shapes are in comments; T is the number of token rows in the call.
 *     `ld*` arguments are row strides in elements, so a call can read or write
 *     a column block of a wider matrix (e.g. q inside the [q|k|v|z|b|a]
 *     projection). ld >= the row width the call touches.
 *   - Gradients: parameter gradients ACCUMULATE (+=), so micro-batches add up.
 *     Activation gradients are WRITTEN (=) unless the entry says "+=".
 *   - Per-token metadata (int32, T entries, host memory on cpu, device memory
 *     on cuda): pos[t] is the global position of the token in its sample
 *     (RoPE angle, causal order); doc_pos[t] is the number of tokens of the
 *     same document before it (0 at a document start). Two tokens are in the
 *     same document iff pos - doc_pos agree. Attention lets query i see key j
 *     iff they share a document and (not causal, or pos_j <= pos_i). The conv
 *     and the delta rule never look back past doc_pos[t] tokens.
 *   - Nothing allocates inside a kernel except where a workspace is passed.
 *
 * Callers: lib/model/, lib/run/train.c, lib/cp/, tests/unit.
 */
#ifndef RS_BACKEND_H
#define RS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "attn_hint.h"

/* The cuda backend runs a delta-rule call (gdn_chunk_forward / gdn_chunk_backward) of more than this many
 * tokens as consecutive calls of at most this many, the state passed between them in fp32: its workspace is
 * then that of one piece (the backward's ~35 bytes per token per value head of 128) whatever T. The kept
 * buffer holds every piece's part and the states entering pieces 1.. (gdn_kept_bytes counts them; plan
 * mirrors it in model_acts.c). A multiple of 64 (the chunk). */
#define GDN_PIECE_ROWS 65536

/* A kept buffer's kind: its GDN_KEPT_STATES and GDN_KEPT_TINV bits (gdn_kept_bytes, gdn_chunk_prep, the backward,
 * the transition and dstate take it as their kept_kind; the forward in its kept_flags). GDN_KEPT_STATES keeps the
 * chunk states too (checkpoint.gdn_keep: states). GDN_KEPT_TINV keeps each chunk's Tinv too (cuda: bf16, 128 bytes
 * per token and value head), so the backward's WY gradients read it rather than solve for it again: the same
 * bits; lib/model asks it of a GDN layer whose kept buffer lives in the recompute's scratch (not of a layer
 * kept whole, where the bytes would cost more than the solve). The cpu backend keeps Tinv under every kind;
 * the kda_* entries take GDN_KEPT_STATES alone (their kept buffer holds Tinv under every kind).
 * gdn_chunk_forward's kept_flags: the kind and GDN_KEPT_PREP_IN, which says kept
 * already holds this call's prep (gdn_chunk_prep on the same k, v, g, beta, doc_pos, sizes and kept_kind),
 * which the forward then reads instead of computing it: the same bits. PREP_IN without kept is refused.
 * The forward in two calls (lib/cp/cp_gdn.c's staged chain: the state leaves a rank after the state pass, the
 * outputs come after): o = NULL with GDN_KEPT_STATES runs the state pass alone (kept = its prep and chunk
 * states, S_final); then GDN_KEPT_STATES | GDN_KEPT_STATES_IN on the same inputs and S0, S_final NULL, writes
 * only o from what kept holds. The two give the bits of one call. o = NULL without GDN_KEPT_STATES or kept,
 * STATES_IN without them, with o NULL or with S_final, is refused. */
enum { GDN_KEPT_STATES = 1, GDN_KEPT_PREP_IN = 2, GDN_KEPT_STATES_IN = 4, GDN_KEPT_TINV = 8 };

/* NULL when gdn_chunk_forward's o, S_final, kept and kept_flags keep the rules above, else which one they break
 * (both backends refuse the call with it) */
static inline const char *gdn_kept_flags_fault(const void *o, const float *S_final, const void *kept, int kept_flags) {
    const int states = (kept_flags & GDN_KEPT_STATES) != 0, states_in = (kept_flags & GDN_KEPT_STATES_IN) != 0;
    if (kept_flags & ~(GDN_KEPT_STATES | GDN_KEPT_PREP_IN | GDN_KEPT_STATES_IN | GDN_KEPT_TINV))
        return "unknown kept_flags bits";
    if ((kept_flags & GDN_KEPT_PREP_IN) && !kept) return "GDN_KEPT_PREP_IN without a kept buffer";
    if (!o && !(states && kept && !states_in))
        return "o = NULL (the state pass alone) needs GDN_KEPT_STATES and a kept buffer";
    if (states_in && !(states && kept && o && !S_final))
        return "GDN_KEPT_STATES_IN needs GDN_KEPT_STATES, a kept buffer and o, and writes no S_final";
    return NULL;
}

/* gdn_chunk_backward_stage's stages (the backward in three calls on the same arguments, in this order: the
 * bits of one gdn_chunk_backward). DOUT: what needs dout alone (cuda the intra-chunk dv, cpu nothing), so a
 * rank waiting for a state gradient has work; STATE: the state-gradient pass from dS_final, dS0 (when not
 * NULL) and the per-chunk state gradients into dkept; GRADS: dq, dk, dv, dg, dbeta from dkept. */
enum { GDN_BWD_DOUT = 1, GDN_BWD_STATE = 2, GDN_BWD_GRADS = 3 };

/* What a backend's memory holds (Backend.memory_stats), in bytes. cuda: the device; cpu: nothing is
 * tracked, every field 0. */
typedef struct BackendMemStats {
    int64_t allocated;      /* live bytes of the backend's alloc */
    int64_t peak_allocated; /* the most `allocated` has been */
    int64_t internal;       /* the backend's own buffers (cuda: cuBLASLt workspace, kernel scratch, the attention and
                               delta-rule workspaces, error word) */
    int64_t device_used;    /* cuda: total - free of the device, every process and the context included */
    int64_t device_total;
} BackendMemStats;

typedef struct Backend {
    const char *name;   /* "cpu" or "cuda" */
    int         act_size; /* bytes per activation element: 4 (cpu) or 2 (cuda) */
    /* Which attention calls run the backend's fast kernel, for lib/cp/cp_ring.c's choice between one call per
     * ring step and the zigzag rule's calls (Cp.ring_calls). NULL: every call (the attention entries take any
     * rows and mask at the cost of the mask's live tiles, skipping the fully masked ones: ours on cpu and
     * cuda). Else a route that runs some masks fast and the rest with a slower kernel (cuda's cuDNN route,
     * kernels/cuda/attention/cudnn_graph.h cdg_route: one document, causal diagonals, a ring rank's own block, dense
     * rectangles): 1 when a call of this summary (lib/backend/attn_hint.h) and shape would take the fast one. Host
     * work only. */
    int (*attention_fast)(const AttnHint *hint, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int causal);

    /* ---- memory (device memory on cuda; plain heap on cpu) ---- */
    void *(*alloc)(size_t bytes);                               /* zero-filled */
    void  (*free)(void *p);
    void  (*memset_zero)(void *p, size_t bytes);
    void  (*copy)(void *dst, const void *src, size_t bytes);    /* device -> device */
    void  (*to_device)(void *dst, const void *host, size_t bytes);
    void  (*to_host)(void *host, const void *src, size_t bytes);
    /* Host memory the backend reads asynchronously (page-locked on cuda; plain heap on cpu), zero-filled. */
    void *(*host_alloc)(size_t bytes);
    void  (*host_free)(void *p);
    /* what the backend's memory holds now (no GPU work; cpu: zeros) */
    void  (*memory_stats)(BackendMemStats *s);
    /* dst = host, queued behind the work already queued and returning at once (cuda: on the compute
     * stream; cpu: a memcpy). `host` comes from host_alloc and must stay unchanged until that work and
     * the copy are done: the trainer keeps a step's host rows untouched until the step's end, whose loss
     * read (to_host) waits for everything. */
    void  (*to_device_async)(void *dst, const void *host, size_t bytes);
    /* A copy queue beside the compute (checkpoint.offload; lib/model/model_offload.c): copies between device
     * memory and host_alloc memory that overlap the compute, each marking one of `slots` slots.
     * cuda: its own stream; a copy starts after the compute queued before the call and the host does
     * not wait; copyq_wait makes the compute queued after it wait for slot s's last copy (events).
     * cpu: the copy is a memcpy done at once; copyq_wait does nothing. */
    void *(*copyq_create)(int slots);
    void  (*copyq_destroy)(void *q);
    void  (*copyq_to_host)(void *q, int slot, void *host, const void *src, size_t bytes);
    void  (*copyq_to_device)(void *q, int slot, void *dst, const void *host, size_t bytes);
    void  (*copyq_wait)(void *q, int slot);
    /* dst[r, 0:cols] = src[r, 0:cols] for r < rows (activation type; strided column blocks) */
    void  (*copy_2d)(void *dst, const void *src, int64_t rows, int cols, int ld_dst, int ld_src);
    /* dst[r, 0:cols] += src[r, 0:cols] (activation type; the conv halo's gradient back at its owner) */
    void  (*add_2d)(void *dst, const void *src, int64_t rows, int cols, int ld_dst, int ld_src);
    /* dst[i] += src[i], fp32 (ring attention's dK|dV partials) */
    void  (*add_f32)(float *dst, const float *src, int64_t n);
    /* activation-type <-> fp32 conversion of n elements (identity copies on cpu) */
    void  (*act_from_f32)(void *dst, const float *src, int64_t n);
    void  (*act_to_f32)(float *dst, const void *src, int64_t n);

    /* ---- embedding ---- */
    /* out[t,:] = wte[tokens[t],:] */
    void (*embedding_forward)(void *out /* (T,C) */, const int32_t *tokens /* (T) */, const void *wte /* (V,C) */,
                              int64_t T, int C);
    /* dwte[tokens[t],:] += dout[t,:], in token order (deterministic) */
    void (*embedding_backward)(float *dwte /* (V,C) += */, const void *dout /* (T,C) */, const int32_t *tokens,
                               int64_t T, int C);

    /* ---- RMSNorm over rows of D, nh rows per token ----
     * y = x * rstd * (zero_centred ? 1 + w : w), rstd = 1/sqrt(mean(x^2) + eps), stats in fp32.
     * Row (t,h) starts at inp + t*ldi + h*D and out + t*ldo + h*D. One weight w[D] shared by all heads.
     * Used with nh = 1 for the layer norms and nh = heads for q_norm/k_norm. */
    void (*rmsnorm_forward)(void *out, float *rstd /* (T,nh) */, const void *inp, const void *w /* (D) */,
                            int64_t T, int nh, int D, int ldi, int ldo, float eps, int zero_centred);
    /* dinp += (residual stream convention), dw += */
    void (*rmsnorm_backward)(void *dinp /* += */, float *dw /* (D) += */, const void *dout, const void *inp,
                             const void *w, const float *rstd, int64_t T, int nh, int D, int ldi, int ldo,
                             int zero_centred);

    /* ---- dense layers: y = x W^T, W is (OC, IC) row-major ---- */
    /* out = inp @ w^T, or out += when accumulate (residual add fused into the GEMM) */
    void (*matmul_forward)(void *out /* (T,ldo) */, const void *inp /* (T,ldi) */, const void *w /* (OC,IC) */,
                           int64_t T, int IC, int OC, int ldi, int ldo, int accumulate);
    /* out = resid + inp @ w^T (the block's residual add in the GEMM: no copy of resid into out first);
     * out and resid do not overlap */
    void (*matmul_forward_residual)(void *out /* (T,ldo) */, const void *inp /* (T,ldi) */,
                                    const void *w /* (OC,IC) */, const void *resid /* (T,ldr) */, int64_t T, int IC,
                                    int OC, int ldi, int ldo, int ldr);
    /* dinp (= or += when accumulate_dinp; skipped when NULL) = dout @ w; dw += dout^T @ inp (skipped when NULL:
     * the MLP's down projection runs the two apart, its input written by swiglu_backward in between) */
    void (*matmul_backward)(void *dinp /* (T,ldi) or NULL */, float *dw /* (OC,IC) += or NULL */,
                            const void *dout /* (T,ldo) */, const void *inp /* (T,ldi) */, const void *w, int64_t T,
                            int IC, int OC, int ldi, int ldo, int accumulate_dinp);

    /* ---- causal depthwise conv1d (kernel Kc) + SiLU over C channels ----
     * u[t,c] = sum_j w[c,j] * x(t - (Kc-1-j), c), y = silu(u). x(t-b) is inp[t-b] when t-b >= 0, else
     * halo[Kc-1+t-b] (the previous fragment's last Kc-1 pre-conv rows; NULL = zeros); any tap with
     * b > doc_pos[t] (before the token's document) reads 0. */
    void (*conv1d_silu_forward)(void *out /* (T,ldo) */, const void *inp /* (T,ldi) */,
                                const void *halo /* (Kc-1,C) or NULL */, const void *w /* (C,Kc) */,
                                const int32_t *doc_pos, int64_t T, int C, int Kc, int ldi, int ldo);
    /* dinp = ; dhalo = (gradient for the halo rows, returned to their owner; skipped when NULL); dw += */
    void (*conv1d_silu_backward)(void *dinp /* (T,ldi) */, void *dhalo /* (Kc-1,C) or NULL */,
                                 float *dw /* (C,Kc) += */, const void *dout /* (T,ldo) */, const void *inp,
                                 const void *halo, const void *w, const int32_t *doc_pos, int64_t T, int C, int Kc,
                                 int ldi, int ldo);

    /* ---- L2 norm per head: y = x * rstd, rstd = 1/sqrt(sum(x^2) + 1e-6) (eps on the sum) ---- */
    void (*l2norm_forward)(void *out, float *rstd /* (T,nh) */, const void *inp, int64_t T, int nh, int D, int ldi,
                           int ldo);
    /* dinp = rstd * (dout - (dout . y) y) */
    void (*l2norm_backward)(void *dinp, const void *dout, const void *out, const float *rstd, int64_t T, int nh,
                            int D, int ldi, int ldo);

    /* ---- the GDN conv and split fused (model_block.c's GDN path): conv1d_silu_forward over proj's first
     * Cc = 2 nk dk + Vd columns [q|k|v] (halo, kernel Kc and the doc_pos masks exactly as conv1d_silu_forward),
     * then the split: qk = the L2 norm (l2norm_forward) of the conv output's first 2 nk heads of dk, v = its next
     * Vd columns, z = proj's Vd columns after them (copies); the conv output never exists as a buffer (cuda:
     * held in registers, rounded to bf16 as a bf16 buffer would store it) ---- */
    void (*gdn_conv_split_forward)(void *qk /* (T,2nk dk) */, float *qk_rstd /* (T,2nk) */, void *v /* (T,Vd) */,
                                   void *z /* (T,Vd) */, const void *proj /* (T,ldp) [q|k|v|z ...] */,
                                   const void *halo /* (Kc-1,Cc) pre-conv [q|k|v] or NULL */,
                                   const void *w /* (Cc,Kc) */, const int32_t *doc_pos /* (T) */, int64_t T, int nk,
                                   int dk, int Vd, int Kc, int ldp);
    /* its backward: dconv = the L2 norm's backward (l2norm_backward) of dqk | dv, then conv1d_silu_backward
     * of that dconv: dproj's [q|k|v] columns = dinp, dproj's z columns = dz, dhalo = the
     * halo rows' gradient (skipped when NULL), dw +=; the rest of dproj's rows is not touched */
    void (*gdn_conv_split_backward)(void *dproj /* (T,ldp) [q|k|v|z] = */, void *dhalo /* (Kc-1,Cc) = or NULL */,
                                    float *dw /* (Cc,Kc) += */, const void *dqk /* (T,2nk dk) */,
                                    const void *qk /* (T,2nk dk) */, const float *qk_rstd /* (T,2nk) */,
                                    const void *dv /* (T,Vd) */, const void *dz /* (T,Vd) */,
                                    const void *proj /* (T,ldp) */, const void *halo /* (Kc-1,Cc) or NULL */,
                                    const void *w /* (Cc,Kc) */, const int32_t *doc_pos /* (T) */, int64_t T, int nk,
                                    int dk, int Vd, int Kc, int ldp);

    /* ---- Gated DeltaNet gates, per token and value head ----
     * beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias) (softplus linear above 20), in fp32. */
    void (*gdn_gates_forward)(float *beta /* (T,nv) */, float *g /* (T,nv) */, const void *b /* (T,ld) */,
                              const void *a /* (T,ld) */, const float *A_log /* (nv) */,
                              const float *dt_bias /* (nv) */, int64_t T, int nv, int ld);
    /* db =, da =, dA_log +=, ddt_bias += */
    void (*gdn_gates_backward)(void *db /* (T,ld) */, void *da /* (T,ld) */, float *dA_log /* (nv) += */,
                               float *ddt_bias /* (nv) += */, const float *dbeta /* (T,nv) */,
                               const float *dg /* (T,nv) */, const void *b, const void *a, const float *A_log,
                               const float *dt_bias, int64_t T, int nv, int ld);

    /* ---- chunked gated delta rule (chunk 64, WY form; docs/design/gdn-kernels.md) ----
     * Per value head h (key head h / (nv/nk)), with state S (dk x dv, fp32), per token:
     *   S = exp(g_t) S;  u = S^T k_t;  S += k_t (beta_t (v_t - u))^T;  o_t = S^T (q_t * dk^-1/2)
     * q, k are already L2-normalised. The state starts as S0 (NULL = 0) and is reset to 0 at every
     * token with doc_pos == 0; so S0 only reaches tokens before the first document start. Chunks
     * restart at each document start (each document is chunked from its own first token). The state
     * after the last token goes to S_final (skipped when NULL). */
    void (*gdn_chunk_forward)(void *o /* (T,ldo) nv heads of dim_v; NULL: the state pass alone */,
                              float *S_final /* (nv,dim_k,dim_v) or NULL */,
                              const void *q /* (T,ldq) nk heads of dim_k */, const void *k /* (T,ldq) */,
                              const void *v /* (T,ldv) nv heads of dim_v */, const float *g /* (T,nv) */,
                              const float *beta /* (T,nv) */, const float *S0 /* (nv,dim_k,dim_v) or NULL */,
                              const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv,
                              int ldo, void *kept /* gdn_kept_bytes(T, nv, dim_k, dim_v, kept_flags & GDN_KEPT_STATES)
                                                     written, or NULL */,
                              int kept_flags /* GDN_KEPT_STATES | GDN_KEPT_PREP_IN | GDN_KEPT_STATES_IN, or 0 */);
    /* dq, dk, dv, dg, dbeta =; dS0 = (skipped when NULL); dS_final is the gradient arriving at the
     * final state (NULL = 0). Its WY factors (or part of them), and with GDN_KEPT_STATES its chunk states,
     * come from kept when not NULL (what gdn_chunk_forward wrote for the same k, v, g, beta, S0,
     * doc_pos, T, nk, nv, dims and kept_kind), else they are computed again; the results are the
     * same bits either way. */
    void (*gdn_chunk_backward)(void *dq /* (T,ldq) */, void *dk /* (T,ldq) */, void *dv /* (T,ldv) */,
                               float *dg /* (T,nv) */, float *dbeta /* (T,nv) */, float *dS0 /* or NULL */,
                               const void *dout /* (T,ldo) */, const float *dS_final /* or NULL */, const void *q,
                               const void *k, const void *v, const float *g, const float *beta, const float *S0,
                               const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv,
                               int ldo, const void *kept /* the forward's, or NULL */, int kept_kind);
    /* gdn_chunk_backward in stages (GDN_BWD_*; each call with the same arguments as the whole backward's, kept
     * the forward's, its kind with GDN_KEPT_STATES): the state pass apart from the gradients, so that
     * lib/cp/cp_gdn.c's chain hands the state gradient on after a state pass rather than a whole backward. dkept
     * (gdn_dkept_bytes) carries the stages' results from one call to the next (opaque; cuda the intra-chunk dv,
     * the chunk state gradients and dv2; cpu dS_final). DOUT and STATE write nothing else; GRADS only the gradients. */
    void (*gdn_chunk_backward_stage)(int stage, void *dkept /* gdn_dkept_bytes(T, nv, dim_k, dim_v) */,
                                     void *dq /* (T,ldq) */, void *dk /* (T,ldq) */, void *dv /* (T,ldv) */,
                                     float *dg /* (T,nv) */, float *dbeta /* (T,nv) */, float *dS0 /* or NULL */,
                                     const void *dout /* (T,ldo) */, const float *dS_final /* or NULL */,
                                     const void *q, const void *k, const void *v, const float *g,
                                     const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk,
                                     int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo,
                                     const void *kept /* the forward's */,
                                     int kept_kind /* the forward's, with GDN_KEPT_STATES */);
    size_t (*gdn_dkept_bytes)(int64_t T, int nv, int dim_k, int dim_v);
    /* bytes of what one gdn_chunk_forward call keeps for its backward (opaque, the backend's own format:
     * cuda W, U and the gate cumsum, so the backward skips its prep (with GDN_KEPT_TINV Tinv too, so wy_bwd skips
     * its solve), and with GDN_KEPT_STATES (checkpoint.gdn_keep: states) also the chunk states h and vn, so it
     * skips their recompute; cpu Tinv = (I + A)^-1 under every kind) */
    size_t (*gdn_kept_bytes)(int64_t T, int nv, int dim_k, int dim_v, int kept_kind);
    /* kept's prep part = what gdn_chunk_forward writes there before its state pass (cuda W, U, the gate
     * cumsum and with GDN_KEPT_TINV Tinv, of every piece; cpu Tinv), the same bytes; the rest of kept is left
     * as it is. Then gdn_chunk_forward with GDN_KEPT_PREP_IN, gdn_chunk_transition and gdn_chunk_dstate given
     * kept skip their prep (lib/cp/cp_gdn.c: a fragment's prep computed once, where its rank would otherwise
     * idle). */
    void (*gdn_chunk_prep)(void *kept /* gdn_kept_bytes(T, nv, dim_k, dim_v, kept_kind) */,
                           const void *k /* (T,ldq) nk heads */, const void *v /* (T,ldv) nv heads */,
                           const float *g /* (T,nv) */, const float *beta /* (T,nv) */, const int32_t *doc_pos,
                           int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int kept_kind);

    /* ---- Gated DeltaNet context parallelism (docs/design/gdn-cp.md; lib/cp/cp_gdn.c) ----
     * The call's transition: its final state is S_final = M S0 + H for every initial state S0, per
     * value head. M = 0 when any token has doc_pos == 0 (the state is reset); H is then the state
     * after the last document start from 0. The prep comes from kept when not NULL (gdn_chunk_prep's or
     * gdn_chunk_forward's for the same call and kept_kind), the same bits as computing it. The cuda
     * backend runs a call longer than GDN_PIECE_ROWS as pieces (as the forward's), composed in fp32. */
    void (*gdn_chunk_transition)(float *M /* (nv,dim_k,dim_k) */, float *H /* (nv,dim_k,dim_v) */,
                                 const void *k /* (T,ldq) nk heads */, const void *v /* (T,ldv) nv heads */,
                                 const float *g /* (T,nv) */, const float *beta /* (T,nv) */,
                                 const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq,
                                 int ldv, const void *kept /* its prep, or NULL */, int kept_kind);
    /* dS0 = dL/dS0 of the call's own outputs with no gradient arriving at its final state (the
     * backward's state pass alone; v is not needed: the outputs are affine in S0). The CP backward
     * folds these, then gdn_chunk_backward runs once with the folded dS_final. 0 when doc_pos[0] == 0.
     * The prep comes from kept when not NULL (the forward's or gdn_chunk_prep's for the same call and
     * kept_kind), the same bits as computing it. */
    void (*gdn_chunk_dstate)(float *dS0 /* (nv,dim_k,dim_v) */, const void *dout /* (T,ldo) */,
                             const void *q /* (T,ldq) */, const void *k /* (T,ldq) */, const float *g /* (T,nv) */,
                             const float *beta /* (T,nv) */, const int32_t *doc_pos, int64_t T, int nk, int nv,
                             int dim_k, int dim_v, int ldq, int ldo, const void *kept /* its prep, or NULL */,
                             int kept_kind);
    /* S_out = op(M) S_in + H per value head, op(M) = M or M^T (transpose_M), fp32; S_in NULL = 0.
     * One link of the CP fold (forward: M, states; backward: M^T, state gradients). No aliasing. */
    void (*gdn_state_affine)(float *S_out /* (nv,dim_k,dim_v) */, const float *M /* (nv,dim_k,dim_k) */,
                             const float *S_in /* (nv,dim_k,dim_v) or NULL */, const float *H /* (nv,dim_k,dim_v) */,
                             int transpose_M, int nv, int dim_k, int dim_v);

    /* ---- Kimi Delta Attention (KDA; docs/design/kda.md): the gated delta rule with a decay per key channel ----
     * NULL in a backend without KDA kernels (cpu: kernels/cpu/cpu_kda.c, the oracle; cuda: kernels/cuda/kda/). The
     * kda_chunk_* entries are the gdn_chunk_* entries of the same suffix, with the same arguments,
     * kept buffers, stages, documents, S0 / S_final rules and CP transition, except that g is (T, nv, dim_k): the
     * log-decay of each key channel. Per value head h (key head h / (nv/nk)) and token t:
     *   S = Diag(exp(g_t)) S;  u = S^T k_t;  S += k_t (beta_t (v_t - u))^T;  o_t = S^T (q_t * dk^-1/2)
     * The transition's M is the same (nv, dim_k, dim_k) matrix, per chunk Diag(gamma_C) - (Gamma * K)^T W, folded
     * by gdn_state_affine; lib/cp runs either kind through one set of schedules (CpGdnCore.kda). */
    /* beta = sigmoid(b), g[t,h,c] = -exp(A_log[h]) * softplus(f[t,h*dk+c] + dt_bias[h*dk+c]) (softplus linear
     * above 20; kimi_linear's gate without a lower bound), fp32 */
    void (*kda_gates_forward)(float *beta /* (T,nv) */, float *g /* (T,nv,dk) */, const void *b /* (T,ldb) */,
                              const void *f /* (T,ldf) nv*dk */, const float *A_log /* (nv) */,
                              const float *dt_bias /* (nv*dk) */, int64_t T, int nv, int dk, int ldb, int ldf);
    /* db =, df =, dA_log +=, ddt_bias += */
    void (*kda_gates_backward)(void *db /* (T,ldb) */, void *df /* (T,ldf) */, float *dA_log /* (nv) += */,
                               float *ddt_bias /* (nv*dk) += */, const float *dbeta /* (T,nv) */,
                               const float *dg /* (T,nv,dk) */, const void *b, const void *f, const float *A_log,
                               const float *dt_bias, int64_t T, int nv, int dk, int ldb, int ldf);
    void (*kda_chunk_forward)(void *o, float *S_final, const void *q, const void *k, const void *v,
                              const float *g /* (T,nv,dim_k) */, const float *beta, const float *S0,
                              const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv,
                              int ldo, void *kept /* kda_kept_bytes */, int kept_flags);
    void (*kda_chunk_backward)(void *dq, void *dk, void *dv, float *dg /* (T,nv,dim_k) */, float *dbeta, float *dS0,
                               const void *dout, const float *dS_final, const void *q, const void *k, const void *v,
                               const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T,
                               int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, const void *kept,
                               int kept_kind);
    void (*kda_chunk_backward_stage)(int stage, void *dkept /* kda_dkept_bytes */, void *dq, void *dk, void *dv,
                                     float *dg, float *dbeta, float *dS0, const void *dout, const float *dS_final,
                                     const void *q, const void *k, const void *v, const float *g, const float *beta,
                                     const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k,
                                     int dim_v, int ldq, int ldv, int ldo, const void *kept, int kept_kind);
    size_t (*kda_dkept_bytes)(int64_t T, int nv, int dim_k, int dim_v);
    size_t (*kda_kept_bytes)(int64_t T, int nv, int dim_k, int dim_v, int kept_kind);
    void (*kda_chunk_prep)(void *kept, const void *k, const void *v, const float *g, const float *beta,
                           const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv,
                           int kept_kind);
    void (*kda_chunk_transition)(float *M /* (nv,dim_k,dim_k) */, float *H /* (nv,dim_k,dim_v) */, const void *k,
                                 const void *v, const float *g, const float *beta, const int32_t *doc_pos, int64_t T,
                                 int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, const void *kept,
                                 int kept_kind);
    void (*kda_chunk_dstate)(float *dS0, const void *dout, const void *q, const void *k, const float *g,
                             const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v,
                             int ldq, int ldo, const void *kept, int kept_kind);

    /* ---- GDN gated RMSNorm: y = w * (x * rstd) * silu(z), rstd over dv per (token, head), plain w ---- */
    void (*gated_rmsnorm_forward)(void *out /* (T,nv*dv) */, float *rstd /* (T,nv) */, const void *x /* (T,nv*dv) */,
                                  const void *z /* (T,ldz) */, const void *w /* (dv) */, int64_t T, int nv, int dv,
                                  int ldz, float eps);
    /* dx =, dz =, dw += */
    void (*gated_rmsnorm_backward)(void *dx, void *dz /* (T,ldz) */, float *dw /* (dv) += */, const void *dout,
                                   const void *x, const void *z, const void *w, const float *rstd, int64_t T, int nv,
                                   int dv, int ldz);

    /* ---- partial RoPE, in place, rotate-half (NeoX) pairing inside the first rd dims of every head:
     * for i < rd/2, angle = pos * theta^(-2i/rd): x_i' = x_i cos - x_{i+rd/2} sin,
     * x_{i+rd/2}' = x_{i+rd/2} cos + x_i sin. Angles in fp32 (double on cpu). */
    void (*rope_forward)(void *x /* (T,ld) nh heads of hd */, const int32_t *pos, int64_t T, int nh, int hd, int rd,
                         int ld, float theta);
    /* the inverse rotation, applied in place to the gradient */
    void (*rope_backward)(void *dx, const int32_t *pos, int64_t T, int nh, int hd, int rd, int ld, float theta);

    /* ---- block attention: queries of one block against keys/values of another ----
     * Softmax attention, scale hd^-1/2, GQA (query head h uses kv head h / (nh/nkv)), the mask of the
     * conventions above (documents; causal by pos when `causal`). Writes the normalised output and the
     * natural-log LSE per (row, head) in fp32; a row that sees no key gets out = 0 and lse = -inf.
     * hint: the caller's host summary of this call's pos/doc_pos rows (lib/backend/attn_hint.h attn_hint_rows), so a
     * backend can pick its kernel by the mask's shape without reading device memory back; it must match the
     * rows (cpu compares them on every call, cuda's cuDNN route on the GPU: a difference stops the run).
     * cpu and cuda without cuDNN take NULL too; cuda with device.attention_kernel cudnn* refuses NULL. */
    void (*attention_forward)(void *out /* (Tq,ldo) nh heads of hd */, float *lse /* (Tq,nh) */,
                              const void *q /* (Tq,ldq) */, const void *k /* (Tk,ldk) nkv heads */,
                              const void *v /* (Tk,ldk) */, const int32_t *pos_q, const int32_t *doc_pos_q,
                              const int32_t *pos_k, const int32_t *doc_pos_k, const AttnHint *hint, int64_t Tq,
                              int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk, int ldo, int causal);
    /* dq +=, dk +=, dv += in fp32 on every backend (ring steps add partials; the dK/dV partials that
     * travel the ring stay fp32), laid out like q (ldq) and k/v (ldk). `out` and `lse` are the FINAL
     * (merged) ones, so P = exp(S - lse) are the global probabilities; D = rowsum(dout * out) is
     * computed inside. hint as in attention_forward. */
    void (*attention_backward)(float *dq /* (Tq,ldq) += */, float *dk /* (Tk,ldk) += */,
                               float *dv /* (Tk,ldk) += */, const void *dout /* (Tq,ldo) */, const void *out,
                               const float *lse, const void *q, const void *k, const void *v, const int32_t *pos_q,
                               const int32_t *doc_pos_q, const int32_t *pos_k, const int32_t *doc_pos_k,
                               const AttnHint *hint, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq,
                               int ldk, int ldo, int causal);
    /* Online merge of a partial result into the running one, in fp32:
     * L = logaddexp(L, L_b), O = e^(L_old - L) O + e^(L_b - L) O_b; -inf entries are "no keys" and are
     * handled explicitly (both -inf stays -inf with O = 0). */
    void (*attention_merge)(float *out /* (T,nh*hd) running */, float *lse /* (T,nh) running */,
                            const void *out_b /* (T,ldb) */, const float *lse_b /* (T,nh) */, int64_t T, int nh,
                            int hd, int ldb);

    /* ---- elementwise ---- */
    /* out = x * sigmoid(gate) */
    void (*sigmoid_gate_forward)(void *out /* (T,D) */, const void *x /* (T,D) */, const void *gate /* (T,ldg) */,
                                 int64_t T, int D, int ldg);
    void (*sigmoid_gate_backward)(void *dx /* = */, void *dgate /* (T,ldg) = */, const void *dout, const void *x,
                                  const void *gate, int64_t T, int D, int ldg);
    /* out = silu(gate) * up, gate_up = [gate | up] per row */
    void (*swiglu_forward)(void *out /* (T,inter) */, const void *gate_up /* (T,2 inter) */, int64_t T, int inter);
    /* dgate_up = d(silu(gate) * up); out (NULL: skipped) = silu(gate) * up again, the bits of swiglu_forward: the
     * down projection's input, which the backward needs and nothing keeps */
    void (*swiglu_backward)(void *dgate_up /* (T,2 inter) = */, void *out /* (T,inter) or NULL */,
                            const void *dout /* (T,inter) */, const void *gate_up, int64_t T, int inter);

    /* ---- lm_head + cross-entropy, fused, in row chunks (full logits never exist) ----
     * For each chunk of `rows` rows: logits = x W^T (fp32, in `workspace`), per-token loss
     * -log softmax(logits)[target] (0 and no gradient where target < 0), and, with
     * dlogits = (softmax - onehot) * grad_scale: dx = dlogits W, dw += dlogits^T x. */
    void (*lm_head_loss)(float *losses /* (T) */, void *dx /* (T,C) = */, float *dw /* (V,C) += */,
                         const void *x /* (T,C) */, const void *w /* (V,C) */, const int32_t *targets /* (T) */,
                         float grad_scale, float *workspace /* (rows,V) */, int64_t rows, int64_t T, int C, int V);

    /* ---- optimizer ----
     * AdamW on fp32 master weights, bias-corrected, decoupled decay:
     *   g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
     *   p -= lr * (m/(1-b1^step) / (sqrt(v/(1-b2^step)) + eps) + wd * p)
     * `compute` (the activation-type copy GEMMs read) is refreshed from p when not NULL. */
    void (*adamw_update)(float *param, float *m, float *v, void *compute /* or NULL */, const float *grad,
                         int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                         float grad_scale, int step);
    /* sum of squares in double, deterministic order */
    double (*sum_squares)(const float *x, int64_t n);
} Backend;

extern const Backend backend_cpu;

/* The bytes of a backend's own buffers, from shapes alone: host functions that need no device, so that
 * `ringscan plan` and model_acts (the activation table) ask the backend rather than re-derive its layouts,
 * and a process without a GPU plans a cuda run. backend_cpu_sizes; the cuda backend's through the device
 * runtime it registers (lib/backend/runtime.h runtime_sizes). */
typedef struct BackendSizes {
    /* the same figures as the Backend entries of these names */
    size_t (*gdn_kept_bytes)(int64_t T, int nv, int dim_k, int dim_v, int kept_kind);
    size_t (*gdn_dkept_bytes)(int64_t T, int nv, int dim_k, int dim_v);
    /* the delta rule's own workspace (its largest call) for fragments of frag tokens at CP size cp; 0: none */
    size_t (*gdn_workspace_bytes)(int64_t frag, int cp, int nv, int dim_k, int dim_v, int kept_kind);
    /* the kda_* figures of the same names (model.linear_attention kda); NULL where the backend has no KDA kernels */
    size_t (*kda_kept_bytes)(int64_t T, int nv, int dim_k, int dim_v, int kept_kind);
    size_t (*kda_dkept_bytes)(int64_t T, int nv, int dim_k, int dim_v);
    /* gdn_workspace_bytes of the KDA kernels (model.linear_attention kda on cuda); NULL: gdn_workspace_bytes stands */
    size_t (*kda_workspace_bytes)(int64_t frag, int cp, int nv, int dim_k, int dim_v, int kept_kind);
    /* the workspace of device.attention_kernel `kernel` (AttnKernel) beside our kernel's, for block attention
     * calls of up to `rows` query and key rows: cuDNN's route (cudnn, cudnn_det, auto: what cudnn needs); 0:
     * none */
    size_t (*attention_workspace_bytes)(int kernel, int64_t rows, int nh, int nkv, int hd);
} BackendSizes;
extern const BackendSizes backend_cpu_sizes;
/* kernels/cuda/cuda_backend_table.c, in a binary built with the cuda backend (runtime_device() is then set); the
 * process picks its GPU first (lib/backend/runtime.h). A program reaches it through runtime_open. */
extern const Backend backend_cuda;

/* The block attention device.attention_kernel `kernel` (an AttnKernel) stands for on the cuda backend: itself,
 * or for auto cudnn where cuDNN loads (from cudnn_library, or the search) and ringscan where it does not,
 * with why then the line to print (it quotes cuDNN's loader); otherwise why is empty. Built with the cuda
 * backend only (kernels/cuda/runtime_cuda.c). */
int backend_attention_resolve(int kernel, const char *cudnn_library, char *why, size_t nwhy);

#endif
