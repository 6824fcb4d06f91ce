/* cuda_setup.h (kda_emu) — the emulation's stand-in: the scratch size and a no-op backend init */
#pragma once
#include "backend/backend.h"
#define CUDA_SCRATCH_BYTES ((size_t)32 << 20)
extern "C" void cuda_backend_init(int local_rank);
