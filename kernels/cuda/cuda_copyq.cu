/*
 * cuda_copyq.cu — the copy queue (cuda_copyq.h, backend.h copyq_*): one non-blocking
 * stream for host <-> device copies beside the compute stream (cuda_stream.h).
 *
 * A copy first makes the copy stream wait for an event recorded on the compute stream at
 * the call (so it reads or overwrites device memory only after the compute queued before
 * it), then copies with cudaMemcpyAsync (host memory from host_alloc: page-locked, so
 * truly asynchronous), then records the slot's event. copyq_wait makes the compute stream
 * wait for that event. Nothing here synchronises the host. Events are created without
 * timing; re-recording one is safe because a wait captures the event's state when queued.
 *
 * Callers: lib/model/model_offload.c through the Backend table.
 */
#include <stdlib.h>

#include "cuda_common.h"
#include "cuda_copyq.h"
#include "cuda_stream.h"

/* an event without timing (only ordering) */
static cudaEvent_t copyq_event(void) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
}

typedef struct {
    cudaStream_t stream;
    cudaEvent_t  after;  /* the compute queued before a copy */
    int          slots;
    cudaEvent_t *done;   /* (slots) each slot's last copy */
} CudaCopyq;

extern "C" void *cuda_copyq_create(int slots) {
    RS_CHECK(slots > 0, "a copy queue of %d slots", slots);
    cuda_backend_ensure();
    CudaCopyq *q = (CudaCopyq *)RS_CALLOC(1, sizeof *q);
    q->slots = slots;
    CUDA_CHECK(cudaStreamCreateWithFlags(&q->stream, cudaStreamNonBlocking));
    q->after = copyq_event();
    q->done = (cudaEvent_t *)RS_CALLOC((size_t)slots, sizeof *q->done);
    for (int s = 0; s < slots; s++) q->done[s] = copyq_event();
    return q;
}

extern "C" void cuda_copyq_destroy(void *qv) {
    CudaCopyq *q = (CudaCopyq *)qv;
    if (!q) return;
    CUDA_CHECK(cudaStreamSynchronize(q->stream));
    for (int s = 0; s < q->slots; s++) CUDA_CHECK(cudaEventDestroy(q->done[s]));
    CUDA_CHECK(cudaEventDestroy(q->after));
    CUDA_CHECK(cudaStreamDestroy(q->stream));
    free(q->done);
    free(q);
}

static void cuda_copyq_copy(CudaCopyq *q, int slot, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    RS_CHECK(slot >= 0 && slot < q->slots, "copy queue slot %d of %d", slot, q->slots);
    CUDA_CHECK(cudaEventRecord(q->after, cuda_stream()));
    CUDA_CHECK(cudaStreamWaitEvent(q->stream, q->after, 0));
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, q->stream));
    CUDA_CHECK(cudaEventRecord(q->done[slot], q->stream));
}

extern "C" void cuda_copyq_to_host(void *q, int slot, void *host, const void *src, size_t bytes) {
    cuda_copyq_copy((CudaCopyq *)q, slot, host, src, bytes, cudaMemcpyDeviceToHost);
}

extern "C" void cuda_copyq_to_device(void *q, int slot, void *dst, const void *host, size_t bytes) {
    cuda_copyq_copy((CudaCopyq *)q, slot, dst, host, bytes, cudaMemcpyHostToDevice);
}

extern "C" void cuda_copyq_wait(void *qv, int slot) {
    CudaCopyq *q = (CudaCopyq *)qv;
    RS_CHECK(slot >= 0 && slot < q->slots, "copy queue slot %d of %d", slot, q->slots);
    CUDA_CHECK(cudaStreamWaitEvent(cuda_stream(), q->done[slot], 0));
}
