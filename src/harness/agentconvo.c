// agentconvo.c: see agentconvo.h. A seeded generator (splitmix64) and fixed word lists make every
// piece of text; each generator appends whole lines until the estimate reaches its target, so a
// piece is at most one line longer than asked for.
#include "agentconvo.h"

#include "util.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// What the chat template adds around the tool definitions (its header and the instructions on the
// call format), in estimated tokens: the opening turn's budget pays for it too.
enum { CONVO_TEMPLATE_TOOLS_TOKENS = 240 };

// ---- the token estimate ----------------------------------------------------------------------

static bool is_letter(unsigned char c) {
    return isalpha(c) || c >= 0x80;
}
static bool is_punct(unsigned char c) {
    return c < 0x80 && !isalnum(c) && !isspace(c);
}

// A word of len letters: one token up to 8 letters (the vocabulary holds the common words and
// identifiers' parts whole), one more per 8 after that.
static int word_tokens(size_t len) {
    return 1 + (len > 8 ? (int)((len - 1) / 8) : 0);
}

int convo_estimate_tokens(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    int t = 0;
    size_t i = 0;
    while (i < n) {
        unsigned char c = u[i];
        bool next_letter = i + 1 < n && is_letter(u[i + 1]);
        if (is_letter(c) || (c != '\n' && c != '\r' && !isdigit(c) && next_letter)) {
            size_t j = is_letter(c) ? i : i + 1, w = j; // a word, with the one character before it
            while (j < n && is_letter(u[j])) j++;
            t += word_tokens(j - w);
            i = j;
        } else if (isdigit(c)) { // digits are one piece each
            t++, i++;
        } else if (is_punct(c) || (c == ' ' && i + 1 < n && is_punct(u[i + 1]))) {
            size_t j = c == ' ' ? i + 1 : i; // a run of punctuation, the space before it and newlines after
            while (j < n && is_punct(u[j])) j++;
            size_t len = j - i, k = j;
            while (j < n && (u[j] == '\n' || u[j] == '\r')) j++;
            t += (int)((len + 2) / 3) + (j > k ? 1 : 0); // the vocabulary seldom joins the newlines to it
            i = j;
        } else { // whitespace: the newlines (with spaces before them) one piece, the spaces after another
            size_t j = i;
            while (j < n && isspace(u[j])) j++;
            size_t end = j;
            if (j < n && u[j - 1] == ' ' && !isdigit(u[j])) end = j - 1; // that space starts the next piece
            bool nl = false;
            size_t tail = 0; // spaces after the last newline
            for (size_t k = i; k < end; k++) {
                if (u[k] == '\n' || u[k] == '\r')
                    nl = true, tail = 0;
                else
                    tail++;
            }
            // before a digit the last space is a piece of its own (no piece takes it as a prefix)
            t += (nl ? 1 : 0) + (tail ? 1 : 0) + (tail > 1 && j < n && isdigit(u[j]) ? 1 : 0);
            i = end > i ? end : i + 1;
        }
    }
    return t;
}

// ---- the generator ---------------------------------------------------------------------------

struct gen {
    uint64_t s;
    struct sbuf *b;
};

static uint64_t rnd(struct gen *g) { // splitmix64
    uint64_t z = (g->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int rnd_int(struct gen *g, int lo, int hi) {
    return lo + (int)(rnd(g) % (uint64_t)(hi - lo + 1));
}
static double rnd_unit(struct gen *g) {
    return (double)(rnd(g) >> 11) / 9007199254740992.0;
}
#define PICK(g, v) ((v)[rnd(g) % (sizeof(v) / sizeof((v)[0]))])

static const char *const fwords[] = {
    "the",   "a",     "of",    "to",    "and", "in",   "is",    "for",    "that",  "with",  "on",   "as",
    "it",    "by",    "be",    "this",  "are", "from", "or",    "an",     "at",    "not",   "when", "each",
    "which", "all",   "can",   "will",  "one", "if",   "only",  "before", "after", "every", "must", "into",
    "than",  "then",  "its",   "has",   "but", "more", "same",  "first",  "last",  "other", "any",  "no",
    "so",    "until", "while", "where", "how", "what", "there", "also",   "never", "once",  "both", "through",
};
static const char *const nouns[] = {
    "buffer",  "request",  "server", "token",  "cache",  "file",  "line",   "test",   "build",  "error",  "value",
    "state",   "model",    "layer",  "kernel", "thread", "queue", "client", "header", "answer", "prompt", "context",
    "message", "result",   "output", "input",  "field",  "table", "record", "path",   "branch", "commit", "change",
    "review",  "function", "module", "parser", "stream", "chunk", "event",  "limit",  "step",   "reply",  "schema",
    "option",  "flag",     "memory", "device", "batch",  "score", "sample", "word",   "list",   "name",   "type",
    "size",    "count",    "index",  "offset", "length", "range", "block",  "page",   "key",    "map",    "node",
    "tree",    "graph",    "edge",   "bound",  "rule",   "case",  "point",  "time",   "rate",   "loop",   "call",
    "frame",   "stack",    "heap",   "lock",   "entry",  "slot",  "socket", "timer",  "config", "report", "target",
    "source",  "script",   "job",    "task",   "worker", "plan",  "query",  "store",
};
static const char *const verbs[] = {
    "read",   "write",   "keep",    "move",   "copy",  "find",   "start",  "stop",   "open",   "close",
    "send",   "parse",   "load",    "store",  "split", "merge",  "match",  "fill",   "trim",   "sort",
    "scan",   "walk",    "count",   "wait",   "run",   "check",  "return", "handle", "reject", "accept",
    "skip",   "retry",   "build",   "free",   "reset", "update", "append", "encode", "decode", "measure",
    "report", "compare", "restore", "refuse", "flush", "drain",  "track",  "mark",   "print",
};
static const char *const adjs[] = {
    "small",  "large",    "fast",    "slow",    "short", "long",    "empty",   "full",   "exact",
    "stable", "fixed",    "valid",   "broken",  "local", "remote",  "shared",  "single", "whole",
    "final",  "early",    "late",    "safe",    "clean", "plain",   "raw",     "new",    "old",
    "next",   "previous", "current", "default", "known", "unknown", "careful", "simple", "clear",
};
static const char *const ctypes[] = {"int",      "size_t",  "bool",   "double",
                                     "uint32_t", "int64_t", "char *", "const char *"};

static void add(struct gen *g, const char *s) {
    sbuf_adds(g->b, s);
}

static void addf(struct gen *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void addf(struct gen *g, const char *fmt, ...) {
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    sbuf_adds(g->b, tmp);
}

static const char *content_word(struct gen *g) {
    double r = rnd_unit(g);
    return r < 0.5 ? PICK(g, nouns) : r < 0.8 ? PICK(g, verbs) : PICK(g, adjs);
}

// A sentence of 6..18 words, capitalised, a comma now and then, ending in a full stop.
static void sentence(struct gen *g) {
    int n = rnd_int(g, 6, 18);
    for (int i = 0; i < n; i++) {
        const char *w = rnd_unit(g) < 0.4 ? PICK(g, fwords) : content_word(g);
        if (i) add(g, " ");
        if (!i)
            addf(g, "%c%s", toupper((unsigned char)w[0]), w + 1);
        else
            add(g, w);
        if (i + 1 < n && i > 1 && rnd_unit(g) < 0.08) add(g, ",");
    }
    add(g, ".");
}

static void ident(struct gen *g, char *out, size_t len) {
    snprintf(out, len, "%s_%s", rnd_unit(g) < 0.5 ? PICK(g, verbs) : PICK(g, adjs), PICK(g, nouns));
}

static void src_path(struct gen *g, char *out, size_t len) {
    const char *dir = PICK(g, nouns);
    if (rnd_unit(g) < 0.2)
        snprintf(out, len, "tests/test_%s_%s.c", dir, PICK(g, nouns));
    else
        snprintf(out, len, "src/%s/%s_%s.%s", dir, dir, PICK(g, nouns), rnd_unit(g) < 0.8 ? "c" : "h");
}

static int est(const struct sbuf *b, size_t from) {
    return convo_estimate_tokens(b->p ? b->p + from : "", b->len - from);
}

// ---- the system prompt and the task ----------------------------------------------------------

static void system_prompt(struct gen *g, int target) {
    size_t from = g->b->len;
    add(g, "You are a coding agent working in a software repository on behalf of a developer. You read files, "
           "run commands, search the tree and write changes through the tools you are given, one call at a time, "
           "and you report what you changed and why.\n");
    while (est(g->b, from) < target) {
        const char *h[3] = {PICK(g, verbs), PICK(g, fwords), PICK(g, nouns)};
        addf(g, "\n## %c%s %s %ss\n\n", toupper((unsigned char)h[0][0]), h[0] + 1, h[1], h[2]);
        for (int p = rnd_int(g, 1, 2); p > 0 && est(g->b, from) < target; p--) {
            for (int s = rnd_int(g, 2, 5); s > 0; s--) {
                sentence(g);
                add(g, s > 1 ? " " : "\n");
            }
            add(g, "\n");
        }
        for (int k = rnd_int(g, 3, 6); k > 0 && est(g->b, from) < target; k--) {
            add(g, "- ");
            sentence(g);
            add(g, "\n");
        }
    }
}

static void task_message(struct gen *g) {
    char t[64], p[128];
    ident(g, t, sizeof t);
    src_path(g, p, sizeof p);
    addf(g,
         "The test test_%s fails after the last change to %s. Find the cause, fix it with the smallest change "
         "that keeps the other tests passing, and run the tests again. ",
         t, p);
    sentence(g);
    add(g, " ");
    sentence(g);
}

// ---- tool results ----------------------------------------------------------------------------

// One line of C-like source at the given depth (indent of 4 spaces a level); *depth is updated.
static void code_line(struct gen *g, int *depth) {
    char a[64], b[64];
    ident(g, a, sizeof a);
    ident(g, b, sizeof b);
    const char *n1 = PICK(g, nouns), *n2 = PICK(g, nouns);
    for (int i = 0; i < *depth; i++) add(g, "    ");
    if (*depth == 0) {
        int r = rnd_int(g, 0, 3);
        if (r == 0) {
            add(g, "// ");
            sentence(g);
        } else if (r == 1) {
            addf(g, "static %s %s(struct %s *%c, const char *%s, size_t len) {", PICK(g, ctypes), a, b, n1[0], n2);
            (*depth)++;
        } else if (r == 2) {
            addf(g, "#include \"%s/%s.h\"", n1, n2);
        } else {
            addf(g, "enum { %s_%s = %d };", n1, n2, rnd_int(g, 1, 4096));
            for (char *c = g->b->p + g->b->len - 1; *c != '{'; c--) *c = (char)toupper((unsigned char)*c);
        }
        add(g, "\n");
        return;
    }
    int r = rnd_int(g, 0, 9);
    if (*depth > 1 && r < 3) { // close a block
        for (int i = 0; i < 4; i++) g->b->p[--g->b->len] = 0;
        add(g, "}\n");
        (*depth)--;
        return;
    }
    switch (r) {
    case 0:
        addf(g, "if (!%s || len == 0) return -1;", n1);
        break;
    case 1:
        addf(g, "for (size_t i = 0; i < len; i++) {"), (*depth)++;
        break;
    case 2:
        addf(g, "%s->%s[i] = %s(%s[i], %d);", n1, n2, a, n2, rnd_int(g, 0, 255));
        break;
    case 3:
        addf(g, "%s %s = %s(%s->%s, len);", PICK(g, ctypes), n2, b, n1, n2);
        break;
    case 4:
        addf(g, "if (%s < 0) {", n2), (*depth)++;
        break;
    case 5:
        addf(g, "snprintf(err, errlen, \"cannot %s the %s %%s\", %s);", PICK(g, verbs), n1, n2);
        break;
    case 6:
        addf(g, "%s->%s += len * %d;", n1, n2, rnd_int(g, 2, 64));
        break;
    case 7:
        add(g, "/* ");
        sentence(g);
        add(g, " */");
        break;
    default:
        if (*depth == 1) {
            add(g, "return 0;\n}\n");
            *depth = 0;
            return;
        }
        addf(g, "%s(%s, %s);", a, n1, n2);
        break;
    }
    add(g, "\n");
}

static void result_read_file(struct gen *g, int target) {
    size_t from = g->b->len;
    int line = rnd_int(g, 1, 400), depth = 0;
    while (est(g->b, from) < target) {
        addf(g, "%6d\t", line++);
        code_line(g, &depth);
    }
}

static void result_run_shell(struct gen *g, int target) {
    size_t from = g->b->len;
    char p[128], a[64];
    const char *cmds[] = {"make -j2 test", "make -j2", "ctest --output-on-failure", "git diff --stat",
                          "./run_tests.sh"};
    addf(g, "$ %s\n", PICK(g, cmds));
    int fails = 0;
    while (est(g->b, from) < target) {
        src_path(g, p, sizeof p);
        ident(g, a, sizeof a);
        switch (rnd_int(g, 0, 5)) {
        case 0:
            addf(g, "cc -O2 -Wall -c -o build/%.*s.o %s\n", (int)(strlen(p) - 2), p, p);
            break;
        case 1:
            addf(g, "%s:%d:%d: warning: unused variable '%s' [-Wunused-variable]\n", p, rnd_int(g, 1, 999),
                 rnd_int(g, 1, 80), a);
            break;
        case 2:
            addf(g, "test_%s ... ok (%d checks, %d.%02d s)\n", a, rnd_int(g, 1, 90), rnd_int(g, 0, 3),
                 rnd_int(g, 0, 99));
            break;
        case 3:
            addf(g, "FAIL test_%s: expected %d, got %d (%s:%d)\n", a, rnd_int(g, 0, 99), rnd_int(g, 100, 999), p,
                 rnd_int(g, 1, 999));
            fails++;
            break;
        case 4:
            addf(g, "[%3d%%] Building C object %s\n", rnd_int(g, 1, 100), p);
            break;
        default:
            add(g, "note: ");
            sentence(g);
            add(g, "\n");
            break;
        }
    }
    addf(g, "exit status %d\n", fails ? 1 : 0);
}

// A JSON string's body: '"' and '\' escaped (the text holds no control characters).
static void json_text(struct gen *g, const char *s) {
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') sbuf_add(g->b, "\\", 1);
        sbuf_add(g->b, s, 1);
    }
}

static void result_search(struct gen *g, int target) {
    size_t from = g->b->len;
    char pat[64], p[128];
    ident(g, pat, sizeof pat);
    addf(g, "{\"pattern\": \"%s\", \"matches\": [", pat);
    int n = 0;
    while (est(g->b, from) + 12 < target || !n) { // 12: about what the closing line costs
        struct sbuf line = {0};
        struct sbuf *keep = g->b;
        int depth = 2; // inside a block: one line, never a function's end
        g->b = &line;
        code_line(g, &depth);
        g->b = keep;
        const char *text = line.p ? line.p : "";
        text += strspn(text, " ");
        if (line.p) line.p[strcspn(line.p, "\n")] = 0;
        src_path(g, p, sizeof p);
        addf(g, "%s\n  {\"path\": \"%s\", \"line\": %d, \"text\": \"", n ? "," : "", p, rnd_int(g, 1, 2000));
        json_text(g, text);
        add(g, "\"}");
        sbuf_free(&line);
        n++;
    }
    addf(g, "\n], \"total\": %d, \"truncated\": false}", n);
}

static void result_list_dir(struct gen *g, int target) {
    size_t from = g->b->len;
    char p[128];
    while (est(g->b, from) < target) {
        src_path(g, p, sizeof p);
        addf(g, "%s\t%d bytes\n", p, rnd_int(g, 40, 90000));
    }
}

static void result_write_file(struct gen *g, int target) {
    size_t from = g->b->len;
    char p[128];
    src_path(g, p, sizeof p);
    addf(g, "{\"ok\": true, \"path\": \"%s\", \"bytes_written\": %d", p, rnd_int(g, 10, 40000));
    if (est(g->b, from) + 2 < target) {
        add(g, ", \"note\": \"");
        while (est(g->b, from) + 2 < target) {
            sentence(g);
            add(g, " ");
        }
        g->b->p[--g->b->len] = 0;
        add(g, "\"");
    }
    add(g, "}");
}

// ---- the tool definitions --------------------------------------------------------------------

struct tool_param {
    const char *name, *type, *desc;
    bool required;
};

static const struct {
    const char *name, *desc;
    struct tool_param params[4]; // up to the first without a name
} tool_defs[] = {
    {"read_file",
     "Read a text file of the repository and return its lines, each prefixed with its line number. Use offset and "
     "limit to read a part of a long file instead of the whole of it.",
     {{"path", "string", "Path of the file, relative to the repository root.", true},
      {"offset", "integer", "First line to return, counting from 1 (default 1).", false},
      {"limit", "integer", "Most lines to return (default 2000).", false}}},
    {"write_file",
     "Write a file of the repository, replacing what it held, and create the folders it needs. The content is "
     "written as given: send the whole file, not a part of it.",
     {{"path", "string", "Path of the file, relative to the repository root.", true},
      {"content", "string", "The file's whole new content.", true}}},
    {"edit_file",
     "Replace one exact occurrence of a text in a file with another. The old text must occur exactly once; "
     "include enough of the lines around it to make it unique.",
     {{"path", "string", "Path of the file, relative to the repository root.", true},
      {"old_text", "string", "The text to replace, exactly as it is in the file.", true},
      {"new_text", "string", "The text to put in its place.", true}}},
    {"run_shell",
     "Run a shell command in the repository root and return its standard output and standard error together, "
     "then its exit status. Commands that wait for input fail; long ones are stopped at the timeout.",
     {{"command", "string", "The command line, run by /bin/sh -c.", true},
      {"timeout_s", "integer", "Seconds before the command is stopped (default 120).", false},
      {"cwd", "string", "Folder to run it in, relative to the repository root (default: the root).", false}}},
    {"search",
     "Search the files of the repository for a pattern and return the matching lines as JSON, each with its path "
     "and line number, the most relevant first.",
     {{"pattern", "string", "The text or regular expression to find.", true},
      {"path", "string", "Folder or file to search in (default: the whole repository).", false},
      {"regex", "boolean", "Treat the pattern as a regular expression (default false).", false},
      {"max_results", "integer", "Most matches to return (default 100).", false}}},
    {"list_dir",
     "List the files under a folder of the repository with their sizes, to the given depth.",
     {{"path", "string", "The folder, relative to the repository root.", true},
      {"depth", "integer", "How many levels of subfolders to list (default 2).", false}}},
};

static json_t *tool_definitions(void) {
    json_t *t = json_array();
    for (size_t i = 0; i < sizeof tool_defs / sizeof tool_defs[0]; i++) {
        json_t *props = json_object(), *required = json_array();
        for (const struct tool_param *p = tool_defs[i].params; p < tool_defs[i].params + 4 && p->name; p++) {
            json_object_set_new(props, p->name, json_pack("{s:s, s:s}", "type", p->type, "description", p->desc));
            if (p->required) json_array_append_new(required, json_string(p->name));
        }
        json_array_append_new(t, json_pack("{s:s, s:{s:s, s:s, s:{s:s, s:o, s:o}}}", "type", "function", "function",
                                           "name", tool_defs[i].name, "description", tool_defs[i].desc, "parameters",
                                           "type", "object", "properties", props, "required", required));
    }
    return t;
}

// ---- the conversation ------------------------------------------------------------------------

static char *take(struct sbuf *b) {
    char *p = b->p ? b->p : strdup("");
    b->p = NULL, b->len = b->cap = 0;
    return p;
}

int convo_build(const struct convo_params *p, struct convo *c, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    if (p->turns < 0 || p->turns > 1000) return snprintf(err, errlen, "turns must be 0..1000, got %d", p->turns), -1;
    if (p->min_result < 1 || p->max_result < p->min_result || p->max_result > 100000)
        return snprintf(err, errlen, "tool results must be 1 <= min <= max <= 100,000 tokens, got %d..%d",
                        p->min_result, p->max_result),
               -1;
    if (p->system_tokens < 0 || p->system_tokens > 200000)
        return snprintf(err, errlen, "system tokens must be 0..200,000, got %d", p->system_tokens), -1;
    c->tools = tool_definitions();
    char *tj = json_dumps(c->tools, JSON_PRESERVE_ORDER | JSON_COMPACT);
    c->tools_est = (tj ? convo_estimate_tokens(tj, strlen(tj)) : 0) + CONVO_TEMPLATE_TOOLS_TOKENS;
    struct sbuf b = {0};
    struct gen g = {.s = p->seed, .b = &b};
    system_prompt(&g, p->system_tokens - c->tools_est);
    c->system_est = est(&b, 0);
    c->system = take(&b);
    task_message(&g);
    c->task_est = est(&b, 0);
    c->task = take(&b);
    c->n_turns = p->turns;
    c->turns = calloc((size_t)(p->turns ? p->turns : 1), sizeof *c->turns);
    if (!c->turns || !tj) {
        free(tj);
        convo_free(c);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    uint64_t h = fnv1a64(FNV1A64_INIT, c->system, strlen(c->system) + 1);
    h = fnv1a64(h, c->task, strlen(c->task) + 1);
    h = fnv1a64(h, tj, strlen(tj) + 1);
    free(tj);
    double lo = log((double)p->min_result), hi = log((double)p->max_result);
    for (int k = 0; k < p->turns; k++) {
        struct convo_turn *t = &c->turns[k];
        t->target_tokens = (int)lround(exp(lo + (hi - lo) * rnd_unit(&g)));
        t->required = p->required_every > 0 && (k + 1) % p->required_every == 0;
        double r = rnd_unit(&g);
        if (t->target_tokens < 48)
            t->tool = r < 0.5 ? "write_file" : "run_shell";
        else
            t->tool = r < 0.35 ? "read_file" : r < 0.6 ? "run_shell" : r < 0.85 ? "search" : "list_dir";
        if (!strcmp(t->tool, "read_file"))
            result_read_file(&g, t->target_tokens);
        else if (!strcmp(t->tool, "run_shell"))
            result_run_shell(&g, t->target_tokens);
        else if (!strcmp(t->tool, "search"))
            result_search(&g, t->target_tokens);
        else if (!strcmp(t->tool, "list_dir"))
            result_list_dir(&g, t->target_tokens);
        else
            result_write_file(&g, t->target_tokens);
        t->est_tokens = est(&b, 0);
        t->result = take(&b);
        h = fnv1a64(h, t->result, strlen(t->result) + 1);
    }
    c->hash = h;
    if (b.oom) {
        convo_free(c);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    return 0;
}

void convo_free(struct convo *c) {
    free(c->system);
    free(c->task);
    json_decref(c->tools);
    for (int k = 0; c->turns && k < c->n_turns; k++) free(c->turns[k].result);
    free(c->turns);
    memset(c, 0, sizeof *c);
}
