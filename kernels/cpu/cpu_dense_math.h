/*
 * cpu_dense_math.h — scalar activation functions shared by the cpu backend's
 * dense kernels (cpu_norm.c, cpu_elementwise.c): a sigmoid that never
 * overflows and its derivative, SiLU and its derivative, and softplus with torch's default
 * threshold (linear above 20). fp32 in, fp32 out.
 */
#ifndef RS_CPU_DENSE_MATH_H
#define RS_CPU_DENSE_MATH_H

#include <math.h>

/* 1 / (1 + e^-x), written so that expf only sees non-positive arguments */
static inline float cpu_sigmoidf(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

/* d sigmoid(x) / dx = s (1 - s), with 1 - s taken as sigmoid(-x): no cancellation when s -> 1 */
static inline float cpu_sigmoid_gradf(float x) { return cpu_sigmoidf(x) * cpu_sigmoidf(-x); }

static inline float cpu_siluf(float x) { return x * cpu_sigmoidf(x); }

/* d silu(x) / dx = s (1 + x (1 - s)), s = sigmoid(x), 1 - s = sigmoid(-x) */
static inline float cpu_silu_gradf(float x) { return cpu_sigmoidf(x) * (1.0f + x * cpu_sigmoidf(-x)); }

/* log(1 + e^x), and x itself above 20 (torch.nn.functional.softplus defaults) */
static inline float cpu_softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* d softplus(x) / dx: sigmoid(x), and 1 above the threshold (torch's backward) */
static inline float cpu_softplus_gradf(float x) { return x > 20.0f ? 1.0f : cpu_sigmoidf(x); }

#endif
