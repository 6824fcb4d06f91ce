/*
 * cuda.h (gdn_emu) — the host emulation's stand-in for the CUDA driver header kernels/cuda/gdn/gdn.cu includes: the
 * tensor-map type and enums, and the runtime's driver entry point, only so that gdn.cu's host code builds. Tensor
 * maps serve the wgmma / TMA passes alone, which the emulation never runs (tests/cuda/gdn_emu/gdn_emu_rt.cpp): the
 * encoder found here writes a zeroed map and reports success, and any TMA use stops the program (inc/cuda_ptx.h).
 */
#pragma once
#include "cuda_common.h"

struct __attribute__((aligned(64))) CUtensorMap { unsigned char opaque[128]; };
typedef int CUresult;
#define CUDA_SUCCESS 0
typedef uint32_t cuuint32_t;
typedef uint64_t cuuint64_t;
enum CUtensorMapDataType { CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9 };
enum CUtensorMapInterleave { CU_TENSOR_MAP_INTERLEAVE_NONE = 0 };
enum CUtensorMapSwizzle { CU_TENSOR_MAP_SWIZZLE_32B = 1, CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_SWIZZLE_128B };
enum CUtensorMapL2promotion { CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3 };
enum CUtensorMapFloatOOBfill { CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0 };

enum cudaDriverEntryPointQueryResult { cudaDriverEntryPointSuccess = 0, cudaDriverEntryPointSymbolNotFound };
enum { cudaEnableDefault = 0 };

static inline CUresult emu_tensor_map_encode(CUtensorMap *m, CUtensorMapDataType, cuuint32_t, void *,
                                             const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                             const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                             CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
    memset(m, 0, sizeof *m);
    return CUDA_SUCCESS;
}
static inline int cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned, unsigned long long,
                                                   cudaDriverEntryPointQueryResult *q) {
    const bool ok = strcmp(sym, "cuTensorMapEncodeTiled") == 0;
    *fn = ok ? (void *)&emu_tensor_map_encode : NULL;
    *q = ok ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return 0;
}
