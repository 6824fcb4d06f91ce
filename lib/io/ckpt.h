/*
 * ckpt.h — checkpoints of a run directory: atomic, verified on load, with retention and fallback to an
 * older checkpoint. The base of exact resume and of surviving Slurm preemption.
 *
 * Layout: RUN_DIR/ckpt/step_NNNNNNNN/ holds one complete checkpoint (the caller's safetensors files and
 * manifest.json, written last: format, version, step, the caller's "state" object, every file's size and
 * crc32, and the manifest's own crc32 over its compact key-sorted JSON); RUN_DIR/ckpt/LATEST names the
 * newest complete one; RUN_DIR/ckpt/.lock is flock'd while a save runs.
 *
 * Save (ckpt_save; rank 0 only, the caller decides): under the lock, clear a crashed save's leftovers,
 * write everything into a step_N.tmp.<pid>/ directory (each file fsynced), rename it into place
 * (RENAME_EXCHANGE over an existing step_N), replace LATEST by rename, then delete checkpoints beyond
 * `keep`, each renamed to a .tmp. name first. A crash at any point leaves the previous checkpoint
 * loadable and LATEST naming a complete one.
 * Load (ckpt_load; read-only, any rank): verify the checkpoint LATEST names (manifest crc32, step, every
 * file's size, crc32 and safetensors header); on failure warn once, naming it and what failed, and try
 * the older ones, newest first.
 *
 * Return values: 0, RS_EXIT_USAGE (bad arguments, or no checkpoint that verifies: bad input) or
 * RS_EXIT_FAIL (an I/O failure while saving), with one line in `err`; the trainer prints it with rank and
 * host and exits with that code. Nothing here exits.
 *
 * The protocol step by step, its crash cases and limits: docs/design/checkpoints.md.
 * Callers: the trainer (lib/run/: save every N steps and on SIGUSR1/SIGTERM; load on resume),
 * tests/tools/ckpt_stress.c, tests/unit/test_ckpt.c.
 */
#ifndef RS_CKPT_H
#define RS_CKPT_H

#include <jansson.h>
#include <stdint.h>

#include "model/model_params.h"
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

/* A save in parts, for tensor files that several processes write (the trainer's sharded checkpoints): one
 * process begins it (the lock, a crashed save's leftovers cleared, the step's temporary directory sv->tmp);
 * every process writes its files into sv->tmp (safetensors_write_file: durable, with size and crc32) and
 * hands their CkptWritten to it; it finishes with its own files and those entries (the manifest lists them
 * all; then the rename, LATEST and retention, as ckpt_save), or aborts (the temporary directory removed).
 * Either releases the lock. A process that dies before the finish leaves no manifest: the previous
 * checkpoint stays the newest, and the next save clears the leftovers. ckpt_save is begin + finish. */
#define CKPT_PATH_MAX 4096
typedef struct {
    int     fd; /* the lock; -1: none held */
    int64_t step;
    char    ckdir[CKPT_PATH_MAX], tmp[CKPT_PATH_MAX];
} CkptSave;
typedef struct {
    char     name[64];
    int64_t  size;
    uint32_t crc32;
} CkptWritten;
int  ckpt_save_begin(CkptSave *sv, const char *run_dir, int64_t step, char *err, size_t err_len);
int  ckpt_save_finish(CkptSave *sv, const CkptFile *files, int64_t n_files, const CkptWritten *written,
                      int64_t n_written, const json_t *state, int64_t keep, char *err, size_t err_len);
void ckpt_save_abort(CkptSave *sv);

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

/* Loads one step directory (verified as ckpt_load does, no fallback). */
int ckpt_load_dir(Ckpt *ck, const char *dir, int64_t step, char *err, size_t err_len);

/* ---- sharded checkpoints (ckpt_shard.c) ----
 * Files shard-RRRRR.safetensors, one per rank, of 1-D F32 slices "<prefix><tensor>@<first element>".
 * is_sharded: the checkpoint holds such files. slice_name: a slice's name. shard_read: every slice of
 * prefix ("", "m.", "v.") into dst (ptab->buffer_numel floats, at each tensor's offset), only elements
 * [lo[i], hi[i]) of tensor i (NULL: all), from whichever files hold them; an error when any wanted element
 * is in no file. */
int  ckpt_is_sharded(const Ckpt *ck);
void ckpt_shard_slice_name(char *buf, size_t n, const char *prefix, const char *tensor, int64_t first);
int  ckpt_shard_read(const Ckpt *ck, const char *prefix, const ParamTable *ptab, float *dst, const int64_t *lo,
                     const int64_t *hi, char *err, size_t err_len);

/* Verifies one step directory as ckpt_load does; on success *manifest gets
 * the parsed manifest (owned by the caller) when manifest is not NULL. */
int ckpt_verify_dir(const char *dir, int64_t step, json_t **manifest, char *err, size_t err_len);

/* The steps of the final-named step_NNNNNNNN directories under RUN_DIR/ckpt
 * that hold a manifest (not verified), ascending, malloc'd. No ckpt/ gives
 * 0 steps. */
int ckpt_list_steps(const char *run_dir, int64_t **steps, int64_t *n, char *err, size_t err_len);

/* Checks an output path of any command (export OUT, eval --out, data OUT, plot --out, run.out_dir) before any
 * work: fsio_resolve_output (kind FSIO_OUT_FILE / FSIO_OUT_DIR), then refuses a path that lies inside a run's
 * checkpoint tree (a directory named ckpt that holds LATEST or .lock, or whose parent holds a run's .lock),
 * or inside a checkpoint directory (step_N holding manifest.json): rotation deletes checkpoint directories,
 * and a resume finds files there it did not write. Symlinks are resolved first. 0, or RS_EXIT_USAGE /
 * RS_EXIT_FAIL with one line (and a hint) in err naming `what`. Writes nothing. */
int ckpt_check_output(const char *path, int kind, const char *what, char *err, size_t err_len);

/* Removes the temporaries a save that did not finish left under RUN_DIR/ckpt (step_N.tmp.<pid>/,
 * LATEST.tmp: a writer killed mid-save, e.g. by the launcher's SIGKILL); their names, space-separated,
 * into `names` ("" when none). The trainer calls it when a run starts (rank 0), so a leftover is named
 * in log.txt and gone before the first step; ckpt_save clears them as well. Another process holding
 * ckpt/.lock: nothing removed (the temporaries may be its save's), 0. */
int ckpt_remove_leftovers(const char *run_dir, char *names, size_t names_len, char *err, size_t err_len);

#endif
