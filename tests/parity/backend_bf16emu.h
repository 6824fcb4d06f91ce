/*
 * backend_bf16emu.h — backend_cpu_bf16: the cpu kernels with bf16 storage of activations
 * (backend_bf16emu.c), for build/parity_step --device cpu-bf16.
 */
#ifndef RS_BACKEND_BF16EMU_H
#define RS_BACKEND_BF16EMU_H

#include <stdint.h>

#include "backend/backend.h"

extern const Backend backend_cpu_bf16;
/* x rounded to the nearest bf16 value (ties to even), returned as fp32 */
float bf16emu_round(float x);
/* seed > 0: the emulation's bf16 stores round stochastically, one independent draw per seed
 * (backend_bf16emu.c's header); 0 (the default): round to nearest even */
void bf16emu_set_draw(uint64_t seed);

#endif
