/*
 * cuda_copyq.h — the cuda backend's copy queue (backend.h copyq_*; cuda_copyq.cu):
 * host <-> device copies on a stream of their own, ordered against the compute stream
 * by events, so checkpoint.offload's copies overlap the compute and the host never waits.
 */
#ifndef RS_CUDA_COPYQ_H
#define RS_CUDA_COPYQ_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

void *cuda_copyq_create(int slots);
void  cuda_copyq_destroy(void *q);
void  cuda_copyq_to_host(void *q, int slot, void *host, const void *src, size_t bytes);
void  cuda_copyq_to_device(void *q, int slot, void *dst, const void *host, size_t bytes);
void  cuda_copyq_wait(void *q, int slot);

#ifdef __cplusplus
}
#endif

#endif
