/*
 * sbatch.h — the job script of a run: slurm/job.sbatch.in filled in from a
 * config and the paths `ringscan submit` resolved.
 *
 * The template is compiled into the binary (the Makefile turns it into the
 * array sbatch_template[]), so a job never depends on the source tree. Its
 * placeholders are {{name}} (replaced by the value, which may be empty only
 * where the table in sbatch.c says so) and {{name?}} (the whole line is left
 * out when the value is empty: optional #SBATCH options).
 *
 * Every value is checked once more here, whatever the config loader already
 * checked: only [A-Za-z0-9_.,/+=@:-] may reach the script, so no quote,
 * space, '$', ';', '`', '%' or newline can, and a refused value is reported
 * with the key it came from. Nothing is quoted "just in case".
 *
 * Callers: scheduler/submit.c; tests/test_slurm.py through `ringscan submit`.
 */
#ifndef RS_SBATCH_H
#define RS_SBATCH_H

#include <stdint.h>

#include "config/config.h"

/* Absolute paths the script uses (validated like every other value). */
typedef struct {
    const char *run_dir;  /* run.out_dir made absolute */
    const char *workdir;  /* the job's working directory: where submit ran */
    const char *ringscan; /* the binary the job runs */
    const char *config;   /* run_dir/config.submitted.yaml */
    const char *site_env; /* slurm.site_env made absolute, or "" */
} SbatchPaths;

/* The rendered script (malloc'd), or NULL after appending one message per
 * refused value to `err`, each naming its key. */
char *sbatch_render(const Config *cfg, const SbatchPaths *paths, ConfigErrors *err);

/* slurm/job.sbatch.in, NUL-terminated (generated: build/gen/sbatch_template.c). */
extern const char sbatch_template[];

#endif
