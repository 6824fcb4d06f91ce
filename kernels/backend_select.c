/*
 * backend_select.c — the one place that picks a Backend table for a config (lib/backend.h
 * backend_select): device.kind cpu -> backend_cpu; cuda -> the cuda table (kernels/cuda/backend_cuda.c),
 * its entry timer on when device.profile is set (cuda_profile.h), and with device.attention_kernel
 * cudnn / cudnn_det cuDNN's fused attention loaded (dlopen) and put in the attention entries for the
 * calls it can take (cuda_attention_cudnn.h, issue 19). It sits beside kernels/cpu and kernels/cuda,
 * not in lib/, so that lib/ never includes a cuda header. The caller has picked the process's GPU
 * first (comm_cuda_init -> cuda_backend_init).
 *
 * Callers: lib/train.c, lib/eval.c.
 */
#include <stdio.h>

#include "backend.h"
#include "config.h"

#ifdef RS_WITH_CUDA
#include "cuda_attention_cudnn.h"
#include "cuda_profile.h"
#endif

const Backend *backend_select(const Config *cfg, char *msg, size_t nmsg) {
    if (nmsg) msg[0] = '\0';
    if (cfg->device.kind != DEVICE_KIND_CUDA) return &backend_cpu;
#ifdef RS_WITH_CUDA
    cuda_profile_enable(cfg->device.profile);
    const Backend *be = cuda_backend_table();
    if (cfg->device.attention_kernel != ATTN_KERNEL_RINGSCAN) {
        char err[4096];
        if (cuda_attention_cudnn_load(cfg->device.cudnn_library, err, sizeof err)) {
            snprintf(msg, nmsg, "device.attention_kernel = %s: %s", attn_kernel_names[cfg->device.attention_kernel],
                     err);
            return NULL;
        }
        cuda_attention_cudnn_set_deterministic(cfg->device.attention_kernel == ATTN_KERNEL_CUDNN_DET);
        be = cuda_backend_with_cudnn_attention(be);
        snprintf(msg, nmsg, "attention: %s where it can take the call, ours elsewhere",
                 cuda_attention_cudnn_describe());
    }
    return be;
#else
    snprintf(msg, nmsg, "device.kind = cuda, but this ringscan was built without the cuda backend (nvcc was not "
                        "found at build time; `ringscan version` says what was built)");
    return NULL;
#endif
}
