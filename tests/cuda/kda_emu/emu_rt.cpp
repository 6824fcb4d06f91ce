/* emu_rt.cpp (kda_emu) — the emulation's globals (grid and thread indices, the block in flight, the shared memory)
 * and the runtime functions the kernels' host code calls (stream, scratch, internal allocations) */
#include "cuda_common.h"
#include "cuda_setup.h"
dim3 blockIdx, gridDim, blockDim;
uint3e threadIdx;
EmuBlock *emu_blk;
alignas(16) unsigned char kda_smem[EMU_SMEM_MAX];
int gdn_prof_level; /* the profile hooks of kda.cu (kernels/cuda/gdn/gdn_profile.cu on the GPU): off here */
void gdn_prof_start(int) {}
void gdn_prof_mark(const char *) {}
void gdn_prof_end(const char *, int64_t, int) {}
extern "C" {
cudaStream_t cuda_stream(void) { return 0; }
void *cuda_scratch(size_t bytes, const char *) { static void *p; static size_t n; if (bytes > n) { free(p); p = aligned_alloc(256, (bytes + 255) / 256 * 256); n = bytes; } return p; }
void *cuda_internal_alloc(size_t b) { void *p = aligned_alloc(256, (b + 255) / 256 * 256); memset(p, 0xab, b); return p; }
void cuda_internal_free(void *p, size_t) { free(p); }
int cuda_error_take(long long *i, int *v) { *i = 0; *v = 0; return 0; }
void cuda_backend_init(int) {}
}
