/*
 * cuda_stream.h — the cuda backend's compute stream, C-callable for lib/ (the NCCL layer,
 * kernels/cuda/comm_nccl.c, orders its own streams, one per communicator group, against it with events).
 *
 * One stream, non-blocking with respect to the legacy default stream, created by cuda_backend_init
 * (or at the first request, on device 0, by a test or tool that did not call it): every Backend
 * entry runs on it, in order.
 */
#ifndef RS_CUDA_STREAM_H
#define RS_CUDA_STREAM_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

cudaStream_t cuda_stream(void);

#ifdef __cplusplus
}
#endif

#endif
