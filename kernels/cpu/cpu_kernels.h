/*
 * cpu_kernels.h — the cpu backend's kernels: fp32, plain loops (CBLAS for the
 * GEMMs), deterministic. The oracle every cuda kernel is checked against.
 *
 * Each function implements the Backend entry of the same name (lib/backend/backend.h,
 * which documents shapes and semantics); backend_cpu.c puts them in the table,
 * and its initializer fails to compile if a signature drifts.
 *
 * Files: cpu_memory.c (memory), cpu_matmul.c (CBLAS GEMMs), cpu_norm.c
 * (RMSNorm, L2 norm, gated RMSNorm), cpu_elementwise.c (embedding, gates,
 * sigmoid gate, SwiGLU), cpu_rope.c, cpu_loss.c (fused lm_head + CE),
 * cpu_optim.c (AdamW, sum of squares), cpu_conv.c (conv1d + SiLU),
 * cpu_gdn.c (chunked gated delta rule; its CP transition, state gradient and fold link), cpu_kda.c (the
 * same with a decay per key channel: Kimi Delta Attention), cpu_attention.c
 * (block attention and the LSE merge); backend_cpu.c is the table.
 */
#ifndef RS_CPU_KERNELS_H
#define RS_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

void *cpu_alloc(size_t bytes);
void cpu_free(void *p);
/* Backend.memory_stats: the cpu backend tracks nothing (every field 0) */
void cpu_memory_stats(BackendMemStats *s);
void cpu_memset_zero(void *p, size_t bytes);
void cpu_copy(void *dst, const void *src, size_t bytes);
void cpu_to_device(void *dst, const void *host, size_t bytes);
void cpu_to_host(void *host, const void *src, size_t bytes);
void cpu_to_device_async(void *dst, const void *host, size_t bytes);
/* cpu_copyq.c: the copy queue (backend.h copyq_*), memcpy at once */
void *cpu_copyq_create(int slots);
void  cpu_copyq_destroy(void *q);
void  cpu_copyq_to_host(void *q, int slot, void *host, const void *src, size_t bytes);
void  cpu_copyq_to_device(void *q, int slot, void *dst, const void *host, size_t bytes);
void  cpu_copyq_wait(void *q, int slot);
void cpu_copy_2d(void *dst, const void *src, int64_t rows, int cols, int ld_dst, int ld_src);
void cpu_add_2d(void *dst, const void *src, int64_t rows, int cols, int ld_dst, int ld_src);
void cpu_add_f32(float *dst, const float *src, int64_t n);
void cpu_act_from_f32(void *dst, const float *src, int64_t n);
void cpu_act_to_f32(float *dst, const void *src, int64_t n);
void cpu_embedding_forward(void *out, const int32_t *tokens, const void *wte, int64_t T, int C);
void cpu_embedding_backward(float *dwte, const void *dout, const int32_t *tokens, int64_t T, int C);
void cpu_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *w, int64_t T, int nh, int D, int ldi, int ldo, float eps, int zero_centred);
void cpu_rmsnorm_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w, const float *rstd, int64_t T, int nh, int D, int ldi, int ldo, int zero_centred);
void cpu_matmul_forward(void *out, const void *inp, const void *w, int64_t T, int IC, int OC, int ldi, int ldo, int accumulate);
void cpu_matmul_forward_residual(void *out, const void *inp, const void *w, const void *resid, int64_t T, int IC, int OC, int ldi, int ldo, int ldr);
void cpu_matmul_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w, int64_t T, int IC, int OC, int ldi, int ldo, int accumulate_dinp);
void cpu_conv1d_silu_forward(void *out, const void *inp, const void *halo, const void *w, const int32_t *doc_pos, int64_t T, int C, int Kc, int ldi, int ldo);
void cpu_conv1d_silu_backward(void *dinp, void *dhalo, float *dw, const void *dout, const void *inp, const void *halo, const void *w, const int32_t *doc_pos, int64_t T, int C, int Kc, int ldi, int ldo);
void cpu_l2norm_forward(void *out, float *rstd, const void *inp, int64_t T, int nh, int D, int ldi, int ldo);
void cpu_l2norm_backward(void *dinp, const void *dout, const void *out, const float *rstd, int64_t T, int nh, int D, int ldi, int ldo);
void cpu_gdn_split_forward(void *qk, float *qk_rstd, void *v, void *z, const void *conv, const void *zin, int64_t T, int nk, int dk, int Vd, int ldc, int ldz);
void cpu_gdn_split_backward(void *dconv, void *dzout, const void *dqk, const void *qk, const float *qk_rstd, const void *dv, const void *dz, int64_t T, int nk, int dk, int Vd, int ldc, int ldz);
void cpu_gdn_conv_split_forward(void *qk, float *qk_rstd, void *v, void *z, const void *proj, const void *halo, const void *w, const int32_t *doc_pos, int64_t T, int nk, int dk, int Vd, int Kc, int ldp);
void cpu_gdn_conv_split_backward(void *dproj, void *dhalo, float *dw, const void *dqk, const void *qk, const float *qk_rstd, const void *dv, const void *dz, const void *proj, const void *halo, const void *w, const int32_t *doc_pos, int64_t T, int nk, int dk, int Vd, int Kc, int ldp);
void cpu_gdn_gates_forward(float *beta, float *g, const void *b, const void *a, const float *A_log, const float *dt_bias, int64_t T, int nv, int ld);
void cpu_gdn_gates_backward(void *db, void *da, float *dA_log, float *ddt_bias, const float *dbeta, const float *dg, const void *b, const void *a, const float *A_log, const float *dt_bias, int64_t T, int nv, int ld);
void cpu_gdn_chunk_forward(void *o, float *S_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, void *tinv, int kept_flags);
void cpu_gdn_chunk_backward(void *dq, void *dk, void *dv, float *dg, float *dbeta, float *dS0, const void *dout, const float *dS_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, const void *tinv, int kept_kind);
size_t cpu_gdn_kept_bytes(int64_t T, int nv, int dim_k, int dim_v, int states);
typedef void CpuGdnBackward(void *dq, void *dk, void *dv, float *dg, float *dbeta, float *dS0, const void *dout, const float *dS_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, const void *tinv, int kept_kind);
void cpu_gdn_backward_stage_of(CpuGdnBackward *whole, int stage, void *dkept, void *dq, void *dk, void *dv, float *dg, float *dbeta, float *dS0, const void *dout, const float *dS_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, const void *kept, int kept_kind);
void cpu_gdn_chunk_backward_stage(int stage, void *dkept, void *dq, void *dk, void *dv, float *dg, float *dbeta, float *dS0, const void *dout, const float *dS_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, const void *kept, int kept_kind);
size_t cpu_gdn_dkept_bytes(int64_t T, int nv, int dim_k, int dim_v);
void cpu_gated_rmsnorm_forward(void *out, float *rstd, const void *x, const void *z, const void *w, int64_t T, int nv, int dv, int ldz, float eps);
void cpu_gated_rmsnorm_backward(void *dx, void *dz, float *dw, const void *dout, const void *x, const void *z, const void *w, const float *rstd, int64_t T, int nv, int dv, int ldz);
void cpu_rope_forward(void *x, const int32_t *pos, int64_t T, int nh, int hd, int rd, int ld, float theta);
void cpu_rope_backward(void *dx, const int32_t *pos, int64_t T, int nh, int hd, int rd, int ld, float theta);
void cpu_attention_forward(void *out, float *lse, const void *q, const void *k, const void *v, const int32_t *pos_q, const int32_t *doc_pos_q, const int32_t *pos_k, const int32_t *doc_pos_k, const AttnHint *hint, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk, int ldo, int causal);
void cpu_attention_backward(float *dq, float *dk, float *dv, const void *dout, const void *out, const float *lse, const void *q, const void *k, const void *v, const int32_t *pos_q, const int32_t *doc_pos_q, const int32_t *pos_k, const int32_t *doc_pos_k, const AttnHint *hint, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk, int ldo, int causal);
void cpu_attention_merge(float *out, float *lse, const void *out_b, const float *lse_b, int64_t T, int nh, int hd, int ldb);
void cpu_sigmoid_gate_forward(void *out, const void *x, const void *gate, int64_t T, int D, int ldg);
void cpu_sigmoid_gate_backward(void *dx, void *dgate, const void *dout, const void *x, const void *gate, int64_t T, int D, int ldg);
void cpu_swiglu_forward(void *out, const void *gate_up, int64_t T, int inter);
void cpu_swiglu_backward(void *dgate_up, void *out, const void *dout, const void *gate_up, int64_t T, int inter);
void cpu_lm_head_loss(float *losses, void *dx, float *dw, const void *x, const void *w, const int32_t *targets, float grad_scale, float *workspace, int64_t rows, int64_t T, int C, int V);
void cpu_adamw_update(float *param, float *m, float *v, void *compute, const float *grad, int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale, int step);
double cpu_sum_squares(const float *x, int64_t n);

/* ---- Gated DeltaNet context parallelism (cpu_gdn.c; lib/backend/backend.h documents them) ---- */
void cpu_gdn_chunk_prep(void *tinv, const void *k, const void *v, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int kept_kind);
void cpu_gdn_chunk_transition(float *M, float *H, const void *k, const void *v, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, const void *tinv, int kept_kind);
void cpu_gdn_chunk_dstate(float *dS0, const void *dout, const void *q, const void *k, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldo, const void *tinv, int kept_kind);
void cpu_gdn_state_affine(float *S_out, const float *M, const float *S_in, const float *H, int transpose_M, int nv, int dim_k, int dim_v);
/* ---- Kimi Delta Attention (cpu_kda.c; the gates in cpu_elementwise.c; lib/backend/backend.h documents them) ---- */
void cpu_kda_gates_forward(float *beta, float *g, const void *b, const void *f, const float *A_log, const float *dt_bias, int64_t T, int nv, int dk, int ldb, int ldf);
void cpu_kda_gates_backward(void *db, void *df, float *dA_log, float *ddt_bias, const float *dbeta, const float *dg, const void *b, const void *f, const float *A_log, const float *dt_bias, int64_t T, int nv, int dk, int ldb, int ldf);
void cpu_kda_chunk_forward(void *o, float *S_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, void *tinv, int kept_flags);
CpuGdnBackward cpu_kda_chunk_backward;
void cpu_kda_chunk_backward_stage(int stage, void *dkept, void *dq, void *dk, void *dv, float *dg, float *dbeta, float *dS0, const void *dout, const float *dS_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, const void *kept, int kept_kind);
size_t cpu_kda_dkept_bytes(int64_t T, int nv, int dim_k, int dim_v);
size_t cpu_kda_kept_bytes(int64_t T, int nv, int dim_k, int dim_v, int states);
void cpu_kda_chunk_prep(void *tinv, const void *k, const void *v, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int kept_states);
void cpu_kda_chunk_transition(float *M, float *H, const void *k, const void *v, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, const void *tinv, int kept_states);
void cpu_kda_chunk_dstate(float *dS0, const void *dout, const void *q, const void *k, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldo, const void *tinv, int kept_states);

#ifdef __cplusplus
}
#endif

#endif
