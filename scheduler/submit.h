/*
 * submit.h — `ringscan submit CONFIG [--set key=value]... [--dry-run]`.
 *
 * Takes a config that loaded and passed config_validate (which includes
 * slurm.nodes x slurm.gpus_per_node = parallel.dp x parallel.cp and the
 * character checks of every string key), then:
 *   1. refuses a run that does not fit (plan's verdict: exit 1);
 *   2. resolves the paths the job needs (run directory, working directory,
 *      this binary, slurm.site_env) to absolute ones and refuses a run
 *      directory that already holds a run or a submitted job (exit 2; a
 *      dry run warns on stderr instead and goes on);
 *   3. renders the job script (sbatch.h), refusing any value outside the
 *      script's character set with a message naming its key (exit 2);
 *   4. --dry-run: prints the script and writes nothing; otherwise writes
 *      RUN_DIR/config.submitted.yaml and RUN_DIR/job.sbatch, creates
 *      RUN_DIR/logs/, runs `sbatch --parsable RUN_DIR/job.sbatch` (no shell
 *      in between) and prints the job id alone on stdout. If sbatch fails,
 *      the files are removed again so that the same command can be retried.
 *
 * Callers: cmd/ringscan.c.
 */
#ifndef RS_SUBMIT_H
#define RS_SUBMIT_H

#include "config/config.h"

/* Returns the exit code (RS_EXIT_*). `config_path` is for messages. */
int submit_run(const Config *cfg, const char *config_path, int dry_run);

#endif
