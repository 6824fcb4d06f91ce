/*
 * cuda_stream.cu — the cuda backend's two streams and the event calls of
 * cuda_streams.h. The streams are created by cuda_backend_init (on the
 * process's GPU); asking for one before that initialises the backend on
 * device 0 (tests and tools).
 */
#include "cuda_common.h"
#include "cuda_streams.h"

static cudaStream_t cuda_compute_stream, cuda_communication_stream;

extern "C" void cuda_streams_create(void) {
    if (!cuda_compute_stream) CUDA_CHECK(cudaStreamCreateWithFlags(&cuda_compute_stream, cudaStreamNonBlocking));
    if (!cuda_communication_stream)
        CUDA_CHECK(cudaStreamCreateWithFlags(&cuda_communication_stream, cudaStreamNonBlocking));
}

extern "C" cudaStream_t cuda_stream(void) {
    if (!cuda_compute_stream) cuda_backend_ensure();
    return cuda_compute_stream;
}

extern "C" cudaStream_t cuda_comm_stream(void) {
    if (!cuda_communication_stream) cuda_backend_ensure();
    return cuda_communication_stream;
}

extern "C" cudaEvent_t cuda_event_create(void) {
    cuda_backend_ensure();
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
}

extern "C" void cuda_event_destroy(cudaEvent_t e) { CUDA_CHECK(cudaEventDestroy(e)); }
extern "C" void cuda_event_record(cudaEvent_t e, cudaStream_t s) { CUDA_CHECK(cudaEventRecord(e, s)); }
extern "C" void cuda_stream_wait_event(cudaStream_t s, cudaEvent_t e) { CUDA_CHECK(cudaStreamWaitEvent(s, e, 0)); }
extern "C" void cuda_stream_sync(cudaStream_t s) { CUDA_CHECK(cudaStreamSynchronize(s)); }
