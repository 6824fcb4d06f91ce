/*
 * backend_select.c — the one place that picks a Backend table for a config (lib/backend.h
 * backend_select): device.kind cpu -> backend_cpu; cuda -> the cuda table (kernels/cuda/backend_cuda.c),
 * its entry timer on when device.profile is set (cuda_profile.h). It sits beside kernels/cpu and
 * kernels/cuda, not in lib/, so that lib/ never includes a cuda header. The caller has picked the
 * process's GPU first (comm_cuda_init -> cuda_backend_init).
 *
 * Callers: lib/train.c, lib/eval.c.
 */
#include "backend.h"
#include "config.h"

#ifdef RS_WITH_CUDA
#include "cuda_profile.h"
#endif

const Backend *backend_select(const Config *cfg) {
    if (cfg->device.kind != DEVICE_KIND_CUDA) return &backend_cpu;
#ifdef RS_WITH_CUDA
    cuda_profile_enable(cfg->device.profile);
    return cuda_backend_table();
#else
    return NULL;
#endif
}
