/*
 * cuda_info.cu — see cuda_info.h. Never fails: a machine without a GPU (the
 * build machine, CI) gets a line saying what the runtime answered.
 */
#include "cuda_info.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nccl.h>

extern "C" void cuda_info_print(FILE *f) {
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    int nccl = 0;
    ncclGetVersion(&nccl);
    fprintf(f, "  CUDA       built with %d.%d, runtime %d.%d, driver %d.%d\n", CUDART_VERSION / 1000,
            CUDART_VERSION % 1000 / 10, rt / 1000, rt % 1000 / 10, drv / 1000, drv % 1000 / 10);
    fprintf(f, "  cuBLASLt   %zu\n", cublasLtGetVersion());
    fprintf(f, "  NCCL       %d.%d.%d\n", nccl / 10000, nccl % 10000 / 100, nccl % 100);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        fprintf(f, "  GPUs       none visible (%s)\n", cudaGetErrorString(e));
        return;
    }
    for (int i = 0; i < n; i++) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
        fprintf(f, "  GPU %-6d %s, sm_%d%d, %d SMs, %.1f GiB\n", i, p.name, p.major, p.minor, p.multiProcessorCount,
                (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    }
}
