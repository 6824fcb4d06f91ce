/*
 * cuda_info.h — C-callable description of the cuda backend's build and of
 * the GPUs visible now (CUDA runtime and driver versions, cuBLASLt and NCCL
 * versions, device names, memory and SM counts). Used by `ringscan version`.
 */
#ifndef RS_CUDA_INFO_H
#define RS_CUDA_INFO_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

void cuda_info_print(FILE *f);

#ifdef __cplusplus
}
#endif

#endif
