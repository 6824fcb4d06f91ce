/*
 * cuda_attention_v2.h - which attention forward kernel cuda_attention_forward runs (kernels/cuda/
 * cuda_attention.cu): 1 = the mma.sync kernel (attn_forward_kernel), 2 = the warp-specialised wgmma +
 * TMA kernel (attn_fwd_wg_kernel, sm_90a); likewise for cuda_attention_backward (1: attn_dkdv_kernel +
 * attn_dq_kernel, 2: attn_bwd_wg_kernel<HD, 1> + <HD, 0>). The defaults come from the environment
 * variables RS_ATTN_FWD ("v1" or "v2") and RS_ATTN_BWD ("v1", "v2", "v3" or "auto"), read once, else the built-in defaults
 * (ATTN_FWD_DEFAULT, ATTN_BWD_DEFAULT in cuda_attention.cu).
 * Tests and benchmarks switch explicitly to run both on the same inputs.
 */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

/* v = 1 or 2 selects that forward for the following calls; v = 0 changes nothing. Returns the
 * version in force before the call. Not thread-safe; call between launches. */
int cuda_attention_fwd_version(int v);
/* the same for the backward: 1, 2, 3 or ATTN_BWD_AUTO (the default: v3 for hd 64 and 128, v2 for hd 256;
 * RS_ATTN_BWD=auto) */
#define ATTN_BWD_AUTO 4
int cuda_attention_bwd_version(int v);

/* backward v3's dq adds: 1 = in key-block order (reproducible; the default, RS_ATTN_DQ=ordered), 0 = plain
 * fp32 atomics (RS_ATTN_DQ=atomic; not reproducible, for measuring what the order costs), -1 = no change.
 * Returns the setting in force before the call. */
int cuda_attention_dq_order(int v);

/* backward v3 at hd 256: 1 = the throttled kernel (a head's key blocks kept within ATTN_BWD3_THROTTLE query
 * tiles) at every size (RS_ATTN_THROTTLE=1), 0 = only above ATTN_BWD3_THROTTLE_MIN_TK keys (the default),
 * -1 = no change. Returns the setting in force before the call. */
int cuda_attention_throttle(int v);

#ifdef __cplusplus
}
#endif
