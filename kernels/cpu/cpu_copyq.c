/*
 * cpu_copyq.c — the cpu backend's copy queue (backend.h copyq_*): the same calls as the
 * cuda copy stream, done at once. Host and "device" memory are the same heap, so a copy
 * is a memcpy that is complete when the call returns, and waiting on a slot is nothing.
 * The queue counts its slots only to refuse a slot it does not have.
 *
 * Callers: lib/model/model_offload.c (checkpoint.offload: host), through backend_cpu.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "core/error.h"

typedef struct {
    int slots;
} CpuCopyq;

void *cpu_copyq_create(int slots) {
    RS_CHECK(slots > 0, "a copy queue of %d slots", slots);
    CpuCopyq *q = RS_CALLOC(1, sizeof *q);
    q->slots = slots;
    return q;
}

void cpu_copyq_destroy(void *q) { free(q); }

static void cpu_copyq_check(const CpuCopyq *q, int slot) {
    RS_CHECK(slot >= 0 && slot < q->slots, "copy queue slot %d of %d", slot, q->slots);
}

void cpu_copyq_to_host(void *q, int slot, void *host, const void *src, size_t bytes) {
    cpu_copyq_check(q, slot);
    memcpy(host, src, bytes);
}

void cpu_copyq_to_device(void *q, int slot, void *dst, const void *host, size_t bytes) {
    cpu_copyq_check(q, slot);
    memcpy(dst, host, bytes);
}

void cpu_copyq_wait(void *q, int slot) { cpu_copyq_check(q, slot); }
