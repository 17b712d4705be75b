// cli.c: the model-file subcommands: `calla synth`, `calla info`, `calla run` and `calla tokenize`.
#include "checkpoint.h"
#include "chat.h"
#include "engine.h"
#include "generate.h"
#include "tokenizer.h"
#include "commands.h"
#include "options.h"
#include "synth.h"
#include "util.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int cmd_synth(int argc, char **argv) {
    const char *geometry = NULL, *out = NULL, *profile = "trained";
    long long seed = 0, shard_mib = 5 * 1024, threads = 0;
    bool aligned = false;
    const struct opt opts[] = {
        {"geometry", OPT_STR, &geometry, 0, 0, "full (qwen3.6-35b-a3b), or a test geometry: tiny, small"},
        {"seed", OPT_INT, &seed, 0, (long long)1 << 62, "PRNG seed (output is byte-identical per seed and profile)"},
        {"profile", OPT_STR, &profile, 0, 0,
         "trained (default: peaked routing, router logits std ~3.6, residual "
         "stream near rms 1) or uniform (the first distribution; the golden fixtures')"},
        {"out", OPT_STR, &out, 0, 0, "output directory"},
        {"shard-mib", OPT_INT, &shard_mib, 1, 5 * 1024, "largest shard in MiB (default 5120, like mlx-lm)"},
        {"threads", OPT_INT, &threads, 0, 64, "writer threads (0: all cores)"},
        {"aligned", OPT_FLAG, &aligned, 0, 0,
         "pad the safetensors headers so every tensor is naturally aligned "
         "(default: unpadded like MLX, tensors at odd offsets)"},
    };
    const int n = sizeof opts / sizeof opts[0];
    const char *summary = "write a random-weight checkpoint in the exact MLX layout";
    int b = opts_begin(argc, argv, "synth", summary, opts, n);
    if (b) return b > 0 ? 0 : 2;
    char err[512];
    if (!geometry || !out) {
        fprintf(stderr, "calla synth: --geometry and --out are required\n");
        opts_usage(stderr, "synth", summary, opts, n);
        return 2;
    }
    const struct geometry *g = geometry_find(geometry);
    if (!g) {
        fprintf(stderr, "calla synth: unknown geometry \"%s\" (known: full, tiny, small)\n", geometry);
        return 2;
    }
    enum synth_profile sp;
    if (synth_profile_parse(profile, &sp)) {
        fprintf(stderr, "calla synth: unknown profile \"%s\" (known: trained, uniform)\n", profile);
        return 2;
    }
    struct synth_options so = {.g = g,
                               .profile = sp,
                               .seed = (uint64_t)seed,
                               .out_dir = out,
                               .max_shard_bytes = shard_mib << 20,
                               .threads = (int)threads,
                               .aligned = aligned};
    double t0 = now_s();
    if (synth_write(&so, err, sizeof err)) {
        fprintf(stderr, "calla synth: %s\n", err);
        return 1;
    }
    struct model_size ms = model_size_of(g);
    fprintf(stderr, "calla synth: wrote %s (%s, seed %lld, profile %s): %lld tensors, %.3f GB in %.1f s\n", out,
            g->name, seed, profile, (long long)ms.n_tensors, (double)ms.bytes / 1e9, now_s() - t0);
    return 0;
}

int cmd_info(int argc, char **argv) {
    const char *dir = NULL;
    const struct opt opts[] = {{"model", OPT_STR, &dir, 0, 0, "checkpoint directory"}};
    const char *summary = "validate a checkpoint and print its geometry and sizes";
    if (argc == 2 && strncmp(argv[1], "--", 2))
        dir = argv[1]; // `calla info DIR`
    else {
        int b = opts_begin(argc, argv, "info", summary, opts, 1);
        if (b) return b > 0 ? 0 : 2;
    }
    char err[1024];
    if (!dir) {
        fprintf(stderr, "calla info: give the checkpoint directory (calla info DIR)\n");
        return 2;
    }
    struct model m;
    double t0 = now_s();
    if (checkpoint_open(dir, &m, err, sizeof err)) {
        fprintf(stderr, "calla info: %s: %s\n", dir, err);
        return 1;
    }
    double dt = now_s() - t0;
    const struct geometry *g = &m.g;
    struct model_size ms = model_size_of(g);
    printf("checkpoint     %s\n", dir);
    printf("geometry       %s%s\n", g->name, g->is_test ? " (test geometry)" : "");
    printf("layers         %d (%d Gated DeltaNet + %d full attention, every %d-th)\n", g->n_layers,
           g->n_layers - g->n_layers / g->attn_interval, g->n_layers / g->attn_interval, g->attn_interval);
    printf("hidden         %d, vocab %d\n", g->hidden, g->vocab);
    printf("attention      %d query heads x %d, %d kv heads (GQA %d), rope on %d dims, theta %g\n", g->n_heads,
           g->head_dim, g->n_kv_heads, g->n_heads / g->n_kv_heads, g->rope_dim, g->rope_theta);
    printf("deltanet       %d key heads x %d, %d value heads x %d, conv %d\n", g->lin_k_heads, g->lin_k_dim,
           g->lin_v_heads, g->lin_v_dim, g->conv_kernel);
    printf("moe            %d experts, top-%d, intermediate %d, shared expert %d\n", g->n_experts, g->n_experts_used,
           g->moe_inter, g->shared_inter);
    printf("tensors        %lld text tensors in %d shard%s (%lld ignored: vision/mtp)\n", (long long)m.n_text_tensors,
           m.n_shards, m.n_shards == 1 ? "" : "s", (long long)m.n_ignored);
    printf("parameters     %.3f B\n", (double)ms.params / 1e9);
    printf("bytes          %lld (%.3f GB)\n", (long long)m.file_bytes, (double)m.file_bytes / 1e9);
    printf("bits/weight    %.3f\n", 8.0 * (double)m.file_bytes / (double)ms.params);
    printf("kv cache       %lld bytes/token (bf16), %.3f GB at %d tokens\n", (long long)m.state.kv_bytes_per_token,
           (double)m.state.kv_bytes_per_token * g->max_ctx / 1e9, g->max_ctx);
    printf("deltanet state %.1f MiB (fp32 recurrent + conv window)\n", (double)m.state.gdn_bytes / 1048576.0);
    printf("validated      in %.2f s; %lld tensors unaligned in the file (read in place); %.1f MiB of host memory "
           "besides the mapping\n",
           dt, (long long)m.n_unaligned, (double)m.owned_bytes / 1048576.0);
    checkpoint_close(&m);
    return 0;
}

// Parses "1,2,3" into ids. 0, or -1 with a message.
static int parse_ids(const char *s, int32_t **ids, int *n, char *err, size_t errlen) {
    int cap = 16, k = 0;
    int32_t *v = malloc(sizeof *v * (size_t)cap);
    const char *p = s;
    while (v && *p) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 0 || x > INT32_MAX) {
            snprintf(err, errlen, "--prompt-tokens: \"%s\" is not a comma-separated list of token ids", s);
            free(v);
            return -1;
        }
        if (k == cap) {
            int32_t *nv = realloc(v, sizeof *v * (size_t)(cap *= 2));
            if (!nv) break;
            v = nv;
        }
        v[k++] = (int32_t)x;
        p = end;
        if (*p == ',')
            p++;
        else if (*p) {
            snprintf(err, errlen, "--prompt-tokens: unexpected \"%c\" in \"%s\"", *p, s);
            free(v);
            return -1;
        }
    }
    if (!k) {
        snprintf(err, errlen, "--prompt-tokens: no token ids given");
        free(v);
        return -1;
    }
    *ids = v;
    *n = k;
    return 0;
}

// `calla run`'s sink: each token's text (or id) to stdout as it comes.
struct run_out {
    bool ids; // print ids (comma-separated), not text
    int n;
    struct progress_line progress;
};

static void run_progress(void *ctx, int done, int total) {
    struct run_out *o = ctx;
    if (done) progress_line(&o->progress, done, total); // (not before the first chunk)
}

static void run_token(void *ctx, int32_t id) {
    struct run_out *o = ctx;
    if (o->ids) printf("%s%d", o->n ? "," : "", id), fflush(stdout);
    o->n++;
}

static void run_text(void *ctx, enum gen_channel ch, const char *s, size_t n) {
    fwrite(s, 1, n, stdout);
    fflush(stdout);
}

int cmd_run(int argc, char **argv) {
    const char *dir = NULL, *prompt_tokens = NULL, *backend = NULL, *text = NULL, *chat = NULL;
    long long max_tokens = 16, threads = 0, context = 0;
    bool ignore_eos = false, kv_f32 = false, no_think = false, exact = false, speculative = true;
    const struct opt opts[] = {
        {"model", OPT_STR, &dir, 0, 0, "checkpoint directory"},
        {"prompt-tokens", OPT_STR, &prompt_tokens, 0, 0, "prompt as token ids: 1,2,3 (prints ids)"},
        {"prompt", OPT_STR, &text, 0, 0, "prompt as raw text (prints text)"},
        {"chat", OPT_STR, &chat, 0, 0, "one user message in the Qwen3.6 chat format (prints text)"},
        {"no-think", OPT_FLAG, &no_think, 0, 0, "with --chat: thinking off (enable_thinking=false)"},
        {"max-tokens", OPT_INT, &max_tokens, 1, QWEN_MAX_CTX, "tokens to generate (default 16)"},
        {"backend", OPT_STR, &backend, 0, 0, "cpu or cuda (default: cuda when an sm_90 GPU is present)"},
        {"threads", OPT_INT, &threads, 0, 1024, "CPU threads (0: all cores)"},
        {"context", OPT_INT, &context, 0, QWEN_MAX_CTX, "sequence capacity (default: prompt + max-tokens + 1)"},
        {"ignore-eos", OPT_FLAG, &ignore_eos, 0, 0, "do not stop at <|im_end|> / <|endoftext|>"},
        {"kv-f32", OPT_FLAG, &kv_f32, 0, 0, "CPU backend: fp32 KV cache instead of bf16"},
        {"exact", OPT_FLAG, &exact, 0, 0, "CUDA backend: the verification mode (fp32-level products; CALLA_EXACT=1)"},
        {"speculative", OPT_ONOFF, &speculative, 0, 0,
         "speculative decoding: drafts from the prompt and the output, "
         "verified several tokens a forward; the same tokens (default on)"},
    };
    const int n = sizeof opts / sizeof opts[0];
    const char *summary = "generate greedily from a prompt; prints the generated token ids";
    int b = opts_begin(argc, argv, "run", summary, opts, n);
    if (b) return b > 0 ? 0 : 2;
    char err[1024];
    if (!dir || (!!prompt_tokens + !!text + !!chat) != 1) {
        fprintf(stderr, "calla run: --model and one of --prompt-tokens, --prompt, --chat are required\n");
        return 2;
    }
    int32_t *prompt = NULL;
    int n_prompt = 0;
    struct tokenizer *tok_text = NULL;
    if (prompt_tokens) {
        if (parse_ids(prompt_tokens, &prompt, &n_prompt, err, sizeof err)) {
            fprintf(stderr, "calla run: %s\n", err);
            return 2;
        }
    } else {
        if (tokenizer_load(dir, &tok_text, err, sizeof err)) {
            fprintf(stderr, "calla run: %s\n", err);
            return 1;
        }
        size_t n_ids = 0;
        struct chat_options co = CHAT_OPTIONS_DEFAULT;
        co.enable_thinking = !no_think;
        int r = text ? tokenizer_encode(tok_text, text, strlen(text), &prompt, &n_ids, err, sizeof err)
                     : chat_encode_user(tok_text, chat, &co, &prompt, &n_ids, err, sizeof err);
        if (r || n_ids == 0 || n_ids > QWEN_MAX_CTX) {
            fprintf(stderr, "calla run: %s\n", r ? err : n_ids ? "prompt longer than the context" : "empty prompt");
            tokenizer_free(tok_text);
            free(prompt);
            return 2;
        }
        n_prompt = (int)n_ids;
    }
    long long need = n_prompt + max_tokens + 1;
    if (!context) context = need;
    if (need > context || context > QWEN_MAX_CTX) {
        fprintf(stderr, "calla run: prompt (%d) + max-tokens (%lld) + 1 = %lld tokens exceeds the context of %lld\n",
                n_prompt, max_tokens, need, context > QWEN_MAX_CTX ? (long long)QWEN_MAX_CTX : context);
        free(prompt);
        tokenizer_free(tok_text);
        return 2;
    }
    struct engine_options eo = {.backend = backend, .threads = (int)threads, .kv_f32 = kv_f32, .exact = exact};
    struct engine *e;
    if (engine_open(dir, &eo, &e, err, sizeof err)) {
        fprintf(stderr, "calla run: %s\n", err);
        free(prompt);
        tokenizer_free(tok_text);
        return 1;
    }
    struct seq *s;
    int rc = 1;
    if (seq_new(e, (int)context, &s, err, sizeof err)) {
        fprintf(stderr, "calla run: %s\n", err);
        goto out;
    }
    // Every token printed as it comes, the stop token included; no channels, no stop strings.
    struct gen_request req = {.prompt = prompt,
                              .n_prompt = n_prompt,
                              .max_tokens = (int)max_tokens,
                              .logprobs = -1,
                              .ignore_stop = ignore_eos,
                              .echo_stop = true};
    struct run_out ro = {.ids = !tok_text, .progress = {"calla run", now_s()}};
    const struct gen_sink sink = {.ctx = &ro, .progress = run_progress, .token = run_token, .text = run_text};
    const struct gen_env env = {.e = e, .s = s, .tok = tok_text, .speculative = speculative};
    struct gen_result res;
    double t0 = now_s();
    if (generate(&env, &req, 0, NULL, &sink, &res)) {
        fprintf(stderr, "%scalla run: %s\n", res.n ? "\n" : "", res.err);
        free(res.ids);
        goto out_seq;
    }
    free(res.ids);
    printf("\n");
    double t1 = res.t_prefilled, t2 = now_s();
    fprintf(stderr,
            "# backend %s, prompt %d tokens in %.3f s (%.1f tok/s), %d generated, decode %.2f ms/token, "
            "%d drafted, %d accepted\n",
            engine_backend(e), n_prompt, t1 - t0, n_prompt / (t1 - t0), res.n,
            res.n > 1 ? 1e3 * (t2 - t1) / (res.n - 1) : 0.0, res.drafted, res.accepted);
    rc = 0;
out_seq:
    seq_free(s);
out:
    tokenizer_free(tok_text);
    engine_close(e);
    free(prompt);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// calla tokenize

static char *read_all(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    struct sbuf b = {0};
    char chunk[1 << 16];
    size_t n;
    if (!f) return NULL;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (sbuf_add(&b, chunk, n)) break;
    if (f != stdin) fclose(f);
    if (!b.p) b.p = calloc(1, 1);
    *len = b.len;
    return b.p;
}

static void print_c_string(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c == '\n')
            printf("\\n");
        else if (c == '\t')
            printf("\\t");
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
    putchar('"');
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *file = NULL, *decode = NULL;
    bool tokens = false, timing = false;
    const struct opt opts[] = {
        {"model", OPT_STR, &model, 0, 0, "checkpoint (or any directory) holding tokenizer.json"},
        {"text", OPT_STR, &text, 0, 0, "encode TEXT (added tokens such as <|im_start|> are recognised)"},
        {"file", OPT_STR, &file, 0, 0, "encode the bytes of file F (- for standard input)"},
        {"decode", OPT_STR, &decode, 0, 0, "decode comma- or space-separated ids and print the text"},
        {"tokens", OPT_FLAG, &tokens, 0, 0, "print one line per token: id, then its bytes as a C string"},
        {"time", OPT_FLAG, &timing, 0, 0, "report encode time and throughput on stderr"},
    };
    const int n_opts = sizeof opts / sizeof opts[0];
    const char *summary = "print the token ids of a text (--text or --file), or decode ids (--decode)";
    int ob = opts_begin(argc, argv, "tokenize", summary, opts, n_opts);
    if (ob) return ob > 0 ? 0 : 2;
    char err[512];
    if (!model || (!text && !file && !decode) || (text && file)) {
        fprintf(stderr, "calla tokenize: --model and one of --text, --file (or --decode) are required\n");
        opts_usage(stderr, "tokenize", summary, opts, n_opts);
        return 2;
    }
    struct tokenizer *t;
    if (tokenizer_load(model, &t, err, sizeof err)) {
        fprintf(stderr, "calla tokenize: %s\n", err);
        return 1;
    }
    int rc = 0;
    if (decode) {
        size_t n = 0, cap = 16;
        int32_t *ids = malloc(cap * sizeof *ids);
        for (const char *p = decode; ids && *p;) {
            char *end;
            if (*p == ',' || *p == ' ' || *p == '[' || *p == ']' || *p == '\n') {
                p++;
                continue;
            }
            long v = strtol(p, &end, 10);
            if (end == p || v < INT32_MIN || v > INT32_MAX) {
                fprintf(stderr, "calla tokenize: bad id list at \"%s\"\n", p);
                free(ids);
                tokenizer_free(t);
                return 2;
            }
            if (n == cap) {
                int32_t *q = realloc(ids, (cap *= 2) * sizeof *ids);
                if (!q) break;
                ids = q;
            }
            ids[n++] = (int32_t)v;
            p = end;
        }
        char *out;
        size_t len;
        if (!ids || tokenizer_decode(t, ids, n, 0, &out, &len, err, sizeof err)) {
            fprintf(stderr, "calla tokenize: %s\n", ids ? err : "out of memory");
            rc = 1;
        } else {
            fwrite(out, 1, len, stdout);
            putchar('\n');
            free(out);
        }
        free(ids);
    }
    if (text || file) {
        size_t len = text ? strlen(text) : 0;
        char *data = text ? NULL : read_all(file, &len);
        if (file && !data) {
            fprintf(stderr, "calla tokenize: %s: %s\n", file, strerror(errno));
            tokenizer_free(t);
            return 1;
        }
        int32_t *ids;
        size_t n;
        double t0 = now_s();
        int erc = tokenizer_encode(t, text ? text : data, len, &ids, &n, err, sizeof err);
        double s = now_s() - t0;
        if (erc) {
            fprintf(stderr, "calla tokenize: %s\n", err);
            rc = 1;
        } else {
            if (tokens) {
                for (size_t i = 0; i < n; i++) {
                    size_t l;
                    const char *b = tokenizer_token_bytes(t, ids[i], &l);
                    printf("%d\t", ids[i]);
                    print_c_string(b, l);
                    putchar('\n');
                }
            } else {
                for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
                putchar('\n');
            }
            if (timing) {
                fprintf(stderr, "# encode: %zu bytes -> %zu tokens in %.3f s (%.2f MB/s, %.0f tokens/s)\n", len, n, s,
                        (double)len / s / 1e6, (double)n / s);
            }
            free(ids);
        }
        free(data);
    }
    tokenizer_free(t);
    return rc;
}
