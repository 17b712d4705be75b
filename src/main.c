// main.c: `calla <command> [flags]`: one binary, one table of subcommands.
#include "commands.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"synth", cmd_synth, "write a random-weight checkpoint in the exact MLX layout"},
    {"info", cmd_info, "validate a checkpoint and print its geometry and sizes"},
    {"run", cmd_run, "generate greedily from a prompt"},
    {"bench", cmd_bench, "one benchmark measurement (docs/BENCH.md protocol), JSON record"},
    {"maskbench", cmd_maskbench, "constrained decoding's cost: token trie, masks, decode overhead with a schema"},
    {"agentbench", cmd_agentbench,
     "a coding agent's conversation replayed through a running server: per-turn TTFT, cache"},
    {"matrix", cmd_matrix, "engines x contexts x rounds: results folder with report.md and plots"},
    {"report", cmd_report, "rewrite report.md and plots of a results folder"},
    {"adapt-llama-bench", cmd_adapt_llama_bench, "map llama-bench -o json output onto bench records"},
    {"score", cmd_score, "teacher-forced scoring: next-token log-probabilities, perplexity, KL vs a reference"},
    {"tokenize", cmd_tokenize, "print the token ids of a text (or decode ids) with a checkpoint's tokenizer"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server (batch 1, greedy, session cache)"},
};

static void usage(FILE *f) {
    fprintf(f, "calla: a batch-1 greedy inference server for Qwen3.6-35B-A3B (MLX 4-bit)\n\nusage: calla <command> "
               "[flags]\n\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`calla <command> --help` lists a command's flags.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "calla: unknown command \"%s\"\n\n", argv[1]);
    usage(stderr);
    return 2;
}
