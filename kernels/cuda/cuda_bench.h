/*
 * cuda_bench.h — what `ringscan bench` (bench/bench*.c) needs from the GPU
 * beyond the Backend table: CUDA-event timing on the compute stream, random
 * fills of device buffers (benchmarks never run on zeros), and the device's
 * name. Plain C types only, so lib/ includes it without CUDA headers.
 *
 * Timing follows METHOD.md: events recorded on cuda_stream() around the
 * region, so the time is the device's, not the host's; the caller warms up
 * first and takes the median of repetitions.
 *
 * Callers: bench/bench_ops.c, bench/bench_step.c, bench/bench.c.
 */
#ifndef RS_CUDA_BENCH_H
#define RS_CUDA_BENCH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_BENCH_MARKS 80 /* bench cp: 3 + 8 per rank (bench/bench_cp.c) */

typedef struct CudaBenchTimer CudaBenchTimer;

/* CUDA_BENCH_MARKS timing events on the compute stream. */
CudaBenchTimer *cuda_bench_timer_create(void);
void            cuda_bench_timer_free(CudaBenchTimer *t);
/* records mark i (0 <= i < CUDA_BENCH_MARKS) on cuda_stream() */
void            cuda_bench_mark(CudaBenchTimer *t, int i);
/* waits for mark j, returns the device time from mark i to mark j in ms */
double          cuda_bench_elapsed_ms(CudaBenchTimer *t, int i, int j);
/* the host waits for every queued kernel of the compute stream */
void            cuda_bench_sync(void);

/* dst[i] = uniform in [lo, hi), a counter hash of (seed, i): random, reproducible, never all zeros */
void cuda_bench_fill_bf16(void *dst, int64_t n, uint64_t seed, float lo, float hi);
void cuda_bench_fill_f32(float *dst, int64_t n, uint64_t seed, float lo, float hi);

/* device 0's name ("NVIDIA H100 80GB HBM3"), SM count and memory; 0 when it was read, -1 otherwise
 * (the runtime's reason in `name`) */
int cuda_bench_device(char *name, size_t n, int *sms, double *mem_gib);

#ifdef __cplusplus
}
#endif

#endif
