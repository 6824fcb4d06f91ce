/*
 * cuda_attention_v2.h - which attention forward kernel cuda_attention_forward runs (kernels/cuda/
 * cuda_attention.cu): 1 = the mma.sync kernel (attn_forward_kernel), 2 = the warp-specialised wgmma +
 * TMA kernel (attn_fwd_wg_kernel, sm_90a). The default comes from the environment variable
 * RS_ATTN_FWD ("v1" or "v2"; read once), else the built-in default named in cuda_attention.cu's header.
 * Tests and benchmarks switch explicitly to run both on the same inputs.
 */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

/* v = 1 or 2 selects that forward for the following calls; v = 0 changes nothing. Returns the
 * version in force before the call. Not thread-safe; call between launches. */
int cuda_attention_fwd_version(int v);

#ifdef __cplusplus
}
#endif
