/* cuda_bf16.h (gdn_emu) — the host emulation's stand-in for the toolkit header: bf16 and its pair type come from the
 * emulation's cuda_common.h (tests/cuda/kda_emu/inc), for the headers that include <cuda_bf16.h> themselves (the real
 * kernels/cuda/cuda_gdn_mma.h that mma_check.cpp builds against the emulated PTX) */
#pragma once
#include "cuda_common.h"
