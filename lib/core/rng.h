/*
 * rng.h — the one random number generator of ringscan: SplitMix64 streams
 * (Steele, Lea, Flood 2014), integer-only, so a seed gives the same numbers
 * on every machine and compiler. Exactly:
 *
 *   mix(z)        z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
 *                 z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31
 *   init(s, k)    state = mix(s ^ mix(k + 0x632BE59BD9B4E019))   (seed s, stream k)
 *   next()        state += 0x9E3779B97F4A7C15; return mix(state)
 *   below(b)      uniform in [0, b): draw r = next() until r >= (2^64 - b) mod b,
 *                 return r mod b (rejection removes the modulo bias)
 *   uniform()     ((next() >> 11) + 0.5) / 2^53, in the open interval (0, 1)
 *   normal()      Box-Muller from two uniforms, one value per call (libm log/cos)
 *
 * A stream is identified by (seed, stream id), so every consumer gets its own
 * reproducible sequence that does not depend on what ran before it or on the
 * number of ranks: the weights of parameter tensor i use stream i
 * (model.c), the shuffle of epoch e uses stream e (data_pack.c), the
 * synthetic task uses the RNG_STREAM_SYNTH_* streams (data_synth.c).
 * tests/test_data.py re-implements this in Python and must agree with it.
 */
#ifndef RS_RNG_H
#define RS_RNG_H

#include <math.h>
#include <stdint.h>

#define RNG_STREAM_SYNTH_CHAIN   UINT64_C(0x5359000000000001) /* synth: the filler chain's successor table */
#define RNG_STREAM_SYNTH_LENGTHS UINT64_C(0x5359000000000002) /* synth: document lengths */
#define RNG_STREAM_SYNTH_TOKENS  UINT64_C(0x5359000000000003) /* synth: document contents */

typedef struct {
    uint64_t state;
} Rng;

static inline uint64_t rng_mix(uint64_t z) {
    z ^= z >> 30;
    z *= UINT64_C(0xBF58476D1CE4E5B9);
    z ^= z >> 27;
    z *= UINT64_C(0x94D049BB133111EB);
    z ^= z >> 31;
    return z;
}

static inline void rng_init(Rng *r, uint64_t seed, uint64_t stream) {
    r->state = rng_mix(seed ^ rng_mix(stream + UINT64_C(0x632BE59BD9B4E019)));
}

static inline uint64_t rng_next(Rng *r) {
    r->state += UINT64_C(0x9E3779B97F4A7C15);
    return rng_mix(r->state);
}

/* The stream as it is after n more draws (rng_next calls): SplitMix64's state moves by a constant per draw. */
static inline void rng_skip(Rng *r, uint64_t n) { r->state += n * UINT64_C(0x9E3779B97F4A7C15); }

/* Uniform in [0, bound), bound >= 1. */
static inline uint64_t rng_below(Rng *r, uint64_t bound) {
    uint64_t limit = (0 - bound) % bound;
    uint64_t x;
    do x = rng_next(r);
    while (x < limit);
    return x % bound;
}

/* Uniform in the open interval (0, 1). */
static inline double rng_uniform(Rng *r) { return ((double)(rng_next(r) >> 11) + 0.5) / 9007199254740992.0; }

/* Standard normal (Box-Muller, one value per call). */
static inline double rng_normal(Rng *r) {
    double u = rng_uniform(r), v = rng_uniform(r);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586476925 * v);
}

#endif
