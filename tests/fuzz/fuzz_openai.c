// libFuzzer target: the OpenAI request parser (src/openai.c, openai_parse_request): a request body
// -> a job (the chat template, tools, response_format, logprobs, stops, limits) or a 4xx with a
// message.  The first byte picks the endpoint; the tokenizer is the synthetic small one.
// Built and run by tools/dev/fuzz.sh (make fuzz).
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include "openai.h"
#include "synth.h"
#include "tokenizer.h"

static struct openai_ctx oc;

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
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    struct req_error re;
    struct job *j =
        openai_parse_request(&oc, data[0] & 1 ? OPENAI_COMPLETIONS : OPENAI_CHAT, (const char *)data + 1, size - 1, &re);
    if (j) {
        job_unref(j);
    } else {
        if (re.status < 400 || re.status > 599) __builtin_trap();
        json_t *e = openai_error_body(re.status, re.param, re.msg);   // the message must be valid UTF-8 JSON
        if (!e) __builtin_trap();
        char *s = json_dumps(e, 0);
        if (!s) __builtin_trap();
        free(s);
        json_decref(e);
    }
    return 0;
}
