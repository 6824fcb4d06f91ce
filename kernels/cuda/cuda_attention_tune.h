/*
 * cuda_attention_tune.h — the measurement choices of the cuda attention backward
 * (kernels/cuda/attention/backward.cu), for tests/cuda/test_cuda_attention.cu and `ringscan bench
 * attn|cp --attn-tune` (bench/bench.c). The Backend entries never set them: every field at 0 is the
 * built-in choice, and nothing reads the environment. Not thread-safe (one compute stream, as the
 * kernels).
 */
#ifndef RS_CUDA_ATTENTION_TUNE_H
#define RS_CUDA_ATTENTION_TUNE_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CudaAttnTune {
    int dq_atomic; /* 1: the backward's dq adds by plain fp32 atomics instead of in key-block order (not
                      reproducible; the reproducibility case shows that its check can see the difference) */
    int throttle;  /* 1: at hd 256 the throttled kernel instance at every size (built in: above 64k keys only) */
} CudaAttnTune;

/* NULL: every choice back to the built-in one */
void cuda_attention_tune_set(const CudaAttnTune *t);

#ifdef __cplusplus
}
#endif

#endif
