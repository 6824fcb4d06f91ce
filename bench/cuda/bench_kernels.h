/*
 * bench_kernels.h — what the kernel timing programs of bench/cuda share: device and host scratch freed
 * together, uploads, the median of a few floats. build/bench_kernels (bench_kernels.cu) times single
 * cuda kernels on one GPU for experiments; nothing in it is checked (the parity of the same kernels is
 * build/test_cuda's).
 *
 * Callers: bench/cuda/attention_timing.cu, bench/cuda/gdn_timing.cu, bench/cuda/glue_timing.cu,
 * bench/cuda/gemm_timing.cu, bench/cuda/loss_timing.cu,
 * bench/cuda/bench_kernels.cu.
 */
#ifndef RS_BENCH_KERNELS_H
#define RS_BENCH_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* device bytes (+16 spare), poisoned with 0xFF bytes (NaN in bf16 and fp32) on the compute stream */
void *bk_dev_alloc(size_t bytes);
/* host bytes, zeroed */
void *bk_host_alloc(size_t bytes);
/* n device bf16 values in [-1, 1) (a hash of the index and seed; bk_dev_alloc's, filled on the compute stream) */
void *bk_dev_random_bf16(int64_t n, uint32_t seed);
/* a new device copy of `bytes` host bytes (on the compute stream) */
void *bk_upload(const void *host, size_t bytes);
/* waits for the compute stream, then frees every buffer of bk_dev_alloc */
void bk_dev_free_all(void);
/* frees every buffer of bk_host_alloc (main, after a mode has run) */
void bk_host_free_all(void);
/* the median of x[0..n) (sorts x) */
float bk_median(float *x, int n);

/* attention_timing.cu: MODE all, 32k, hd256, 128k, ring2 or dense; 0, or 1 for an unknown MODE */
int bk_attention_timing(const char *mode);
/* gdn_timing.cu: the state passes' choice sets, every set at 32k / 16 heads when every_set, else the first 5 */
void bk_gdn_timing(int every_set);
/* glue_timing.cu: the per-token glue kernels at the 1B config's row chunk and T = 131,072, with GB/s */
void bk_glue_timing(void);
/* gemm_timing.cu: the step's dense GEMMs at `rows` rows, every algorithm of cuBLASLt's first answers */
void bk_gemm_timing(int64_t rows);
/* loss_timing.cu: the fused lm_head + cross-entropy at `rows` rows, its GEMMs alone, the loss pass by difference */
void bk_loss_timing(int64_t rows);

#endif
