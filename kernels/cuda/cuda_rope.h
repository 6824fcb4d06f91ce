/*
 * cuda_rope.h — what cuda_rope.cu offers beyond the Backend entries: the
 * (cos, sin) table its kernels use, written out in fp32, so a test can
 * measure the angle error against float64 (tests/cuda/test_cuda_rope.cu).
 */
#ifndef RS_CUDA_ROPE_H
#define RS_CUDA_ROPE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cs[t, i] = (cos, sin) of pos[t] * theta^(-2i/rd), i < rd/2, as the rope kernels compute them
 * (compensated = 1; 0: the plain fp32 product pos * inv_freq, for comparison). cs and pos on device. */
void cuda_rope_table(float *cs /* (T, rd/2, 2) */, const int32_t *pos /* (T) */, int64_t T, int rd, float theta,
                     int compensated);

#ifdef __cplusplus
}
#endif

#endif
