/*
 * data_rng.h — the random numbers of the data module: the per-epoch document
 * shuffle (data_pack.c) and the synthetic task (data_synth.c).
 *
 * Integer-only, so the same seed gives the same order on every machine and
 * compiler. The generator is SplitMix64 (Steele, Lea, Flood 2014): a 64-bit
 * counter advanced by the golden-ratio constant, passed through a mixing
 * function. Exactly:
 *
 *   mix(z)      z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
 *               z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31
 *   init(s, k)  state = mix(s ^ mix(k + 0x632BE59BD9B4E019))   (seed s, stream k)
 *   next()      state += 0x9E3779B97F4A7C15; return mix(state)
 *   below(b)    uniform in [0, b): draw r = next() until r >= (2^64 - b) mod b,
 *               return r mod b (rejection removes the modulo bias)
 *
 * Streams keep independent uses apart: the shuffle of epoch e uses stream e;
 * the synthetic task uses the DATA_RNG_STREAM_SYNTH_* streams.
 *
 * Callers: data_pack.c, data_synth.c, tests/unit/test_data.c.
 */
#ifndef RS_DATA_RNG_H
#define RS_DATA_RNG_H

#include <stdint.h>

#define DATA_RNG_STREAM_SYNTH_CHAIN   UINT64_C(0x5359000000000001) /* the filler chain's successor table */
#define DATA_RNG_STREAM_SYNTH_LENGTHS UINT64_C(0x5359000000000002) /* document lengths */
#define DATA_RNG_STREAM_SYNTH_TOKENS  UINT64_C(0x5359000000000003) /* document contents */

typedef struct {
    uint64_t state;
} DataRng;

static inline uint64_t data_rng_mix(uint64_t z) {
    z ^= z >> 30;
    z *= UINT64_C(0xBF58476D1CE4E5B9);
    z ^= z >> 27;
    z *= UINT64_C(0x94D049BB133111EB);
    z ^= z >> 31;
    return z;
}

static inline void data_rng_init(DataRng *r, uint64_t seed, uint64_t stream) {
    r->state = data_rng_mix(seed ^ data_rng_mix(stream + UINT64_C(0x632BE59BD9B4E019)));
}

static inline uint64_t data_rng_next(DataRng *r) {
    r->state += UINT64_C(0x9E3779B97F4A7C15);
    return data_rng_mix(r->state);
}

/* Uniform in [0, bound), bound >= 1. */
static inline uint64_t data_rng_below(DataRng *r, uint64_t bound) {
    uint64_t limit = (0 - bound) % bound;
    uint64_t x;
    do x = data_rng_next(r);
    while (x < limit);
    return x % bound;
}

#endif
