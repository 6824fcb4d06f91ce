/*
 * ckpt.h — checkpoints of a run directory: atomic, verified on load, with
 * retention and fallback to an older checkpoint. The base of exact resume and
 * of surviving Slurm preemption.
 *
 * Layout:
 *   RUN_DIR/ckpt/step_NNNNNNNN/     one complete checkpoint (8-digit step)
 *       model.safetensors ...       the caller's tensor files (safetensors.h)
 *       manifest.json               written last: see below
 *   RUN_DIR/ckpt/LATEST             "step_NNNNNNNN\n": the newest complete one
 *   RUN_DIR/ckpt/.lock              flock'd while a save runs (the trainer holds
 *                                   RUN_DIR/.lock for its whole life, lib/run/train.c;
 *                                   this one also guards saves from outside it)
 *
 * manifest.json:
 *   {"format": "ringscan-ckpt", "version": 1, "step": N,
 *    "state": {...the caller's object: data position, RNG state, config hash...},
 *    "files": [{"name": "model.safetensors", "size": BYTES, "crc32": CRC}, ...],
 *    "crc32": CRC of the manifest itself}
 * The manifest's own crc32 is taken over its compact, key-sorted JSON without
 * the "crc32" key, so a flipped digit in the state is caught too.
 *
 * Save (ckpt_save; only rank 0 calls it, the caller decides):
 *   1. take ckpt/.lock; remove stale `step_*.tmp.*` directories and
 *      `LATEST.tmp*` left by a crashed save;
 *   2. write every file into ckpt/step_N.tmp.<pid>/ (each fsynced), then the
 *      manifest (fsynced), then fsync that directory;
 *   3. rename it to ckpt/step_N (an existing step_N is swapped out atomically
 *      with renameat2(RENAME_EXCHANGE), then removed), fsync ckpt/;
 *   4. write ckpt/LATEST.tmp, fsync, rename over ckpt/LATEST, fsync ckpt/;
 *   5. retention: of the complete checkpoints older than N, keep the newest
 *      keep-1 (with N itself that makes `keep`); delete the others oldest
 *      first, each renamed to a `.tmp.` name before its files go, so a crash
 *      mid-delete never leaves a half-deleted checkpoint under a real name.
 *      Checkpoints newer than N (left by a run that was resumed from an
 *      earlier step) are left alone; saving their steps again replaces them.
 * A crash at any point leaves the previous checkpoint loadable and LATEST
 * naming a complete one. A crash after step 3 and before the end of step 5
 * leaves one checkpoint more than `keep` on disk (crashes in a row there, one
 * more each); the next save that completes removes them.
 *
 * Load (ckpt_load; read-only, any rank): read LATEST and verify that
 * directory (manifest parses and its crc32 matches; the step agrees with the
 * name; every listed file exists with the listed size and crc32 and opens as
 * a valid safetensors file). If that fails, print one warning naming the
 * checkpoint and what failed, and try the older ones, newest first. When
 * LATEST is missing or unreadable, every step_* directory is a candidate.
 *
 * Return values: 0, RS_EXIT_USAGE (bad arguments, or no checkpoint that
 * verifies: bad input) or RS_EXIT_FAIL (an I/O failure while saving), with
 * one line in `err`; the trainer prints it with rank and host and exits with
 * that code. Nothing here exits.
 *
 * Limits: on a file system without RENAME_EXCHANGE (some network file
 * systems), re-saving an existing step falls back to two renames, and a
 * crash between them makes the loader fall back to the previous checkpoint.
 * A load running while another process saves into the same run directory
 * may see an older checkpoint deleted under it (and then fall back).
 *
 * Callers: the trainer (lib/train*.c: save every N steps and on SIGUSR1/
 * SIGTERM; load on resume), tests/tools/ckpt_stress.c, tests/unit/test_ckpt.c.
 */
#ifndef RS_CKPT_H
#define RS_CKPT_H

#include <jansson.h>
#include <stdint.h>

#include "safetensors.h"

#define CKPT_MAX_STEP 99999999        /* 8 digits */
#define CKPT_MANIFEST "manifest.json"
#define CKPT_FORMAT "ringscan-ckpt"
#define CKPT_VERSION 1

/* One tensor file of a checkpoint. `name` is a plain file name made of
 * [A-Za-z0-9._-], not starting with '.', not "manifest.json". */
typedef struct {
    const char *name;
    const StTensor *tensors;
    int64_t n_tensors;
    const json_t *metadata; /* optional safetensors "__metadata__" (strings) */
} CkptFile;

/* Saves step `step` (0..CKPT_MAX_STEP) of `run_dir` (which must exist).
 * `state` is the caller's JSON object (NULL: {}); `keep` >= 1. */
int ckpt_save(const char *run_dir, int64_t step, const CkptFile *files, int64_t n_files, const json_t *state,
              int64_t keep, char *err, size_t err_len);

/* Test hook: when set, called at each stage of a save ("tmp_created",
 * "file_written", "manifest_written", "renamed", "latest_written",
 * "retention_renamed", "retention_done"), so a test can kill the process at
 * an exact point. NULL in the trainer. */
extern void (*ckpt_save_hook)(const char *stage, int64_t step);

/* A loaded checkpoint. */
typedef struct {
    char *dir;        /* RUN_DIR/ckpt/step_NNNNNNNN */
    int64_t step;
    json_t *manifest; /* owned */
    json_t *state;    /* the caller's object (borrowed from manifest) */
    int64_t n_files;
    char **file_names;
    SafetensorsFile *files; /* open, validated */
    int64_t n_rejected;     /* newer checkpoints that failed verification */
} Ckpt;

/* Loads the newest checkpoint of `run_dir` that verifies (see above). On
 * failure `ck` holds nothing to close. */
int ckpt_load(Ckpt *ck, const char *run_dir, char *err, size_t err_len);
void ckpt_close(Ckpt *ck);

/* The open tensor file `file` of a loaded checkpoint, or NULL. */
const SafetensorsFile *ckpt_file(const Ckpt *ck, const char *file);

/* Reads tensor `tensor` of file `file` into dst with dtype and shape checks
 * (see safetensors_read). */
int ckpt_read(const Ckpt *ck, const char *file, const char *tensor, StDtype dtype, int32_t ndim,
              const int64_t *shape, void *dst, char *err, size_t err_len);

/* Verifies one step directory as ckpt_load does; on success *manifest gets
 * the parsed manifest (owned by the caller) when manifest is not NULL. */
int ckpt_verify_dir(const char *dir, int64_t step, json_t **manifest, char *err, size_t err_len);

/* The steps of the final-named step_NNNNNNNN directories under RUN_DIR/ckpt
 * that hold a manifest (not verified), ascending, malloc'd. No ckpt/ gives
 * 0 steps. */
int ckpt_list_steps(const char *run_dir, int64_t **steps, int64_t *n, char *err, size_t err_len);

#endif
