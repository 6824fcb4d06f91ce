/*
 * bench.h — `ringscan bench attn|gdn|step|all`: our kernels and our training
 * step timed on the GPU, optionally beside the peers of tests/peer (PyTorch
 * SDPA, flash-linear-attention, transformers) run on the same GPU in the same
 * call, printed as one table with the ratios.
 *
 * The code lives in lib/ because it drives the Backend table and the model
 * exactly as lib/train.c does (scheduler/ decides how jobs run; it runs none).
 * Files, one topic each:
 *   bench.c       options (strict: a bad value names the option, exit 2), the
 *                 order of the work, FLOPs and floors, the tables, bench.json
 *   bench_ops.c   attention and Gated DeltaNet kernels: random inputs, CUDA
 *                 events, warm-up then the median of the repetitions
 *   bench_step.c  one training step of a config on one GPU: tokens/s, MFU,
 *                 peak memory
 *   bench_peer.c  the request file, running a peer script under a time limit,
 *                 reading its result file (tests/peer/README.md: the contract)
 *
 * Every side, ours and each peer, reports the same JSON shape (a "result"
 * object: tests/peer/README.md); bench.c computes FLOPs, floors and ratios
 * from the case definitions, never from what a peer says.
 *
 * Callers: cmd/ringscan.c (bench_main).
 */
#ifndef RS_BENCH_H
#define RS_BENCH_H

#include <jansson.h>
#include <stdint.h>

#include "config.h"

#define BENCH_MAX_LIST 16
#define BENCH_MAX_SETS 64

typedef enum { BENCH_ATTN, BENCH_GDN, BENCH_STEP, BENCH_KIND_COUNT } BenchKind;
extern const char *const bench_kind_names[BENCH_KIND_COUNT];

typedef struct {
    int     kinds[BENCH_KIND_COUNT];        /* which benchmarks run (all: every one) */
    int64_t T[BENCH_MAX_LIST];              /* attn, gdn: sequence lengths */
    int     nT;
    int     attn[BENCH_MAX_LIST][3];        /* attn: nh, nkv, hd */
    int     n_attn;
    int     heads[BENCH_MAX_LIST];          /* gdn: H (key heads = value heads) */
    int     n_heads;
    int     dim;                            /* gdn: K = V */
    int     gdn_keep;                       /* gdn: GdnKeep, what the forward keeps (checkpoint.gdn_keep) */
    int64_t doc_len[BENCH_MAX_LIST];        /* gdn: mean document length; 0 = one document */
    int     n_doc_len;
    const char *config;                     /* step */
    const char *sets[BENCH_MAX_SETS];
    int     n_sets;
    int64_t tokens;                         /* step: tokens per sample (= per step, one GPU) */
    int     warmup, reps;
    double  max_s;
    double  peak_tflops, hbm_tbps;          /* 0: from the device's name */
    int     peer;
    int     write_requests;                 /* only write the request files (no GPU needed) */
    const char *peer_dir, *python, *out_dir;
    double  peer_timeout;
    uint64_t seed;
} BenchOptions;

/* What a measurement needs from the machine (filled by bench.c before any case runs). */
typedef struct {
    char   name[256];
    int    sms;
    double mem_gib;
    double peak_tflops; /* dense bf16, for MFU and the compute floors */
    double hbm_tbps;    /* for the byte floors */
    const char *peak_source, *hbm_source;
} BenchDevice;

int bench_main(int argc, char **argv);

/* bench_ops.c: one case of the request (tests/peer/README.md) on our kernels; returns a result row
 * {"case", "impl": "ringscan", "ms_fwd", "ms_fwdbwd", "reps"}. */
json_t *bench_attn_case(const json_t *c, const BenchOptions *o);
json_t *bench_gdn_case(const json_t *c, const BenchOptions *o);

/* bench_step.c: the training step of `cfg` (already validated, cp = dp = 1, device cuda); returns
 * {"case", "impl": "ringscan", "ms_step", "tokens_per_s", "peak_alloc_bytes", "device_used_bytes",
 * "reps", "loss"}. */
json_t *bench_step_case(const json_t *c, const Config *cfg, const BenchOptions *o);

/* bench_peer.c: writes `request` to OUT/request_KIND.json, runs PYTHON PEER_DIR/script --request
 * ... --out OUT/peer_KIND.json under peer_timeout (its output to OUT/peer_KIND.log) and returns
 * the parsed result object; on any failure a result object with "error" saying what happened. */
json_t *bench_peer_run(const BenchOptions *o, BenchKind kind, const json_t *request);
/* writes `j` to `path` (pretty JSON); exits 1 naming the path when it cannot */
void    bench_write_json(const json_t *j, const char *path);

#endif
