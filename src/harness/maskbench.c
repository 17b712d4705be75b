// maskbench.c: `calla maskbench`, the cost of constrained decoding (see maskbench.h).
//
//   1. the token trie: build time, nodes, memory
//   2. compile time of every schema of the tests (and --json-schema's)
//   3. masks on the CPU alone, on documents made by random logits: the trie's walk, the
//      per-token walk (token_mask_naive, the reference it must equal), the masked argmax, and the
//      pick of mask mode off (all logits sorted, each candidate through the matcher)
//   4. decode at --context: --tokens steps unconstrained, then the same steps from the same
//      state with the schema in each mask mode (off, sync, overlap); ms/token and the overhead,
//      and whether the modes chose the same tokens
#include "maskbench.h"

#include "chat.h"
#include "commands.h"
#include "options.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct maskbench_schema maskbench_schemas[] = {
    {"json_object", NULL},
    {"openai_person",
     "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": "
     "\"integer\"}, \"tags\": {\"type\": \"array\", \"items\": {\"enum\": [\"a\", \"b\", 3]}}, \"ok\": "
     "{\"type\": [\"boolean\", \"null\"]}}, \"required\": [\"name\", \"age\"], "
     "\"additionalProperties\": false}"},
    {"openai_list", "{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"v\": {\"const\": \"n\"}, "
                    "\"next\": {\"anyOf\": [{\"$ref\": \"#/$defs/node\"}, {\"type\": \"null\"}]}}, \"required\": "
                    "[\"v\", \"next\"], \"additionalProperties\": false}}, \"$ref\": \"#/$defs/node\"}"},
    // The tool-call grammar (tool_choice "required"): a JSON array of tools, told apart by its '['.
    {"tool_call", "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", "
                  "\"properties\": {\"s\": {\"type\": \"string\"}, \"n\": {\"type\": \"integer\"}}, \"required\": "
                  "[\"s\", \"n\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"now\"}}]"},
    {"openai_anyof", "{\"anyOf\": [{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"number\"}}, "
                     "\"required\": [\"a\"]}, {\"type\": \"object\", \"properties\": {\"a\": {\"enum\": [1, 12]}, "
                     "\"b\": {\"type\": \"string\"}}, \"required\": [\"a\", \"b\"]}]}"},
    {"server_00", "{\"type\": \"object\", \"properties\": {\"ok\": {\"type\": \"boolean\"}}, \"required\": [\"ok\"], "
                  "\"additionalProperties\": false}"},
    {"server_01", "{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\"}}, \"required\": [\"n\"], "
                  "\"additionalProperties\": false}"},
    {"server_02", "{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"number\"}}, \"required\": [\"x\"], "
                  "\"additionalProperties\": false}"},
    {"server_03", "{\"type\": \"object\", \"properties\": {\"s\": {\"type\": \"string\"}}, \"required\": [\"s\"], "
                  "\"additionalProperties\": false}"},
    {"server_04", "{\"type\": \"object\", \"properties\": {\"z\": {\"type\": \"null\"}}, \"required\": [\"z\"], "
                  "\"additionalProperties\": false}"},
    {"server_05", "{\"type\": \"object\", \"properties\": {\"color\": {\"enum\": [\"red\", \"green\", \"blue\"]}}, "
                  "\"required\": [\"color\"], \"additionalProperties\": false}"},
    {"server_06", "{\"type\": \"object\", \"properties\": {\"v\": {\"const\": \"fixed\"}}, \"required\": [\"v\"], "
                  "\"additionalProperties\": false}"},
    {"server_07",
     "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"boolean\"}, \"c\": "
     "{\"type\": \"null\"}}, \"required\": [\"a\", \"b\", \"c\"], \"additionalProperties\": false}"},
    {"server_08", "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": "
                  "\"integer\"}}, \"required\": [\"name\"], \"additionalProperties\": false}"},
    {"server_09", "{\"type\": \"object\", \"properties\": {\"tags\": {\"type\": \"array\", \"items\": {\"type\": "
                  "\"string\"}}}, \"required\": [\"tags\"], \"additionalProperties\": false}"},
    {"server_10",
     "{\"type\": \"object\", \"properties\": {\"m\": {\"type\": \"array\", \"items\": {\"type\": \"array\", \"items\": "
     "{\"type\": \"integer\"}}}}, \"required\": [\"m\"], \"additionalProperties\": false}"},
    {"server_11", "{\"type\": \"object\", \"properties\": {\"o\": {\"type\": \"object\", \"properties\": {\"p\": "
                  "{\"type\": \"object\", \"properties\": {\"q\": {\"type\": \"boolean\"}}, \"required\": [\"q\"], "
                  "\"additionalProperties\": false}}, \"required\": [\"p\"], \"additionalProperties\": false}}, "
                  "\"required\": [\"o\"], \"additionalProperties\": false}"},
    {"server_12", "{\"type\": \"object\", \"properties\": {\"u\": {\"anyOf\": [{\"type\": \"string\"}, {\"type\": "
                  "\"integer\"}, {\"type\": \"null\"}]}}, \"required\": [\"u\"], \"additionalProperties\": false}"},
    {"server_13", "{\"type\": \"object\", \"properties\": {\"t\": {\"type\": [\"boolean\", \"null\"]}}, \"required\": "
                  "[\"t\"], \"additionalProperties\": false}"},
    {"server_14", "{\"type\": \"object\", \"properties\": {\"e\": {\"enum\": [1, 12, 123, \"x\", null, true]}}, "
                  "\"required\": [\"e\"], \"additionalProperties\": false}"},
    {"server_15",
     "{\"type\": \"object\", \"properties\": {\"list\": {\"type\": \"array\", \"items\": {\"type\": \"object\", "
     "\"properties\": {\"k\": {\"type\": \"boolean\"}, \"v\": {\"type\": \"integer\"}}, \"required\": [\"k\", \"v\"], "
     "\"additionalProperties\": false}}}, \"required\": [\"list\"], \"additionalProperties\": false}"},
    {"server_16", "{\"$defs\": {\"leaf\": {\"type\": \"object\", \"properties\": {\"id\": {\"type\": \"integer\"}}, "
                  "\"required\": [\"id\"], \"additionalProperties\": false}}, \"type\": \"object\", \"properties\": "
                  "{\"first\": {\"$ref\": \"#/$defs/leaf\"}, \"second\": {\"$ref\": \"#/$defs/leaf\"}}, \"required\": "
                  "[\"first\", \"second\"], \"additionalProperties\": false}"},
    {"server_17", "{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"v\": {\"type\": \"boolean\"}, "
                  "\"next\": {\"anyOf\": [{\"$ref\": \"#/$defs/node\"}, {\"type\": \"null\"}]}}, \"required\": [\"v\", "
                  "\"next\"], \"additionalProperties\": false}}, \"$ref\": \"#/$defs/node\"}"},
    {"server_18", "{\"type\": \"object\", \"properties\": {\"opt\": {\"type\": \"string\"}, \"req\": {\"type\": "
                  "\"boolean\"}}, \"required\": [\"req\"], \"additionalProperties\": false}"},
    {"server_19", "{\"type\": \"object\", \"properties\": {}, \"required\": [], \"additionalProperties\": false}"},
    {"server_20", "{\"type\": \"object\"}"},
    {"server_21", "{\"type\": \"object\", \"properties\": {\"deep\": {\"type\": \"object\", \"properties\": {\"a\": "
                  "{\"type\": \"object\", \"properties\": {\"b\": {\"type\": \"object\", \"properties\": {\"c\": "
                  "{\"type\": \"integer\"}}, \"required\": [\"c\"], \"additionalProperties\": false}}, \"required\": "
                  "[\"b\"], \"additionalProperties\": false}}, \"required\": [\"a\"], \"additionalProperties\": "
                  "false}}, \"required\": [\"deep\"], \"additionalProperties\": false}"},
    {"server_22",
     "{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"number\"}, \"y\": {\"type\": \"number\"}, \"z\": "
     "{\"type\": \"number\"}}, \"required\": [\"x\", \"y\", \"z\"], \"additionalProperties\": false}"},
    {"server_23", "{\"type\": \"object\", \"properties\": {\"flag\": {\"const\": true}, \"kind\": {\"enum\": [\"a\", "
                  "\"b\"]}}, \"required\": [\"flag\", \"kind\"], \"additionalProperties\": false}"},
    {"server_24",
     "{\"type\": \"object\", \"properties\": {\"any\": {\"anyOf\": [{\"type\": \"object\", \"properties\": {\"k\": "
     "{\"type\": \"integer\"}}, \"required\": [\"k\"], \"additionalProperties\": false}, {\"type\": \"object\", "
     "\"properties\": {\"k\": {\"type\": \"string\"}, \"j\": {\"type\": \"boolean\"}}, \"required\": [\"k\", \"j\"], "
     "\"additionalProperties\": false}]}}, \"required\": [\"any\"], \"additionalProperties\": false}"},
    {"server_25", "{\"type\": \"object\", \"properties\": {\"arr\": {\"type\": \"array\", \"items\": {\"enum\": [1, "
                  "2]}}}, \"required\": [\"arr\"], \"additionalProperties\": false}"},
    {"server_26", "{\"type\": \"object\", \"properties\": {\"s1\": {\"type\": \"string\"}, \"s2\": {\"type\": "
                  "\"string\"}}, \"required\": [\"s1\", \"s2\"], \"additionalProperties\": false}"},
    {"server_27",
     "{\"type\": \"object\", \"properties\": {\"i1\": {\"type\": \"integer\"}, \"n1\": {\"type\": \"number\"}, \"b1\": "
     "{\"type\": \"boolean\"}, \"z1\": {\"type\": \"null\"}, \"s1\": {\"type\": \"string\"}}, \"required\": [\"i1\", "
     "\"n1\", \"b1\", \"z1\", \"s1\"], \"additionalProperties\": false}"},
    {"server_28",
     "{\"type\": \"object\", \"properties\": {\"nested\": {\"type\": \"array\", \"items\": {\"type\": \"object\", "
     "\"properties\": {\"inner\": {\"type\": \"array\", \"items\": {\"type\": \"boolean\"}}}, \"required\": "
     "[\"inner\"], \"additionalProperties\": false}}}, \"required\": [\"nested\"], \"additionalProperties\": false}"},
    {"server_29",
     "{\"type\": \"object\", \"properties\": {\"title\": {\"type\": \"string\"}}, \"required\": [\"title\"], "
     "\"additionalProperties\": false, \"description\": \"ignored\", \"title\": \"ignored too\"}"},
    {"server_30", "{\"type\": \"object\", \"properties\": {\"unicode_k\\u00e9y\": {\"type\": \"boolean\"}, "
                  "\"quote\\\"key\": {\"type\": \"integer\"}}, \"required\": [\"unicode_k\\u00e9y\", "
                  "\"quote\\\"key\"], \"additionalProperties\": false}"},
};
const int maskbench_n_schemas = sizeof maskbench_schemas / sizeof maskbench_schemas[0];

int maskbench_decode(struct engine *e, struct seq *s, const struct cschema *schema, const struct tokenizer *tok,
                     const struct token_trie *trie, enum mask_mode mode, int32_t last, int n, int doc_budget,
                     int32_t *out, struct maskbench_run *r, char *err, size_t errlen) {
    const int vocab = engine_geometry(e)->vocab;
    float *logits = schema ? engine_logits_alloc(e, (size_t)vocab) : NULL;
    struct constrained con = {0};
    memset(r, 0, sizeof *r);
    if (schema && (!logits || constrained_init(&con, schema, tok, trie, mode))) {
        snprintf(err, errlen, "out of memory");
        engine_logits_free(e, logits);
        constrained_free(&con);
        return -1;
    }
    const int row = 0;
    const struct forward_opts fo = {.logit_rows = &row, .n_logit_rows = schema ? 1 : 0, .logits = logits};
    int32_t tok_id = last;
    int left = doc_budget, rc = n;
    const double t0 = now_s();
    if (schema) constrained_prepare(&con); // the first mask, during the first forward (the server: the prefill)
    for (int i = 0; i < n; i++) {
        int32_t greedy;
        if (engine_forward(e, s, &tok_id, 1, &fo, &greedy, err, errlen)) {
            rc = -1;
            break;
        }
        const double tp = now_s();
        tok_id = schema ? constrained_pick(&con, logits, greedy, left--) : greedy;
        r->pick_ms += now_s() - tp;
        out[i] = tok_id;
        if (schema && chat_is_stop(tok_id)) { // the next document
            constrained_restart(&con);
            left = doc_budget;
            r->docs++;
        }
        if (schema) constrained_prepare(&con);
    }
    r->ms_per_token = 1e3 * (now_s() - t0) / n;
    r->pick_ms *= 1e3 / n;
    if (schema) {
        constrained_free(&con); // joins the helper thread: its counters are final after
        r->wait_ms = 1e3 * con.wait_s / n;
        r->mask_ms = con.n_masks ? 1e3 * con.mask_s / (double)con.n_masks : 0;
        r->n_masks = con.n_masks, r->n_greedy = con.n_greedy, r->n_picks = con.n_picks;
    }
    engine_logits_free(e, logits);
    return rc;
}

enum { MAX_ROUNDS = 15 };

// ---- the command ---------------------------------------------------------------------------------

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return rng_state;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int compile_text(const char *text, struct cschema **out, char *err, size_t errlen) {
    json_error_t je;
    json_t *j = text ? json_loads(text, 0, &je) : NULL;
    if (text && !j) {
        snprintf(err, errlen, "not JSON: %s (line %d)", je.text, je.line);
        return -1;
    }
    int rc = json_is_array(j) ? constrain_compile_tool_call(j, NULL, out, err, errlen)
                              : constrain_compile(j, out, err, errlen);
    json_decref(j);
    return rc;
}

// Step 3: masks on the CPU alone, over the states of documents made by random logits.
// Random logits with JSON's structural tokens (and the tool-call markup's) lifted now and then,
// so that documents have every kind of state, not strings that never end.
static void random_logits(float *l, int vocab, const struct tokenizer *tok) {
    for (int k = 0; k < vocab; k++) l[k] = (float)(rng_next() >> 40) / (float)(1 << 24);
    static const char *const lift[] = {"\"", "\\",    ",",   "}", "]",  ":",  "0",    "1",    "-",   ".", "e",  "n",
                                       "u",  "\",\"", "\"}", "<", "</", "\n", "true", "null", "{\"", "[", "\":"};
    for (size_t i = 0; i < sizeof lift / sizeof lift[0]; i++)
        if (rng_next() % 3 == 0) {
            int32_t id = tokenizer_token_id(tok, lift[i], strlen(lift[i]));
            if (id >= 0 && id < vocab) l[id] = 2.0f + (float)(rng_next() % 100) / 100.0f;
        }
}

// label NULL: the full report (and into js); else one line for the schema named label.
static void cpu_masks(const struct cschema *c, const struct tokenizer *tok, const struct token_trie *trie, int vocab,
                      int steps, int naive_steps, int doc, json_t *js, const char *label) {
    const size_t words = token_mask_words(vocab);
    uint64_t *m = malloc(words * 8), *m2 = malloc(words * 8);
    float *logits = malloc(sizeof *logits * (size_t)vocab);
    double *tt = malloc(sizeof *tt * (size_t)steps);
    struct token_walker *w = token_walker_new(trie, c);
    struct constrained con, off;
    if (!m || !m2 || !logits || !tt || !w || constrained_init(&con, c, tok, trie, MASK_SYNC) ||
        constrained_init(&off, c, tok, trie, MASK_OFF)) {
        fprintf(stderr, "calla maskbench: out of memory\n");
        return;
    }
    double t_naive = 0, t_argmax = 0, t_pick_mask = 0, t_pick_off = 0;
    long visited = 0;
    int n_naive = 0, mismatches = 0;
    for (int i = 0; i < steps; i++) {
        double t0 = now_s();
        visited += token_mask(w, con.s, m);
        tt[i] = now_s() - t0;
        if (i < naive_steps) {
            t0 = now_s();
            token_mask_naive(trie, tok, con.s, m2);
            t_naive += now_s() - t0, n_naive++;
            mismatches += memcmp(m, m2, words * 8) != 0;
        }
        random_logits(logits, vocab, tok);
        t0 = now_s();
        (void)token_mask_argmax(m, logits, vocab);
        t_argmax += now_s() - t0;
        // The pick when the greedy token fails (a random-weight model's case): with the mask, and
        // in mode off.
        cstate_copy(off.s, con.s);
        t0 = now_s();
        int32_t a = constrained_pick(&con, logits, chat_stop_ids[1], doc - i % doc);
        t_pick_mask += now_s() - t0;
        t0 = now_s();
        int32_t b = i < naive_steps ? constrained_pick(&off, logits, chat_stop_ids[1], doc - i % doc) : a;
        if (i < naive_steps) t_pick_off += now_s() - t0;
        mismatches += a != b;
        if (chat_is_stop(a) || i % doc == doc - 1) constrained_restart(&con);
    }
    double sum = 0;
    for (int i = 0; i < steps; i++) sum += tt[i];
    qsort(tt, (size_t)steps, sizeof *tt, cmp_double);
    if (label) {
        printf("  %-16s trie %.3f ms mean, %.3f median, %.3f max; argmax %.3f ms; %.0f nodes per mask\n", label,
               1e3 * sum / steps, 1e3 * tt[steps / 2], 1e3 * tt[steps - 1], 1e3 * t_argmax / steps,
               (double)visited / steps);
        goto out;
    }
    printf("masks on the CPU (%d states, one thread):\n", steps);
    printf("  trie walk        %8.3f ms mean, %.3f ms median, %.3f ms max; %.0f nodes visited per mask\n",
           1e3 * sum / steps, 1e3 * tt[steps / 2], 1e3 * tt[steps - 1], (double)visited / steps);
    printf("  per-token walk   %8.3f ms mean (%d states; the masks %s)\n", 1e3 * t_naive / (n_naive ? n_naive : 1),
           n_naive, mismatches ? "DIFFER" : "agree");
    printf("  masked argmax    %8.3f ms mean\n", 1e3 * t_argmax / steps);
    printf("  pick, greedy refused: %.3f ms with the mask (walk + argmax), %.3f ms in mode off (sort + walk)\n",
           1e3 * t_pick_mask / steps, 1e3 * t_pick_off / (n_naive ? n_naive : 1));
    json_object_set_new(js, "cpu",
                        json_pack("{si sf sf sf sf sf sf sf sb}", "states", steps, "trie_ms_mean", 1e3 * sum / steps,
                                  "trie_ms_median", 1e3 * tt[steps / 2], "trie_ms_max", 1e3 * tt[steps - 1],
                                  "naive_ms_mean", 1e3 * t_naive / (n_naive ? n_naive : 1), "argmax_ms_mean",
                                  1e3 * t_argmax / steps, "pick_mask_ms", 1e3 * t_pick_mask / steps, "pick_off_ms",
                                  1e3 * t_pick_off / (n_naive ? n_naive : 1), "agree", !mismatches));
out:
    constrained_free(&con), constrained_free(&off);
    token_walker_free(w);
    free(m), free(m2), free(logits), free(tt);
}

int cmd_maskbench(int argc, char **argv) {
    const char *dir = NULL, *backend = NULL, *schema_path = NULL, *json_path = NULL, *modes_s = "off,sync,overlap";
    long long context = 4096, tokens = 256, doc = 64, threads = 0, cpu_states = 200, naive_states = 16, rounds = 3;
    bool no_engine = false, mask_all = false;
    const struct opt opts[] = {
        {"model", OPT_STR, &dir, 0, 0, "checkpoint directory (its tokenizer.json; real or synthetic weights)"},
        {"json-schema", OPT_STR, &schema_path, 0, 0, "the schema to decode with (default: the tests' person schema)"},
        {"context", OPT_INT, &context, 1, QWEN_MAX_CTX - 8192,
         "tokens in the sequence before the decode (default 4096)"},
        {"tokens", OPT_INT, &tokens, 1, 8192, "decode steps per run (default 256)"},
        {"rounds", OPT_INT, &rounds, 1, MAX_ROUNDS,
         "rounds of every arm, interleaved; the median is reported (default 3)"},
        {"doc-tokens", OPT_INT, &doc, 8, 8192,
         "token budget of each document (default 64): it closes, the next begins"},
        {"modes", OPT_STR, &modes_s, 0, 0, "mask modes to decode with (default off,sync,overlap)"},
        {"backend", OPT_STR, &backend, 0, 0, "cpu or cuda (default: cuda when an sm_90 GPU is present)"},
        {"threads", OPT_INT, &threads, 0, 1024, "CPU backend threads (0: all cores)"},
        {"cpu-states", OPT_INT, &cpu_states, 1, 100000, "states for the CPU mask timing (default 200)"},
        {"naive-states", OPT_INT, &naive_states, 0, 100000,
         "of those, also through the per-token walk and mode off's pick (default 16)"},
        {"mask-all", OPT_FLAG, &mask_all, 0, 0, "CPU mask times for every schema of the tests too"},
        {"no-engine", OPT_FLAG, &no_engine, 0, 0, "the trie, compile times and CPU masks only (no weights loaded)"},
        {"json", OPT_STR, &json_path, 0, 0, "also write the numbers here as one JSON object"},
    };
    const int nopts = sizeof opts / sizeof opts[0];
    int b = opts_begin(argc, argv, "maskbench", "the cost of constrained decoding (token trie, masks, decode overhead)",
                       opts, nopts);
    if (b) return b > 0 ? 0 : 2;
    if (!dir) {
        fprintf(stderr, "calla maskbench: --model is required\n");
        return 2;
    }
    int modes[3], n_modes = 0;
    {
        char buf[64];
        snprintf(buf, sizeof buf, "%s", modes_s);
        for (char *sv = NULL, *t = strtok_r(buf, ",", &sv); t; t = strtok_r(NULL, ",", &sv)) {
            int m = mask_mode_parse(t);
            if (m < 0 || n_modes == 3) {
                fprintf(stderr, "calla maskbench: --modes: off, sync, overlap (comma-separated)\n");
                return 2;
            }
            modes[n_modes++] = m;
        }
    }
    char err[512];
    int rc = 1;
    json_t *js = json_object(), *jc = json_object(), *jd = json_object();
    struct tokenizer *tok = NULL;
    struct token_trie *trie = NULL;
    struct cschema *schema = NULL;
    struct engine *e = NULL;
    struct seq *snap = NULL, *w = NULL;
    int32_t *out[4] = {0};
    char *schema_text = NULL;

    // 1. The trie.
    if (tokenizer_load(dir, &tok, err, sizeof err)) goto fail;
    const int vocab = QWEN_VOCAB;
    double t0 = now_s();
    if (token_trie_build(tok, vocab, &trie, err, sizeof err)) goto fail;
    const double trie_ms = 1e3 * (now_s() - t0);
    printf("token trie: %d tokens with bytes in %d slots, %d nodes, %.1f MB, built in %.1f ms\n",
           tokenizer_vocab_size(tok), vocab, token_trie_nodes(trie), token_trie_bytes(trie) / 1e6, trie_ms);
    json_object_set_new(js, "trie",
                        json_pack("{si sI sf}", "nodes", token_trie_nodes(trie), "bytes",
                                  (json_int_t)token_trie_bytes(trie), "build_ms", trie_ms));

    // 2. Compile times.
    printf("schema compile times (mean of 200):\n");
    for (int i = 0; i <= maskbench_n_schemas; i++) {
        const char *name = i < maskbench_n_schemas ? maskbench_schemas[i].name : schema_path;
        const char *text = i < maskbench_n_schemas ? maskbench_schemas[i].json : NULL;
        if (i == maskbench_n_schemas) {
            if (!schema_path) break;
            if (!(schema_text = read_file(schema_path, NULL))) {
                snprintf(err, sizeof err, "%s: %s", schema_path, strerror(errno));
                goto fail;
            }
            text = schema_text;
        }
        t0 = now_s();
        for (int k = 0; k < 200; k++) {
            struct cschema *c;
            if (compile_text(text, &c, err, sizeof err)) {
                fprintf(stderr, "calla maskbench: %s: %s\n", name, err);
                goto out;
            }
            constrain_free(c);
        }
        const double us = 1e6 * (now_s() - t0) / 200;
        printf("  %-16s %8.1f us\n", name, us);
        json_object_set_new(jc, name, json_real(us));
    }
    if (compile_text(schema_text ? schema_text : maskbench_schemas[1].json, &schema, err, sizeof err)) goto fail;
    printf("decoding with: %s\n", schema_path ? schema_path : maskbench_schemas[1].name);

    // 3. Masks on the CPU alone.
    if (mask_all) {
        printf("masks on the CPU, every schema (%lld states each):\n", cpu_states);
        for (int i = 0; i < maskbench_n_schemas; i++) {
            struct cschema *c;
            if (compile_text(maskbench_schemas[i].json, &c, err, sizeof err)) goto fail;
            cpu_masks(c, tok, trie, vocab, (int)cpu_states, 0, (int)doc, NULL, maskbench_schemas[i].name);
            constrain_free(c);
        }
    }
    cpu_masks(schema, tok, trie, vocab, (int)cpu_states,
              (int)naive_states < cpu_states ? (int)naive_states : (int)cpu_states, (int)doc, js, NULL);
    if (no_engine) {
        rc = 0;
        goto out;
    }

    // 4. Decode at the context: unconstrained, then each mode from the same state.
    struct engine_options eo = {.backend = backend, .threads = (int)threads};
    if (engine_open(dir, &eo, &e, err, sizeof err)) goto fail;
    const int cap = (int)(context + tokens + 8);
    if (seq_new(e, cap, &snap, err, sizeof err) || seq_new(e, cap, &w, err, sizeof err)) goto fail;
    int32_t *prompt = malloc(sizeof *prompt * (size_t)context);
    for (int i = 0; i < 4; i++) out[i] = malloc(sizeof *out[i] * (size_t)tokens);
    if (!prompt || !out[0] || !out[1] || !out[2] || !out[3]) {
        free(prompt);
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    for (int i = 0; i < context; i++) prompt[i] = (int32_t)((uint32_t)(i * 2654435761u) % (uint32_t)(vocab - 1024));
    int32_t next;
    t0 = now_s();
    struct progress_line pl = {"calla maskbench", t0};
    struct forward_opts pf = {.progress = progress_line, .progress_arg = &pl};
    int prc = context > 1 ? engine_forward(e, snap, prompt, (int)context - 1, &pf, &next, err, sizeof err) : 0;
    const int32_t last = prompt[context - 1];
    free(prompt);
    if (prc) goto fail;
    printf("engine: %s; prefill of %lld tokens %.2f s\n", engine_backend(e), context - 1, now_s() - t0);
    // Warm-up (a graph captured, caches filled); then rounds of every arm in turn (unconstrained,
    // then each mode), each from the same state; the median round of each arm is reported.
    struct maskbench_run runs[4][MAX_ROUNDS], r;
    if (seq_copy(w, snap, err, sizeof err) ||
        maskbench_decode(e, w, NULL, tok, trie, MASK_OFF, last, 8, (int)doc, out[0], &r, err, sizeof err) < 0)
        goto fail;
    bool same = true;
    for (int round = 0; round < rounds; round++)
        for (int k = 0; k <= n_modes; k++) {
            const struct cschema *sc = k ? schema : NULL;
            int32_t *o = round && k ? out[3] : out[k ? 1 + (k - 1) % 2 : 0];
            if (seq_copy(w, snap, err, sizeof err) ||
                maskbench_decode(e, w, sc, tok, trie, k ? (enum mask_mode)modes[k - 1] : MASK_OFF, last, (int)tokens,
                                 (int)doc, o, &runs[k][round], err, sizeof err) < 0)
                goto fail;
            if (k && (k > 1 || round)) same &= !memcmp(o, out[1], sizeof(int32_t) * (size_t)tokens);
        }
    struct maskbench_run med[4];
    for (int k = 0; k <= n_modes; k++) { // the round of median ms/token (insertion sort of a few)
        struct maskbench_run *v = runs[k];
        for (int i = 1; i < rounds; i++)
            for (int j = i; j > 0 && v[j].ms_per_token < v[j - 1].ms_per_token; j--) {
                struct maskbench_run t = v[j];
                v[j] = v[j - 1], v[j - 1] = t;
            }
        med[k] = v[rounds / 2];
    }
    const struct maskbench_run base = med[0];
    printf("decode of %lld tokens at %lld (median of %lld rounds): unconstrained %.3f ms/token\n", tokens, context,
           rounds, base.ms_per_token);
    json_object_set_new(jd, "context", json_integer(context));
    json_object_set_new(jd, "tokens", json_integer(tokens));
    json_object_set_new(jd, "rounds", json_integer(rounds));
    json_object_set_new(jd, "none_ms", json_real(base.ms_per_token));
    for (int k = 0; k < n_modes; k++) {
        r = med[1 + k];
        const double over = r.ms_per_token - base.ms_per_token;
        printf(
            "  %-8s %.3f ms/token, %+.3f ms (%+.1f%%); the pick %.3f ms/token, of it waiting for (or making) its mask "
            "%.3f; %ld masks, %.3f ms each; greedy kept %ld of %ld; %d documents\n",
            mask_mode_name((enum mask_mode)modes[k]), r.ms_per_token, over, 100 * over / base.ms_per_token, r.pick_ms,
            r.wait_ms, r.n_masks, r.mask_ms, r.n_greedy, r.n_picks, r.docs);
        json_object_set_new(jd, mask_mode_name((enum mask_mode)modes[k]),
                            json_pack("{sf sf sf sf sf sI sI sI si}", "ms_per_token", r.ms_per_token, "overhead_pct",
                                      100 * over / base.ms_per_token, "pick_ms", r.pick_ms, "wait_ms", r.wait_ms,
                                      "mask_ms", r.mask_ms, "masks", (json_int_t)r.n_masks, "greedy_kept",
                                      (json_int_t)r.n_greedy, "picks", (json_int_t)r.n_picks, "documents", r.docs));
    }
    if (n_modes > 1) printf("  the modes chose %s tokens\n", same ? "the same" : "DIFFERENT");
    json_object_set_new(jd, "same_tokens", json_boolean(same));
    rc = same ? 0 : 1;
    goto out;
fail:
    fprintf(stderr, "calla maskbench: %s\n", err);
out:
    json_object_set_new(js, "compile_us", jc);
    json_object_set_new(js, "decode", jd);
    json_object_set_new(js, "ok", json_boolean(!rc));
    if (json_path && json_dump_file(js, json_path, JSON_INDENT(1)))
        fprintf(stderr, "calla maskbench: cannot write %s\n", json_path);
    json_decref(js);
    for (int i = 0; i < 4; i++) free(out[i]);
    seq_free(snap), seq_free(w);
    engine_close(e);
    constrain_free(schema);
    free(schema_text);
    token_trie_free(trie);
    tokenizer_free(tok);
    return rc;
}
