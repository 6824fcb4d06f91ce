/*
 * rng.h — the one random number generator of ringscan: splitmix64 streams.
 *
 * A stream is identified by (seed, stream id), so every consumer (the weights
 * of each parameter tensor, each epoch's shuffle, the synthetic data) gets
 * its own reproducible sequence that does not depend on what ran before it,
 * on the number of ranks, or on the platform (integer arithmetic only; the
 * normal draw uses libm's log/cos in double, which are correctly rounded on
 * glibc for these arguments in practice and identical on every rank).
 */
#ifndef RS_RNG_H
#define RS_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct {
    uint64_t state;
} Rng;

static inline uint64_t rng_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline Rng rng_stream(uint64_t seed, uint64_t stream) {
    Rng r = {rng_mix(seed * 0x9E3779B97F4A7C15ull + rng_mix(stream + 0x632BE59BD9B4E019ull))};
    return r;
}

static inline uint64_t rng_next(Rng *r) {
    r->state += 0x9E3779B97F4A7C15ull;
    return rng_mix(r->state);
}

/* uniform in the open interval (0, 1) */
static inline double rng_uniform(Rng *r) { return ((double)(rng_next(r) >> 11) + 0.5) / 9007199254740992.0; }

/* uniform integer in [0, n) without modulo bias */
static inline uint64_t rng_below(Rng *r, uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = rng_next(r); while (x >= limit);
    return x % n;
}

/* standard normal (Box-Muller, one value per call) */
static inline double rng_normal(Rng *r) {
    double u = rng_uniform(r), v = rng_uniform(r);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586476925 * v);
}

#endif
