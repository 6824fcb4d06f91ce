/*
 * cuda_backend_table.c — the cuda backend's Backend table (lib/backend/backend.h): bf16
 * activations (act_size 2), fp32 statistics, states and parameter gradients,
 * the kernels of kernels/cuda (cuda_kernels.h). The initializer names every
 * entry, and a kernel whose signature drifts from the table fails to compile.
 *
 * Two tables over one list of entries (CUDA_ENTRIES): `backend_cuda`, the
 * kernels themselves, and `backend_cuda_profiled`, every entry wrapped in the
 * opt-in timer of cuda_profile.h (cuda_profile_enable; cuda_backend_table()
 * picks). The plain table has no wrapper and no check: profiling costs
 * nothing when off.
 *
 * Before the first call the process picks its GPU with
 * cuda_backend_init(local_rank) (cuda_setup.h); lib/run/train.c does.
 *
 * Files: cuda_memory.cu (memory), cuda_matmul.cu (cuBLASLt GEMMs),
 * cuda_rmsnorm.cu, cuda_norm.cu (L2 norm, GDN split, gated RMSNorm), cuda_elementwise.cu
 * (embedding, gates, sigmoid gate, SwiGLU), cuda_conv.cu (conv1d + SiLU),
 * cuda_gdn_conv_split.cu (the GDN conv + split, fused), cuda_rope.cu,
 * cuda_loss.cu (fused lm_head + CE), cuda_optim.cu (AdamW, sum of squares),
 * attention/, gdn/, kda/; cuda_setup.cu and cuda_stream.cu hold the
 * process-wide state; cuda_profile.cu the entry timer.
 */
#include "attention/cudnn_graph.h"
#include "backend/backend.h"
#include "cuda_copyq.h"
#include "cuda_setup.h"
#include "cuda_attention_cudnn.h"
#include "cuda_kernels.h"
#include "cuda_profile.h"

/* every Backend entry, in the table's order; entry e is the kernel cuda_e (cuda_kernels.h) */
#define CUDA_ENTRIES(X) \
    X(alloc) \
    X(free) \
    X(memset_zero) \
    X(copy) \
    X(to_device) \
    X(to_host) \
    X(to_device_async) \
    X(copy_2d) \
    X(add_2d) \
    X(add_f32) \
    X(act_from_f32) \
    X(act_to_f32) \
    X(embedding_forward) \
    X(embedding_backward) \
    X(rmsnorm_forward) \
    X(rmsnorm_backward) \
    X(matmul_forward) \
    X(matmul_forward_residual) \
    X(matmul_backward) \
    X(conv1d_silu_forward) \
    X(conv1d_silu_backward) \
    X(l2norm_forward) \
    X(l2norm_backward) \
    X(gdn_conv_split_forward) \
    X(gdn_conv_split_backward) \
    X(gdn_gates_forward) \
    X(gdn_gates_backward) \
    X(gdn_chunk_forward) \
    X(gdn_chunk_backward) \
    X(gdn_chunk_backward_stage) \
    X(gdn_chunk_prep) \
    X(gdn_chunk_transition) \
    X(gdn_chunk_dstate) \
    X(gdn_state_affine) \
    X(kda_gates_forward) \
    X(kda_gates_backward) \
    X(kda_chunk_forward) \
    X(kda_chunk_backward) \
    X(kda_chunk_backward_stage) \
    X(kda_chunk_prep) \
    X(kda_chunk_transition) \
    X(kda_chunk_dstate) \
    X(gated_rmsnorm_forward) \
    X(gated_rmsnorm_backward) \
    X(rope_forward) \
    X(rope_backward) \
    X(attention_forward) \
    X(attention_backward) \
    X(attention_merge) \
    X(sigmoid_gate_forward) \
    X(sigmoid_gate_backward) \
    X(swiglu_forward) \
    X(swiglu_backward) \
    X(lm_head_loss) \
    X(adamw_update) \
    X(sum_squares)

/* the entries both tables share, never timed: a size (no GPU work), host memory, the copy queue (its own
 * stream) and a memory reading */
#define CUDA_UNTIMED_ENTRIES                    \
    .gdn_kept_bytes = cuda_gdn_kept_bytes,      \
    .gdn_dkept_bytes = cuda_gdn_dkept_bytes,    \
    .kda_kept_bytes = cuda_kda_kept_bytes,      \
    .kda_dkept_bytes = cuda_kda_dkept_bytes,    \
    .host_alloc = cuda_host_alloc,              \
    .host_free = cuda_host_free,                \
    .copyq_create = cuda_copyq_create,          \
    .copyq_destroy = cuda_copyq_destroy,        \
    .copyq_to_host = cuda_copyq_to_host,        \
    .copyq_to_device = cuda_copyq_to_device,    \
    .copyq_wait = cuda_copyq_wait,              \
    .memory_stats = cuda_memory_stats,

#define CUDA_PLAIN(e) .e = cuda_##e,
#define CUDA_PROFILED(e) .e = prof_##e,

const Backend backend_cuda = {
    .name = "cuda",
    .act_size = 2,
    CUDA_ENTRIES(CUDA_PLAIN)
    CUDA_UNTIMED_ENTRIES
};

/* ---- the profiled table: each wrapper times its kernel's call (cuda_profile.h) ---- */
#define PROF_VOID(e, args)                                                                                   \
    do {                                                                                                     \
        int t_ = cuda_profile_begin(#e);                                                                     \
        cuda_##e args;                                                                                       \
        cuda_profile_end(t_);                                                                                \
    } while (0)
#define PROF_VALUE(type, e, args)                                                                            \
    do {                                                                                                     \
        int t_ = cuda_profile_begin(#e);                                                                     \
        type r_ = cuda_##e args;                                                                             \
        cuda_profile_end(t_);                                                                                \
        return r_;                                                                                           \
    } while (0)

/* clang-format off */
static void *prof_alloc(size_t bytes) { PROF_VALUE(void *, alloc, (bytes)); }
static void prof_free(void *p) { PROF_VOID(free, (p)); }
static void prof_memset_zero(void *p, size_t bytes) { PROF_VOID(memset_zero, (p, bytes)); }
static void prof_copy(void *dst, const void *src, size_t bytes) { PROF_VOID(copy, (dst, src, bytes)); }
static void prof_to_device(void *dst, const void *host, size_t bytes) { PROF_VOID(to_device, (dst, host, bytes)); }
static void prof_to_host(void *host, const void *src, size_t bytes) { PROF_VOID(to_host, (host, src, bytes)); }
static void prof_to_device_async(void *dst, const void *host, size_t bytes) { PROF_VOID(to_device_async, (dst, host, bytes)); }
static void prof_copy_2d(void *dst, const void *src, int64_t rows, int cols, int ld_dst, int ld_src) { PROF_VOID(copy_2d, (dst, src, rows, cols, ld_dst, ld_src)); }
static void prof_add_2d(void *dst, const void *src, int64_t rows, int cols, int ld_dst, int ld_src) { PROF_VOID(add_2d, (dst, src, rows, cols, ld_dst, ld_src)); }
static void prof_add_f32(float *dst, const float *src, int64_t n) { PROF_VOID(add_f32, (dst, src, n)); }
static void prof_act_from_f32(void *dst, const float *src, int64_t n) { PROF_VOID(act_from_f32, (dst, src, n)); }
static void prof_act_to_f32(float *dst, const void *src, int64_t n) { PROF_VOID(act_to_f32, (dst, src, n)); }
static void prof_embedding_forward(void *out, const int32_t *tokens, const void *wte, int64_t T, int C) { PROF_VOID(embedding_forward, (out, tokens, wte, T, C)); }
static void prof_embedding_backward(float *dwte, const void *dout, const int32_t *tokens, int64_t T, int C) { PROF_VOID(embedding_backward, (dwte, dout, tokens, T, C)); }
static void prof_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *w, int64_t T, int nh, int D, int ldi, int ldo, float eps, int zero_centred) { PROF_VOID(rmsnorm_forward, (out, rstd, inp, w, T, nh, D, ldi, ldo, eps, zero_centred)); }
static void prof_rmsnorm_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w, const float *rstd, int64_t T, int nh, int D, int ldi, int ldo, int zero_centred) { PROF_VOID(rmsnorm_backward, (dinp, dw, dout, inp, w, rstd, T, nh, D, ldi, ldo, zero_centred)); }
static void prof_matmul_forward(void *out, const void *inp, const void *w, int64_t T, int IC, int OC, int ldi, int ldo, int accumulate) { PROF_VOID(matmul_forward, (out, inp, w, T, IC, OC, ldi, ldo, accumulate)); }
static void prof_matmul_forward_residual(void *out, const void *inp, const void *w, const void *resid, int64_t T, int IC, int OC, int ldi, int ldo, int ldr) { PROF_VOID(matmul_forward_residual, (out, inp, w, resid, T, IC, OC, ldi, ldo, ldr)); }
static void prof_matmul_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w, int64_t T, int IC, int OC, int ldi, int ldo, int accumulate_dinp) { PROF_VOID(matmul_backward, (dinp, dw, dout, inp, w, T, IC, OC, ldi, ldo, accumulate_dinp)); }
static void prof_conv1d_silu_forward(void *out, const void *inp, const void *halo, const void *w, const int32_t *doc_pos, int64_t T, int C, int Kc, int ldi, int ldo) { PROF_VOID(conv1d_silu_forward, (out, inp, halo, w, doc_pos, T, C, Kc, ldi, ldo)); }
static void prof_conv1d_silu_backward(void *dinp, void *dhalo, float *dw, const void *dout, const void *inp, const void *halo, const void *w, const int32_t *doc_pos, int64_t T, int C, int Kc, int ldi, int ldo) { PROF_VOID(conv1d_silu_backward, (dinp, dhalo, dw, dout, inp, halo, w, doc_pos, T, C, Kc, ldi, ldo)); }
static void prof_l2norm_forward(void *out, float *rstd, const void *inp, int64_t T, int nh, int D, int ldi, int ldo) { PROF_VOID(l2norm_forward, (out, rstd, inp, T, nh, D, ldi, ldo)); }
static void prof_l2norm_backward(void *dinp, const void *dout, const void *out, const float *rstd, int64_t T, int nh, int D, int ldi, int ldo) { PROF_VOID(l2norm_backward, (dinp, dout, out, rstd, T, nh, D, ldi, ldo)); }
static void prof_gdn_conv_split_forward(void *qk, float *qk_rstd, void *v, void *z, const void *proj, const void *halo, const void *w, const int32_t *doc_pos, int64_t T, int nk, int dk, int Vd, int Kc, int ldp) { PROF_VOID(gdn_conv_split_forward, (qk, qk_rstd, v, z, proj, halo, w, doc_pos, T, nk, dk, Vd, Kc, ldp)); }
static void prof_gdn_conv_split_backward(void *dproj, void *dhalo, float *dw, const void *dqk, const void *qk, const float *qk_rstd, const void *dv, const void *dz, const void *proj, const void *halo, const void *w, const int32_t *doc_pos, int64_t T, int nk, int dk, int Vd, int Kc, int ldp) { PROF_VOID(gdn_conv_split_backward, (dproj, dhalo, dw, dqk, qk, qk_rstd, dv, dz, proj, halo, w, doc_pos, T, nk, dk, Vd, Kc, ldp)); }
static void prof_gdn_gates_forward(float *beta, float *g, const void *b, const void *a, const float *A_log, const float *dt_bias, int64_t T, int nv, int ld) { PROF_VOID(gdn_gates_forward, (beta, g, b, a, A_log, dt_bias, T, nv, ld)); }
static void prof_gdn_gates_backward(void *db, void *da, float *dA_log, float *ddt_bias, const float *dbeta, const float *dg, const void *b, const void *a, const float *A_log, const float *dt_bias, int64_t T, int nv, int ld) { PROF_VOID(gdn_gates_backward, (db, da, dA_log, ddt_bias, dbeta, dg, b, a, A_log, dt_bias, T, nv, ld)); }
static void prof_gdn_chunk_forward(void *o, float *S_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, void *kept, int kept_flags) { PROF_VOID(gdn_chunk_forward, (o, S_final, q, k, v, g, beta, S0, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv, ldo, kept, kept_flags)); }
static void prof_gdn_chunk_backward(void *dq, void *dk, void *dv, float *dg, float *dbeta, float *dS0, const void *dout, const float *dS_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, const void *kept, int kept_kind) { PROF_VOID(gdn_chunk_backward, (dq, dk, dv, dg, dbeta, dS0, dout, dS_final, q, k, v, g, beta, S0, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv, ldo, kept, kept_kind)); }
static void prof_gdn_chunk_backward_stage(int stage, void *dkept, void *dq, void *dk, void *dv, float *dg, float *dbeta, float *dS0, const void *dout, const float *dS_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, const void *kept, int kept_kind) { PROF_VOID(gdn_chunk_backward_stage, (stage, dkept, dq, dk, dv, dg, dbeta, dS0, dout, dS_final, q, k, v, g, beta, S0, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv, ldo, kept, kept_kind)); }
static void prof_gdn_chunk_prep(void *kept, const void *k, const void *v, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int kept_kind) { PROF_VOID(gdn_chunk_prep, (kept, k, v, g, beta, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv, kept_kind)); }
static void prof_gdn_chunk_transition(float *M, float *H, const void *k, const void *v, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, const void *kept, int kept_kind) { PROF_VOID(gdn_chunk_transition, (M, H, k, v, g, beta, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv, kept, kept_kind)); }
static void prof_gdn_chunk_dstate(float *dS0, const void *dout, const void *q, const void *k, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldo, const void *kept, int kept_kind) { PROF_VOID(gdn_chunk_dstate, (dS0, dout, q, k, g, beta, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldo, kept, kept_kind)); }
static void prof_gdn_state_affine(float *S_out, const float *M, const float *S_in, const float *H, int transpose_M, int nv, int dim_k, int dim_v) { PROF_VOID(gdn_state_affine, (S_out, M, S_in, H, transpose_M, nv, dim_k, dim_v)); }
static void prof_kda_gates_forward(float *beta, float *g, const void *b, const void *f, const float *A_log, const float *dt_bias, int64_t T, int nv, int dk, int ldb, int ldf) { PROF_VOID(kda_gates_forward, (beta, g, b, f, A_log, dt_bias, T, nv, dk, ldb, ldf)); }
static void prof_kda_gates_backward(void *db, void *df, float *dA_log, float *ddt_bias, const float *dbeta, const float *dg, const void *b, const void *f, const float *A_log, const float *dt_bias, int64_t T, int nv, int dk, int ldb, int ldf) { PROF_VOID(kda_gates_backward, (db, df, dA_log, ddt_bias, dbeta, dg, b, f, A_log, dt_bias, T, nv, dk, ldb, ldf)); }
static void prof_kda_chunk_forward(void *o, float *S_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, void *kept, int kept_flags) { PROF_VOID(kda_chunk_forward, (o, S_final, q, k, v, g, beta, S0, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv, ldo, kept, kept_flags)); }
static void prof_kda_chunk_backward(void *dq, void *dk, void *dv, float *dg, float *dbeta, float *dS0, const void *dout, const float *dS_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, const void *kept, int kept_states) { PROF_VOID(kda_chunk_backward, (dq, dk, dv, dg, dbeta, dS0, dout, dS_final, q, k, v, g, beta, S0, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv, ldo, kept, kept_states)); }
static void prof_kda_chunk_backward_stage(int stage, void *dkept, void *dq, void *dk, void *dv, float *dg, float *dbeta, float *dS0, const void *dout, const float *dS_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, const void *kept, int kept_kind) { PROF_VOID(kda_chunk_backward_stage, (stage, dkept, dq, dk, dv, dg, dbeta, dS0, dout, dS_final, q, k, v, g, beta, S0, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv, ldo, kept, kept_kind)); }
static void prof_kda_chunk_prep(void *kept, const void *k, const void *v, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int kept_states) { PROF_VOID(kda_chunk_prep, (kept, k, v, g, beta, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv, kept_states)); }
static void prof_kda_chunk_transition(float *M, float *H, const void *k, const void *v, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, const void *kept, int kept_states) { PROF_VOID(kda_chunk_transition, (M, H, k, v, g, beta, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv, kept, kept_states)); }
static void prof_kda_chunk_dstate(float *dS0, const void *dout, const void *q, const void *k, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldo, const void *kept, int kept_states) { PROF_VOID(kda_chunk_dstate, (dS0, dout, q, k, g, beta, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldo, kept, kept_states)); }
static void prof_gated_rmsnorm_forward(void *out, float *rstd, const void *x, const void *z, const void *w, int64_t T, int nv, int dv, int ldz, float eps) { PROF_VOID(gated_rmsnorm_forward, (out, rstd, x, z, w, T, nv, dv, ldz, eps)); }
static void prof_gated_rmsnorm_backward(void *dx, void *dz, float *dw, const void *dout, const void *x, const void *z, const void *w, const float *rstd, int64_t T, int nv, int dv, int ldz) { PROF_VOID(gated_rmsnorm_backward, (dx, dz, dw, dout, x, z, w, rstd, T, nv, dv, ldz)); }
static void prof_rope_forward(void *x, const int32_t *pos, int64_t T, int nh, int hd, int rd, int ld, float theta) { PROF_VOID(rope_forward, (x, pos, T, nh, hd, rd, ld, theta)); }
static void prof_rope_backward(void *dx, const int32_t *pos, int64_t T, int nh, int hd, int rd, int ld, float theta) { PROF_VOID(rope_backward, (dx, pos, T, nh, hd, rd, ld, theta)); }
static void prof_attention_forward(void *out, float *lse, const void *q, const void *k, const void *v, const int32_t *pos_q, const int32_t *doc_pos_q, const int32_t *pos_k, const int32_t *doc_pos_k, const AttnHint *hint, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk, int ldo, int causal) { PROF_VOID(attention_forward, (out, lse, q, k, v, pos_q, doc_pos_q, pos_k, doc_pos_k, hint, Tq, Tk, nh, nkv, hd, ldq, ldk, ldo, causal)); }
static void prof_attention_backward(float *dq, float *dk, float *dv, const void *dout, const void *out, const float *lse, const void *q, const void *k, const void *v, const int32_t *pos_q, const int32_t *doc_pos_q, const int32_t *pos_k, const int32_t *doc_pos_k, const AttnHint *hint, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk, int ldo, int causal) { PROF_VOID(attention_backward, (dq, dk, dv, dout, out, lse, q, k, v, pos_q, doc_pos_q, pos_k, doc_pos_k, hint, Tq, Tk, nh, nkv, hd, ldq, ldk, ldo, causal)); }
static void prof_attention_merge(float *out, float *lse, const void *out_b, const float *lse_b, int64_t T, int nh, int hd, int ldb) { PROF_VOID(attention_merge, (out, lse, out_b, lse_b, T, nh, hd, ldb)); }
static void prof_sigmoid_gate_forward(void *out, const void *x, const void *gate, int64_t T, int D, int ldg) { PROF_VOID(sigmoid_gate_forward, (out, x, gate, T, D, ldg)); }
static void prof_sigmoid_gate_backward(void *dx, void *dgate, const void *dout, const void *x, const void *gate, int64_t T, int D, int ldg) { PROF_VOID(sigmoid_gate_backward, (dx, dgate, dout, x, gate, T, D, ldg)); }
static void prof_swiglu_forward(void *out, const void *gate_up, int64_t T, int inter) { PROF_VOID(swiglu_forward, (out, gate_up, T, inter)); }
static void prof_swiglu_backward(void *dgate_up, void *out, const void *dout, const void *gate_up, int64_t T, int inter) { PROF_VOID(swiglu_backward, (dgate_up, out, dout, gate_up, T, inter)); }
static void prof_lm_head_loss(float *losses, void *dx, float *dw, const void *x, const void *w, const int32_t *targets, float grad_scale, float *workspace, int64_t rows, int64_t T, int C, int V) { PROF_VOID(lm_head_loss, (losses, dx, dw, x, w, targets, grad_scale, workspace, rows, T, C, V)); }
static void prof_adamw_update(float *param, float *m, float *v, void *compute, const float *grad, int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale, int step) { PROF_VOID(adamw_update, (param, m, v, compute, grad, n, lr, beta1, beta2, eps, weight_decay, grad_scale, step)); }
static double prof_sum_squares(const float *x, int64_t n) { PROF_VALUE(double, sum_squares, (x, n)); }
/* clang-format on */

const Backend backend_cuda_profiled = {
    .name = "cuda",
    .act_size = 2,
    CUDA_ENTRIES(CUDA_PROFILED)
    CUDA_UNTIMED_ENTRIES
};

const Backend *cuda_backend_table(void) { return cuda_profile_on() ? &backend_cuda_profiled : &backend_cuda; }

/* ---- cuDNN attention (device.attention_kernel: cudnn | cudnn_det; cuda_attention_cudnn.h): the given table
 * with its two attention entries routed per call between cuDNN and our kernel ---- */
/* the profiled table's cuDNN-route entries: timed under their own names (a call the route hands to our
 * kernel is inside them; nothing else times it) */
/* clang-format off */
static void prof_attention_cudnn_forward(void *out, float *lse, const void *q, const void *k, const void *v, const int32_t *pos_q, const int32_t *doc_pos_q, const int32_t *pos_k, const int32_t *doc_pos_k, const AttnHint *hint, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk, int ldo, int causal) { PROF_VOID(attention_cudnn_forward, (out, lse, q, k, v, pos_q, doc_pos_q, pos_k, doc_pos_k, hint, Tq, Tk, nh, nkv, hd, ldq, ldk, ldo, causal)); }
static void prof_attention_cudnn_backward(float *dq, float *dk, float *dv, const void *dout, const void *out, const float *lse, const void *q, const void *k, const void *v, const int32_t *pos_q, const int32_t *doc_pos_q, const int32_t *pos_k, const int32_t *doc_pos_k, const AttnHint *hint, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk, int ldo, int causal) { PROF_VOID(attention_cudnn_backward, (dq, dk, dv, dout, out, lse, q, k, v, pos_q, doc_pos_q, pos_k, doc_pos_k, hint, Tq, Tk, nh, nkv, hd, ldq, ldk, ldo, causal)); }
/* clang-format on */

/* With the profiled table as base the two entries are the timed wrappers above, so the profile accounts
 * for the attention on the cuDNN route as it does for every other entry. */
const Backend *cuda_backend_with_cudnn_attention(const Backend *base) {
    static Backend t;
    t = *base;
    const int timed = base == &backend_cuda_profiled;
    t.attention_forward = timed ? prof_attention_cudnn_forward : cuda_attention_cudnn_forward;
    t.attention_backward = timed ? prof_attention_cudnn_backward : cuda_attention_cudnn_backward;
    t.attention_fast = cdg_route_fast; /* which calls cuDNN takes (the rest run ours) */
    return &t;
}
