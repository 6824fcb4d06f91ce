/*
 * cmd.h — the subcommands of the command line whose parsing has a file of its
 * own in cmd/ (the rest are in ringscan.c): each takes the arguments after its
 * name (argv[0] is the first of them) and returns the exit code. They parse
 * and check the arguments and call the library (lib/) through its plain API.
 *
 * Callers: cmd/ringscan.c (its command table).
 */
#ifndef RS_CMD_H
#define RS_CMD_H

int cmd_data(int argc, char **argv); /* data.c: `ringscan data synth|bytes|check|inspect` */
int cmd_eval(int argc, char **argv); /* eval.c: `ringscan eval` (lib/run/eval.h) */
int cmd_plot(int argc, char **argv); /* plot.c: `ringscan plot` (lib/run/plot.h) */

#endif
