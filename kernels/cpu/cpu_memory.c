/*
 * cpu_memory.c — the cpu backend's memory entries: plain heap memory, and
 * activation-type conversions that are copies (activations are fp32 here).
 */
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "core/error.h"

void *cpu_alloc(size_t bytes) { return RS_CALLOC(1, bytes); }
void  cpu_free(void *p) { free(p); }
void  cpu_memory_stats(BackendMemStats *s) { memset(s, 0, sizeof *s); }
void  cpu_memset_zero(void *p, size_t bytes) { memset(p, 0, bytes); }
void  cpu_copy(void *dst, const void *src, size_t bytes) { memmove(dst, src, bytes); }
void  cpu_to_device(void *dst, const void *host, size_t bytes) { memmove(dst, host, bytes); }
void  cpu_to_host(void *host, const void *src, size_t bytes) { memmove(host, src, bytes); }
void  cpu_to_device_async(void *dst, const void *host, size_t bytes) { memmove(dst, host, bytes); }
void  cpu_copy_2d(void *dst, const void *src, int64_t rows, int cols, int ld_dst, int ld_src) {
    for (int64_t r = 0; r < rows; r++)
        memmove((float *)dst + r * ld_dst, (const float *)src + r * ld_src, (size_t)cols * sizeof(float));
}
void  cpu_add_2d(void *dst, const void *src, int64_t rows, int cols, int ld_dst, int ld_src) {
    for (int64_t r = 0; r < rows; r++) {
        float *d = (float *)dst + r * ld_dst;
        const float *x = (const float *)src + r * ld_src;
        for (int c = 0; c < cols; c++) d[c] += x[c];
    }
}
void  cpu_add_f32(float *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}
void  cpu_act_from_f32(void *dst, const float *src, int64_t n) { memmove(dst, src, (size_t)n * sizeof(float)); }
void  cpu_act_to_f32(float *dst, const void *src, int64_t n) { memmove(dst, src, (size_t)n * sizeof(float)); }
