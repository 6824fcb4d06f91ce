/*
 * runtime.h — how every program that runs the model starts: the dp x cp groups, this rank's GPU and its
 * NCCL communicators, the Backend table, the BLAS threads. Done once, the same way, by train, eval,
 * `ringscan bench cp` and the test programs (parity_step, cp_check).
 *
 * lib/ knows the GPU side only through the DeviceRuntime table below. A binary built with the cuda
 * backend registers it before main runs (a constructor in kernels/cuda/runtime_cuda.c), as the kernels
 * reach the model through Backend; so lib/ includes no kernels/ header and has no #ifdef RS_WITH_CUDA,
 * and device.kind cuda in a binary built without it is refused by runtime_open with a message that says
 * so. Opening the device binds the GPU (comm_cuda_init: local rank, refusing bad layouts on every rank)
 * and moves comm.h's non-blocking operations to NCCL (Comm.dev).
 *
 * Callers: lib/run/train.c, lib/run/eval.c, bench/bench_cp.c, tests/parity/parity_step.c,
 * tests/cp/cp_check.c.
 */
#ifndef RS_RUNTIME_H
#define RS_RUNTIME_H

#include <stddef.h>

#include "backend/backend.h"
#include "comm/comm.h"
#include "config/config.h"

/* The GPU side of start-up, registered by the cuda backend. */
typedef struct DeviceRuntime {
    const char *name; /* "cuda" */
    /* Binds this process's GPU: with comm, its local rank's, and with more than one rank NCCL
     * communicators per group (comm->dev); comm NULL: GPU 0, no communication. Exits 2 on every rank on
     * a bad GPU layout. */
    void (*open)(Comm *comm);
    /* The Backend table for cfg (device.attention_kernel, device.profile), or NULL with msg saying why;
     * otherwise msg holds a line to print (which attention runs) or is empty. Every rank of comm calls
     * it (NULL: this process alone): with device.attention_kernel auto the ranks agree on one kernel. */
    const Backend *(*backend)(const Config *cfg, Comm *comm, char *msg, size_t nmsg);
    /* the device backend's buffer sizes (no device needed) */
    const BackendSizes *sizes;
} DeviceRuntime;

/* Called by the device side before main (one device: a second registration is a fatal error). */
void runtime_register_device(const DeviceRuntime *d);
/* The registered device, or NULL in a binary built without one. */
const DeviceRuntime *runtime_device(void);

/* The buffer sizes of device.kind `kind` (DeviceKind): backend_cpu_sizes, or the registered device's; NULL,
 * with msg saying why, for cuda in a binary built without the cuda backend. */
const BackendSizes *runtime_sizes(int kind, char *msg, size_t nmsg);

/* Starts a run of cfg: comm's groups (dp x cp from cfg; comm NULL: one process, no groups), its serial
 * flag (parallel.overlap_comm), for device.kind cuda the device (GPU, NCCL) and its Backend, the BLAS
 * threads of the cpu backend (device.threads). Returns the Backend, or NULL with msg saying why (nothing
 * was written; the caller reports it and exits 2). Otherwise msg holds a line to print or is empty. */
const Backend *runtime_open(const Config *cfg, Comm *comm, char *msg, size_t nmsg);

#endif
