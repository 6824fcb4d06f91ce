/*
 * cuda_attention_cudnn.h — the block attention entries (lib/backend/backend.h: attention_forward,
 * attention_backward) through cuDNN's fused attention, chosen per call, for device.attention_kernel
 * cudnn | cudnn_det, and for auto (the default) where cuDNN loads. With ringscan nothing here runs and
 * cuDNN is never loaded.
 *
 * cuDNN is loaded at run time (dlopen), never linked: cuda_attention_cudnn_load tries the configured path
 * (device.cudnn_library, `bench attn --cudnn-lib`) alone when one is given, else libcudnn.so.9 through the
 * default loader path, then PyTorch's copy in the usual virtual-environment places and the CUDA toolkit's
 * lib64; it reports every path it tried when none loads, and the caller stops (no silent fallback).
 *
 * Per call (the contract of cuda_attention_forward/backward): the route (kernels/cuda/attention/cudnn_graph.h
 * cdg_route) is decided on the host from the caller's AttnHint (lib/backend/attn_hint.h), so nothing waits
 * for the GPU; a NULL hint stops the process. Every call also queues a small check of the hint against
 * the rows on the GPU; a difference lands in the device error word, read where the host waits anyway (the
 * step's loss and gradient norm). The route sends the call to cuDNN (all keys visible, top-left causal, or
 * causal within each of several packed documents: variable length, the forward only, not with cudnn_det) or
 * to our kernel.
 * The forward converts cuDNN's Stats (nh, Tq) into our lse (Tq, nh) (variable length: Stats is (Tq, nh)
 * already, copied); the backward
 * transposes our final lse back, runs cuDNN's backward into bf16 dq/dk/dv scratch and adds them into our
 * fp32 accumulators (one bf16 rounding per partial, as the layer's own activation-type gradient). Graphs
 * and plans are built once per (shape, strides, causal, direction) and kept with their workspace.
 *
 * Memory beyond ours: one workspace, grown to the largest call through cuda_internal_alloc (counted as the
 * backend's own) and never shrunk: cuDNN's plan workspace, Stats and softmax_sum, for cudnn (not
 * cudnn_det) cuDNN's fp32 dq accumulator, and the bf16 dq, dk, dv scratch; for variable length also the
 * sequences' lengths and offsets and, with GQA, the per-head fp32-sized dk, dv (GQA calls of at most
 * CDG_VARLEN_GQA_MAX_ROWS rows); cdg_workspace has the layout, which `ringscan plan` counts too. Design:
 * docs/design/attention-kernels.md.
 *
 * Callers: kernels/cuda/cuda_backend_table.c (cuda_backend_with_cudnn_attention),
 * kernels/cuda/runtime_cuda.c, bench/bench_ops.c (bench attn, cp, step),
 * tests/cuda/test_cuda_attention_cudnn.cu.
 */
#ifndef RS_CUDA_ATTENTION_CUDNN_H
#define RS_CUDA_ATTENTION_CUDNN_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Loads cuDNN 9 (see the header for the search order; path "" or NULL: search). 0 on success (again: no-op),
 * else -1 with a message naming every path tried and why each failed. */
int  cuda_attention_cudnn_load(const char *path, char *err, size_t n);
/* "cuDNN 9.19.0 (/path/libcudnn.so.9)" once loaded, else "cuDNN not loaded" */
const char *cuda_attention_cudnn_describe(void);
/* backward form: 1 deterministic (cudnn_det: dQ from one product per query block), 0 cuDNN's fp32 dQ
 * accumulator (cudnn: faster, not bitwise reproducible) */
void cuda_attention_cudnn_set_deterministic(int on);
/* a probe for tests only (test_cuda's manual_cuda_attention_cudnn_varlen_bwd_hd256): 1 sends the backward of a
 * packed-documents call to cuDNN's variable-length graph at every head dim, not only where
 * cdg_varlen_backward_ok allows it (hd <= 128); 0, the default and what every run uses */
void cuda_attention_cudnn_probe_varlen_backward(int on);

/* The Backend entries (lib/backend/backend.h's contracts; cuDNN must be loaded; hint must not be NULL) */
void cuda_attention_cudnn_forward(void *out, float *lse, const void *q, const void *k, const void *v,
                                  const int32_t *pos_q, const int32_t *doc_pos_q, const int32_t *pos_k,
                                  const int32_t *doc_pos_k, const AttnHint *hint, int64_t Tq, int64_t Tk, int nh,
                                  int nkv, int hd, int ldq, int ldk, int ldo, int causal);
void cuda_attention_cudnn_backward(float *dq, float *dk, float *dv, const void *dout, const void *out,
                                   const float *lse, const void *q, const void *k, const void *v,
                                   const int32_t *pos_q, const int32_t *doc_pos_q, const int32_t *pos_k,
                                   const int32_t *doc_pos_k, const AttnHint *hint, int64_t Tq, int64_t Tk, int nh,
                                   int nkv, int hd, int ldq, int ldk, int ldo, int causal);

/* every tensor and operation descriptor of key k's graph created and finalized, then destroyed: no GPU, no
 * cuDNN handle (the operation graph and plan need both); stops with cuDNN's message on a refusal. For tests. */
void cuda_attention_cudnn_lower_only(const void *key /* const CdgKey * */);

/* calls so far: [0] forward to cuDNN, [1] forward to ours, [2] backward to cuDNN, [3] backward to ours */
void cuda_attention_cudnn_counts(int64_t counts[4]);
/* of those to cuDNN, the variable-length ones (packed documents): [0] forward, [1] backward */
void cuda_attention_cudnn_varlen_counts(int64_t counts[2]);

/* cuda_backend_table.c: base with attention_forward/backward replaced by the two entries above (a static copy;
 * cuDNN must be loaded first) */
const Backend *cuda_backend_with_cudnn_attention(const Backend *base);

/* ---- cuda_attention_cudnn_glue.cu: the small kernels around cuDNN's calls (compute stream) ---- */
/* queues the check of hint against the call's rows on the GPU; a difference goes to the device error word
 * (CUDA_ERR_ATTN_HINT, cuda_common.h; the host is not waited for) */
void cuda_cudnn_hint_check(const AttnHint *hint, const int32_t *pos_q, const int32_t *doc_pos_q, int64_t Tq,
                           const int32_t *pos_k, const int32_t *doc_pos_k, int64_t Tk);
/* the route's workspace (see the header), at least `bytes`: grown through cuda_internal_alloc, never shrunk;
 * the old one freed after a stream synchronisation (on growth only: the first calls of a shape) */
void *cuda_cudnn_workspace(size_t bytes);
/* the most the workspace could grow to now: the device's free bytes plus the workspace's own (freed on growth) */
size_t cuda_cudnn_workspace_room(void);
void cuda_cudnn_stats_to_lse(float *lse /* (Tq,nh) */, const float *stats /* (nh,Tq) */, int64_t Tq, int nh);
void cuda_cudnn_lse_to_stats(float *stats /* (nh,Tq) */, const float *lse /* (Tq,nh) */, int64_t Tq, int nh);
/* variable length: the call's document runs (lib/backend/attn_hint.h: a run begins at row 0 and wherever
 * pos - doc_pos changes) from its T rows' pos/doc_pos, as cuDNN's sequences: seq[b] = run b's length,
 * off[i][b] = run b's first row x mult[i] (i < noff), for b < batch; sequences past the runs have length 0
 * and offset T x mult; off[i][batch] = T x mult[i]. One block; runs beyond batch and lengths beyond smax
 * (a wrong hint, which cuda_cudnn_hint_check reports) are not written: cuDNN never reads past a sequence. */
void cuda_cudnn_varlen_rows(int32_t *seq /* (batch) */, int64_t *const *off /* noff x (batch+1) */,
                            const int64_t *mult, int noff, const int32_t *pos, const int32_t *doc_pos, int64_t T,
                            int batch, int64_t smax);
void cuda_cudnn_copy_f32(float *dst, const float *src, int64_t n);
/* dst[r, 0:cols] += src[r, 0:cols] (fp32 += bf16), row strides ld_dst, ld_src */
void cuda_cudnn_add_bf16(float *dst, const void *src, int64_t rows, int cols, int ld_dst, int ld_src);

#ifdef __cplusplus
}
#endif

#endif
