// libFuzzer target: the request parsers of the protocol modules (src/openai.c, anthropic.c,
// responses.c): a request body -> a job (the chat template, tools, response_format, logprobs,
// stops, limits) or a 4xx with a message.  The first byte picks the endpoint (mod 4: chat,
// completions, Anthropic's messages, the Responses API, with a store holding one response to
// continue); the tokenizer is the synthetic small one.
// Built and run by tools/dev/fuzz.sh (make fuzz).
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include "anthropic.h"
#include "openai.h"
#include "responses.h"
#include "synth.h"
#include "tokenizer.h"

static struct openai_ctx oc;
static struct chatreq_ctx cc;
static struct rstore store;   // holds "resp_fuzz", a response whose turn ended

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    char dir[] = "/tmp/calla_fuzz_tok_XXXXXX", err[256];
    struct tokenizer *tok;
    if (!mkdtemp(dir) || synth_write_small_tokenizer(dir, err, sizeof err) || tokenizer_load(dir, &tok, err, sizeof err)) {
        fprintf(stderr, "fuzz_openai: no tokenizer: %s\n", err);
        exit(1);
    }
    DIR *d = opendir(dir);   // the files are loaded: remove them
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (e->d_name[0] != '.') unlink(path);
    }
    if (d) closedir(d);
    rmdir(dir);
    oc = (struct openai_ctx){.tok = tok, .vocab = 248320, .context = 4096, .default_max_tokens = 8, .model_name = "m"};
    cc = (struct chatreq_ctx){.tok = tok, .vocab = 248320, .context = 4096, .default_max_tokens = 8, .model_name = "m"};
    struct rstore_entry *e = calloc(1, sizeof *e);
    if (rstore_init(&store, 4, 1 << 20) || !e) exit(1);
    snprintf(e->id, sizeof e->id, "resp_fuzz");
    e->response = strdup("{}");
    e->tools = strdup("");
    e->conv = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]", 0, NULL);
    static const int32_t toks[] = {248045, 872, 198, 6023, 248046, 198, 248045, 77091, 198, 4163, 248046};
    e->n_tokens = sizeof toks / sizeof toks[0];
    e->tokens = malloc(sizeof toks);
    if (!e->tokens) exit(1);
    memcpy(e->tokens, toks, sizeof toks);
    e->continuable = true;
    rstore_put(&store, e);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    struct req_error re = {0};
    const char *body = (const char *)data + 1;
    const int ep = data[0] % 4;
    struct job *j = ep == 2   ? anthropic_parse_request(&cc, body, size - 1, &re)
                    : ep == 3 ? responses_parse_request(&cc, &store, body, size - 1, &re)
                              : openai_parse_request(&oc, ep ? OPENAI_COMPLETIONS : OPENAI_CHAT, body, size - 1, &re);
    if (j) {
        job_unref(j);
    } else {
        if (re.status < 400 || re.status > 599) __builtin_trap();
        json_t *e = ep == 2 ? anthropic_error_body(re.status, re.msg) : openai_error_body(re.status, re.param, re.msg);
        if (!e) __builtin_trap();
        char *s = json_dumps(e, 0);
        if (!s) __builtin_trap();
        free(s);
        json_decref(e);
    }
    return 0;
}
