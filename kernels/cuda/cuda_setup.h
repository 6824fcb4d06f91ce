/*
 * cuda_setup.h — C-callable set-up and accounting of the cuda backend, for
 * the trainer (lib/run/train.c), the parity tools and the GPU tests. The Backend
 * table itself (`backend_cuda`, lib/backend/backend.h) is kernels/cuda/cuda_backend_table.c.
 *
 *   cuda_backend_init(local_rank)  picks the GPU of this process and creates,
 *                                  once, the compute and comm streams, the
 *                                  cuBLASLt handle and its workspace, the
 *                                  kernel scratch and the device error word.
 *                                  GPU choice: the local rank (MPI's
 *                                  shared-memory split, lib/comm/comm.c) when that
 *                                  many GPUs are visible; device 0 when exactly
 *                                  one is visible (one GPU per task, as Slurm's
 *                                  --gpus-per-task gives); otherwise fatal.
 *   cuda_scratch_reserve(bytes)    grows the kernel scratch before training
 *                                  (it starts at CUDA_SCRATCH_BYTES).
 *   cuda_memory_stats(...)         what the backend allocated (live, peak),
 *                                  its own buffers, and the device's used and
 *                                  total memory (cudaMemGetInfo: includes the
 *                                  CUDA context and other processes).
 *
 * Header of plain C types only, so lib/ can include it without CUDA headers.
 */
#ifndef RS_CUDA_SETUP_H
#define RS_CUDA_SETUP_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

#define CUDA_LT_WORKSPACE_BYTES ((size_t)32 << 20) /* cuBLASLt workspace (plan.c counts it) */
#define CUDA_SCRATCH_BYTES      ((size_t)32 << 20) /* kernel scratch at start (plan.c counts it) */

#ifdef __cplusplus
extern "C" {
#endif

/* The number of GPUs this process can use; 0, with the runtime's reason in `why`, when none (a
 * machine without a driver or device): lets the trainer refuse device.kind: cuda with a clear
 * usage error before it writes anything. Creates nothing. */
int  cuda_backend_probe(char *why, size_t n);
void cuda_backend_init(int local_rank);
int  cuda_backend_device(void); /* the device in use; -1 before init */
void cuda_scratch_reserve(size_t bytes);

/* Backend.memory_stats of the cuda table (lib/backend/backend.h BackendMemStats) */
void cuda_memory_stats(BackendMemStats *s);

#ifdef __cplusplus
}
#endif

#endif
