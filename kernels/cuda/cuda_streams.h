/*
 * cuda_streams.h — the cuda backend's streams and events, C-callable for the
 * communication layer (lib/comm's NCCL stream, the CP overlap of lib/cp*.c).
 *
 * Two streams, created once by cuda_backend_init, both non-blocking with
 * respect to the legacy default stream:
 *   cuda_stream()       compute: every Backend entry runs here, in order;
 *   cuda_comm_stream()  communication (NCCL): ordered against compute only
 *                       through events, never by synchronising the device.
 * The pattern for "comm after compute" is
 *   cuda_event_record(e, cuda_stream()); cuda_stream_wait_event(cuda_comm_stream(), e);
 * and the mirror for "compute after comm". Events are created without timing
 * (cheapest to record and wait on).
 */
#ifndef RS_CUDA_STREAMS_H
#define RS_CUDA_STREAMS_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

cudaStream_t cuda_stream(void);
cudaStream_t cuda_comm_stream(void);
cudaEvent_t  cuda_event_create(void);
void         cuda_event_destroy(cudaEvent_t e);
/* e completes when the work queued on s so far has */
void         cuda_event_record(cudaEvent_t e, cudaStream_t s);
/* work queued on s after this call starts after e completes (the host does not wait) */
void         cuda_stream_wait_event(cudaStream_t s, cudaEvent_t e);
/* the host waits for s */
void         cuda_stream_sync(cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
