// commands.h: the subcommands of build/calla; each lives beside the module it drives.
#pragma once

int cmd_synth(int argc, char **argv);             // cli.c
int cmd_info(int argc, char **argv);              // cli.c
int cmd_run(int argc, char **argv);               // cli.c
int cmd_bench(int argc, char **argv);             // harness/bench.c
int cmd_maskbench(int argc, char **argv);         // harness/maskbench.c
int cmd_matrix(int argc, char **argv);            // harness/matrix.c
int cmd_agentbench(int argc, char **argv);        // harness/agentbench.c
int cmd_report(int argc, char **argv);            // harness/report.c
int cmd_adapt_llama_bench(int argc, char **argv); // harness/adapt.c
int cmd_tokenize(int argc, char **argv);          // cli.c
int cmd_serve(int argc, char **argv);             // server.c
int cmd_score(int argc, char **argv);             // score.c
