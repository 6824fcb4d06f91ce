/*
 * runtime.c — see runtime.h: the one start-up path, and the device side's registration.
 */
#include "runtime.h"

#include <cblas.h>
#include <stdio.h>

#include "core/error.h"

static const DeviceRuntime *runtime_registered;

void runtime_register_device(const DeviceRuntime *d) {
    RS_CHECK(!runtime_registered, "two device runtimes registered (%s and %s)", runtime_registered->name, d->name);
    runtime_registered = d;
}

const DeviceRuntime *runtime_device(void) { return runtime_registered; }

static const char runtime_no_cuda[] = "device.kind = cuda, but this ringscan was built without the cuda backend (nvcc "
                                      "was not found at build time; `ringscan version` says what was built)";

const BackendSizes *runtime_sizes(int kind, char *msg, size_t nmsg) {
    if (kind != DEVICE_KIND_CUDA) return &backend_cpu_sizes;
    if (runtime_registered) return runtime_registered->sizes;
    snprintf(msg, nmsg, "%s", runtime_no_cuda);
    return NULL;
}

const Backend *runtime_open(const Config *cfg, Comm *comm, char *msg, size_t nmsg) {
    if (nmsg) msg[0] = '\0';
    if (comm) {
        comm_setup_groups(comm, cfg->parallel.dp, cfg->parallel.cp);
        comm->serial = !cfg->parallel.overlap_comm;
    }
    openblas_set_num_threads((int)cfg->device.threads);
    if (cfg->device.kind != DEVICE_KIND_CUDA) return &backend_cpu;
    const DeviceRuntime *d = runtime_registered;
    if (!d) {
        snprintf(msg, nmsg, "%s", runtime_no_cuda);
        return NULL;
    }
    d->open(comm); /* this rank's GPU, NCCL communicators; refuses bad GPU layouts (exit 2) */
    return d->backend(cfg, comm, msg, nmsg);
}
