// generate.c: the generation loop (generate.h): prefill, decode (greedy or sampled), the stop
// rules, the reasoning / answer channels, constrained picking, tool calls and logprobs, as sink
// events.
#include "generate.h"

#include "chat.h"
#include "constrain.h"
#include "draft.h"
#include "tokenizer.h"
#include "tokmask.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- the request -------------------------------------------------------------------------------

int gen_request_add_stop(struct gen_request *r, const char *s, size_t n) {
    char **stops = realloc(r->stops, sizeof *stops * (size_t)(r->n_stops + 1));
    if (stops) r->stops = stops;
    size_t *len = realloc(r->stop_len, sizeof *len * (size_t)(r->n_stops + 1));
    if (len) r->stop_len = len;
    char *copy = stops && len ? malloc(n + 1) : NULL;
    if (!copy) return -1;
    memcpy(copy, s, n);
    copy[n] = 0;
    r->stops[r->n_stops] = copy;
    r->stop_len[r->n_stops++] = n;
    return 0;
}

void gen_request_free(struct gen_request *r) {
    free(r->prompt);
    free(r->draft);
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    free(r->stops);
    free(r->stop_len);
    json_decref(r->tools);
    constrain_free(r->schema);
    memset(r, 0, sizeof *r);
}

bool gen_wants_logits(const struct gen_request *r) {
    return r->logprobs >= 0 || r->schema || r->sampling.on;
}

const char *gen_finish_name(enum gen_finish f) {
    static const char *const names[] = {"error", "stop", "stop_sequence", "length", "tool_calls"};
    return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "error";
}

// ---- logprobs ------------------------------------------------------------------------------------

void gen_logprobs(const float *logits, int vocab, int32_t chosen, int k, struct token_lp *out) {
    float mx = logits[0];
    for (int i = 1; i < vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < vocab; i++) sum += exp((double)(logits[i] - mx));
    const float lse = mx + (float)log(sum);
    out->id = chosen;
    out->lp = logits[chosen] - lse;
    out->n_top = 0;
    if (k > GEN_MAX_TOP) k = GEN_MAX_TOP;
    // Top k by insertion into a sorted list: most values fail the first compare.
    for (int i = 0; i < vocab && k > 0; i++) {
        const float x = logits[i];
        if (out->n_top == k && !(x > out->top_lp[k - 1])) continue;
        int at = out->n_top < k ? out->n_top++ : k - 1;
        while (at > 0 && x > out->top_lp[at - 1]) {
            out->top_lp[at] = out->top_lp[at - 1];
            out->top_id[at] = out->top_id[at - 1];
            at--;
        }
        out->top_lp[at] = x;
        out->top_id[at] = i;
    }
    for (int t = 0; t < out->n_top; t++) out->top_lp[t] -= lse;
}

// ---- the text side -------------------------------------------------------------------------------

static void send_text(const struct gen_sink *k, enum gen_channel ch, const char *s, size_t n) {
    if (n && k->text) k->text(k->ctx, ch, s, n);
}

// The tool parser's outputs: answer text, and complete calls.
static void tool_text(void *arg, const char *s, size_t n) {
    const struct gen_text *t = arg;
    send_text(t->sink, GEN_ANSWER, s, n);
}

static void tool_call(void *arg, const char *name, const char *arguments) {
    const struct gen_text *t = arg;
    if (t->sink->tool_call) t->sink->tool_call(t->sink->ctx, name, arguments);
}

static void tool_call_begin(void *arg, const char *name) {
    const struct gen_text *t = arg;
    if (t->sink->tool_call_begin) t->sink->tool_call_begin(t->sink->ctx, name);
}

static void tool_call_delta(void *arg, const char *s, size_t n) {
    const struct gen_text *t = arg;
    if (t->sink->tool_call_delta) t->sink->tool_call_delta(t->sink->ctx, s, n);
}

static void tool_call_abort(void *arg) {
    const struct gen_text *t = arg;
    if (t->sink->tool_call_abort) t->sink->tool_call_abort(t->sink->ctx);
}

void gen_text_init(struct gen_text *t, const struct gen_request *r, const struct gen_sink *sink) {
    *t = (struct gen_text){.req = r, .sink = sink, .tools = r->tools != NULL, .stop = -1};
    t->answer = (struct gen_chan){.ch = GEN_ANSWER};
    t->reasoning = (struct gen_chan){.ch = GEN_REASONING, .strip_lead_nl = true, .trim_trail_nl = true};
    t->cur = r->reasoning ? &t->reasoning : &t->answer;
    if (t->tools) {
        tool_parser_init(&t->tp, r->tools, (struct tool_sink){.content = tool_text, .call = tool_call, .arg = t});
        t->tp.stream =
            (struct tool_stream_sink){.begin = tool_call_begin, .delta = tool_call_delta, .abort = tool_call_abort};
    }
}

void gen_text_answer(struct gen_text *t) {
    t->cur = &t->answer;
    t->answer.strip_lead_nl = true;
}

int gen_text_calls(const struct gen_text *t) {
    return t->tools ? t->tp.n_calls : 0;
}

void gen_text_free(struct gen_text *t) {
    sbuf_free(&t->reasoning.pend);
    sbuf_free(&t->answer.pend);
    if (t->tools) tool_parser_free(&t->tp);
}

// Longest proper prefix of any stop string that ends the buffer.
static size_t stop_holdback(const struct gen_request *r, const char *p, size_t n) {
    size_t hold = 0;
    for (int i = 0; i < r->n_stops; i++)
        for (size_t k = r->stop_len[i] - 1; k > hold; k--)
            if (k <= n && !memcmp(p + n - k, r->stops[i], k)) {
                hold = k;
                break;
            }
    return hold;
}

bool gen_text_push(struct gen_text *t, const char *text, size_t len, bool final) {
    const struct gen_request *r = t->req;
    struct gen_chan *c = t->cur;
    const bool tools = t->tools && c == &t->answer; // answer text goes through the tool-call parser
    if (c->strip_lead_nl && !c->started)
        while (len && *text == '\n') text++, len--;
    if (len) c->started = true;
    sbuf_add(&c->pend, text, len);
    char *p = c->pend.p;
    size_t n = c->pend.len, cut = SIZE_MAX;
    for (int i = 0; i < r->n_stops && n; i++) {
        const char *m = memmem(p, n, r->stops[i], r->stop_len[i]);
        if (m && (size_t)(m - p) < cut) cut = (size_t)(m - p), t->stop = i;
    }
    bool stopped = cut != SIZE_MAX;
    if (stopped) n = cut, final = true;
    size_t out = final ? n : n - stop_holdback(r, p, n);
    if (c->trim_trail_nl)
        while (out && p[out - 1] == '\n') out--;
    if (tools)
        tool_parser_feed(&t->tp, p, out);
    else
        send_text(t->sink, c->ch, p, out);
    if (final && tools) tool_parser_finish(&t->tp);
    if (final)
        c->pend.len = 0;
    else {
        memmove(p, p + out, c->pend.len - out);
        c->pend.len -= out;
    }
    return stopped;
}

// ---- the loop ----------------------------------------------------------------------------------

static int fail(struct gen_result *res, int rc, const char *msg) {
    snprintf(res->err, sizeof res->err, "%s", msg);
    return res->rc = rc;
}

struct gen {
    const struct gen_env *env;
    const struct gen_request *req;
    const struct gen_sink *sink;
    struct gen_result *res;
    struct gen_text text;
    struct tokenizer_stream ts;
    bool pick;                       // each step's token is chosen by the engine (logprobs, a constraint, sampling)
    struct engine_pick how;          // how (the constraint's mask through allow_mask; the draw's step and seen)
    struct engine_sampling sampling; // how.sampling points here when the request samples
    uint32_t *seen;                  // [ceil(vocab / 32)] the generated ids (how.seen), when sampling
    int vocab;
    struct engine_choice choice; // the last forward's choice
    bool constrained;            // the answer is picked under req->schema
    struct constrained con;
    // A reasoning budget: tokens left before "\n</think>" is forced (-1: none), and those tokens.
    int think_left, n_close, closed;
    int32_t close_ids[2];
    struct drafter *dr; // speculative decoding (NULL: off)
    struct drafter drafter;
    int n_pushed; // generated tokens the drafter's history holds
};

static void progress(void *arg, int done, int total) {
    const struct gen *g = arg;
    if (g->env->progress) g->env->progress(g->env->arg, done, total);
    if (g->sink->progress) g->sink->progress(g->sink->ctx, done, total);
}

// Forwards tokens; ENGINE_OK, ENGINE_CANCELLED or ENGINE_ERROR (res->err).  pick: the engine
// chooses the token after the last row (g->choice).  A prefill of several chunks reports its
// progress, the first report before any work: a client sees bytes at once and after every chunk,
// however long the prompt.
static int forward(struct gen *g, const int32_t *t, int n, int32_t *next, bool pick) {
    const struct gen_env *env = g->env;
    if (env->cancelled && env->cancelled(env->arg)) return ENGINE_CANCELLED;
    const int chunk = env->chunk ? env->chunk : QWEN_PREFILL_CHUNK;
    const bool multi = n > chunk; // single steps and one-chunk prompts report nothing
    struct forward_opts fo = {.cancelled = env->cancelled,
                              .cancel_arg = env->arg,
                              .chunk = env->chunk,
                              .progress = multi ? progress : NULL,
                              .progress_arg = g,
                              .pick = pick ? &g->how : NULL,
                              .choice = &g->choice};
    if (multi) progress(g, 0, n);
    g->how.step = (uint64_t)g->res->n; // the draw of the token about to be chosen: its index in the output
    const int rc = engine_forward(env->e, env->s, t, n, &fo, next, g->res->err, sizeof g->res->err);
    if (rc == ENGINE_OK) g->res->greedy_next = *next;
    return rc;
}

static bool in_answer(const struct gen *g) {
    return g->text.cur == &g->text.answer;
}

// The engine's allow: the constraint's mask where the next token is the answer's.
static const uint32_t *allow_mask(void *arg) {
    struct gen *g = arg;
    return g->constrained && in_answer(g) ? constrained_mask(&g->con) : NULL;
}

// The last forward's row of logits (the rare picks the choice does not settle); NULL on an error.
static const float *last_row(void *arg) {
    const struct gen *g = arg;
    char err[256];
    return engine_last_logits(g->env->e, g->env->logits, err, sizeof err) ? NULL : g->env->logits;
}

// tok's log-probabilities from the choice (the row's, when tok is neither its greedy nor its chosen id).
static int token_logprobs(struct gen *g, int32_t tok, struct token_lp *lp) {
    const struct engine_choice *c = &g->choice;
    *lp = (struct token_lp){.id = tok, .n_top = c->n_top};
    memcpy(lp->top_id, c->top_id, sizeof c->top_id[0] * (size_t)c->n_top);
    memcpy(lp->top_lp, c->top_lp, sizeof c->top_lp[0] * (size_t)c->n_top);
    if (tok == c->greedy)
        lp->lp = c->greedy_lp;
    else if (tok == c->chosen)
        lp->lp = c->chosen_lp;
    else {
        const float *row = last_row(g);
        if (!row) return -1;
        struct token_lp full;
        gen_logprobs(row, g->env->vocab, tok, 0, &full);
        lp->lp = full.lp;
    }
    return 0;
}

// The text of one token into the current channel; true when a stop string ended the output.
static bool decode(struct gen *g, int32_t tok) {
    const char *s = "";
    size_t n = 0;
    char err[64];
    if (!g->env->tok) return false;
    if (g->text.cur == &g->text.reasoning && tok == TOKEN_THINK_END) { // reasoning ends; the answer follows
        tokenizer_stream_flush(&g->ts, &s, &n);
        bool stopped = gen_text_push(&g->text, s, n, true);
        gen_text_answer(&g->text);
        return stopped;
    }
    if (tokenizer_token_bytes(g->env->tok, tok, &n) && // ids the tokenizer lacks decode to nothing
        !tokenizer_stream_push(&g->ts, tok, &s, &n, err, sizeof err))
        return gen_text_push(&g->text, s, n, false);
    return false;
}

// One generated token: true when the output ends with it (res->finish set, but for tool calls;
// res->rc set when the sink failed).  A step that accepts several tokens takes them one by one.
static bool take(struct gen *g, int32_t tok) {
    const struct gen_request *r = g->req;
    struct gen_result *res = g->res;
    res->ids[res->n++] = tok;
    if (g->seen && tok >= 0 && tok < g->vocab) g->seen[tok >> 5] |= 1u << (tok & 31);
    if (g->sink->token) g->sink->token(g->sink->ctx, tok);
    if (!r->ignore_stop && chat_is_stop(tok)) {
        if (r->echo_stop) decode(g, tok);
        res->finish = GEN_FINISH_STOP;
        return true;
    }
    if (r->logprobs >= 0 && g->sink->logprobs) {
        struct token_lp lp;
        if (token_logprobs(g, tok, &lp) || g->sink->logprobs(g->sink->ctx, &lp)) {
            fail(res, GEN_NOMEM, "out of memory");
            return true;
        }
    }
    if (decode(g, tok)) {
        res->finish = GEN_FINISH_STOP_SEQUENCE;
        return true;
    }
    if (res->n == r->max_tokens) {
        res->finish = GEN_FINISH_LENGTH;
        return true;
    }
    return false;
}

// The next token is the reasoning budget's forced one, not the model's.
static bool forced(const struct gen *g) {
    return !in_answer(g) && g->think_left == 0 && g->closed < g->n_close;
}

// A token of the output: taken, then the budget and the call limit. True when the output ends with it.
static bool emit(struct gen *g, int32_t tok) {
    const bool reasoning = !in_answer(g);
    if (take(g, tok)) return true;
    if (reasoning && g->think_left > 0) g->think_left--;
    if (g->req->max_calls > 0 && gen_text_calls(&g->text) >= g->req->max_calls) { // no parallel calls
        g->res->finish = GEN_FINISH_TOOL_CALLS;
        return true;
    }
    return false;
}

// A decode step after tok with a draft when the drafter has one: [tok, draft] verified in one
// forward, the draft's right prefix emitted token by token as plain steps emit them (the stop rules,
// the budget, cancellation between tokens), the sequence then kept up to the last token a plain
// step would have forwarded. Without a draft, a plain step. *tok: the next token; *ended: the
// output ended within the draft (res->finish or res->rc says why).
static int speculate(struct gen *g, int32_t *tok, bool *ended) {
    const struct gen_env *env = g->env;
    struct gen_result *res = g->res;
    while (g->n_pushed < res->n) draft_push(g->dr, res->ids[g->n_pushed++]); // (out of memory: a shorter history)
    // Only tokens a plain decode would forward: never the output's last one.
    int limit = g->req->max_tokens - res->n - 1;
    const int room = seq_capacity(env->s) - seq_pos(env->s) - 1;
    if (room < limit) limit = room;
    int32_t v[DRAFT_LEN_MAX + 1], next[DRAFT_LEN_MAX + 1];
    const int k = draft_propose(g->dr, limit, v + 1);
    if (!k) return forward(g, tok, 1, tok, false);
    if (env->cancelled && env->cancelled(env->arg)) return ENGINE_CANCELLED;
    v[0] = *tok;
    if (engine_verify(env->e, env->s, v, k + 1, next, res->err, sizeof res->err)) return ENGINE_ERROR;
    const int m = draft_accepted(v + 1, k, next);
    const bool extra = g->dr->last_src > 0;
    draft_result(g->dr, k, m);
    res->drafted += k;
    res->extra_drafted += extra ? k : 0;
    int rc = ENGINE_OK, keep = m + 1; // tok and the right drafts; the token after them is next[m]
    *tok = next[m];
    for (int j = 0; j < m; j++) {
        if (forced(g)) { // the budget's token replaces draft j (the loop's next step)
            keep = j + 1, *tok = next[j];
            break;
        }
        res->accepted++;
        res->extra_accepted += extra;
        if (emit(g, v[j + 1])) {
            keep = j + 1, *ended = true;
            break;
        }
        if (env->cancelled && env->cancelled(env->arg)) { // where a plain step would have noticed
            keep = j + 1, rc = ENGINE_CANCELLED;
            break;
        }
    }
    if (engine_verify_keep(env->e, env->s, keep, res->err, sizeof res->err)) return ENGINE_ERROR;
    res->greedy_next = next[keep - 1]; // the argmax after the last token the sequence holds
    return rc;
}

int generate(const struct gen_env *env, const struct gen_request *req, int from, const int32_t *next,
             const struct gen_sink *sink, struct gen_result *res) {
    static const struct gen_sink none = {0};
    *res = (struct gen_result){.rc = ENGINE_OK, .stop = -1};
    struct gen g = {.env = env, .req = req, .sink = sink ? sink : &none, .res = res};
    const int32_t *P = req->prompt;
    const int n = req->n_prompt;
    g.pick = gen_wants_logits(req);
    g.how = (struct engine_pick){.allow = allow_mask, .allow_arg = &g, .n_top = req->logprobs};
    g.constrained = req->schema != NULL;
    const struct gen_sampling *sm = &req->sampling;
    const bool sampled = sm->on;
    g.vocab = engine_geometry(env->e)->vocab;
    int rc = ENGINE_OK;
    if (sampled) {
        g.sampling = (struct engine_sampling){.temperature = sm->temperature,
                                              .top_p = sm->top_p,
                                              .min_p = sm->min_p,
                                              .presence_penalty = sm->presence_penalty,
                                              .top_k = sm->top_k,
                                              .seed = sm->seed};
        g.how.sampling = &g.sampling;
        if ((g.seen = calloc(((size_t)g.vocab + 31) / 32, sizeof *g.seen)))
            g.how.seen = g.seen;
        else
            rc = fail(res, GEN_NOMEM, "out of memory");
    }
    if ((g.pick && !env->logits) ||
        (g.constrained && constrained_init(&g.con, req->schema, env->tok, env->trie, (enum mask_mode)env->mask_mode)))
        rc = fail(res, GEN_NOMEM, "out of memory");
    int32_t tok = next ? *next : -1;
    res->greedy_next = tok;

    // Prefill to the last message boundary, snapshot there, then the rest of the prompt.
    int pos = from;
    if (rc == ENGINE_OK && !next && env->snapshot && req->boundary > pos && req->boundary < n) {
        int32_t bnext;
        rc = forward(&g, P + pos, req->boundary - pos, &bnext, false);
        if (rc == ENGINE_OK) {
            pos = req->boundary;
            env->snapshot(env->arg, pos, bnext);
        }
    }
    if (rc == ENGINE_OK && g.constrained && !req->reasoning)
        constrained_prepare(&g.con); // the first mask, during the prefill
    if (rc == ENGINE_OK && !next) rc = forward(&g, P + pos, n - pos, &tok, g.pick);
    res->t_prefilled = now_s();

    // Decode.
    gen_text_init(&g.text, req, g.sink);
    if (env->tok) tokenizer_stream_init(&g.ts, env->tok, 1);
    if (rc == ENGINE_OK && !(res->ids = malloc(sizeof *res->ids * (size_t)(req->max_tokens + 1))))
        rc = fail(res, GEN_NOMEM, "out of memory");
    // A reasoning budget: once spent, the reasoning is closed the way the model closes it
    // ("\n</think>", forced), and the answer follows as the model goes on.
    g.think_left = req->reasoning && req->reasoning_budget > 0 ? req->reasoning_budget : -1;
    if (g.think_left >= 0) {
        int32_t *nl = NULL;
        size_t nn = 0;
        char err[64];
        if (env->tok && !tokenizer_encode(env->tok, "\n", 1, &nl, &nn, err, sizeof err) && nn == 1)
            g.close_ids[g.n_close++] = nl[0];
        free(nl);
        g.close_ids[g.n_close++] = TOKEN_THINK_END;
    }
    // Speculative decoding, where it cannot change the output: greedy picks of the model's own
    // argmax (no logprobs, no constraint) on a backend that verifies. Without memory for the
    // drafter, plain steps.
    const int vmax = engine_verify_max(env->e);
    const struct draft_policy policy = draft_policy_for(env->e);
    if (rc == ENGINE_OK && env->speculative && !g.pick && vmax >= 2 &&
        !draft_init(&g.drafter, P, n, vmax - 1 < DRAFT_LEN_MAX ? vmax - 1 : DRAFT_LEN_MAX, &policy)) {
        g.dr = &g.drafter;
        // The request's draft tokens are a hint: ids outside the vocabulary drop them, never fail the
        // request (a verification refuses them); out of memory, the prompt's drafts only.
        const int V = engine_geometry(env->e)->vocab;
        bool valid = req->n_draft > 1;
        for (int i = 0; valid && i < req->n_draft; i++) valid = req->draft[i] >= 0 && req->draft[i] < V;
        if (valid) draft_add_source(g.dr, req->draft, req->n_draft);
    }
    if (rc == ENGINE_OK && g.sink->begin) g.sink->begin(g.sink->ctx); // with the first token (TTFT)
    while (rc == ENGINE_OK) {
        if (sampled && g.choice.chosen >= 0) tok = g.choice.chosen; // the draw (under the constraint's mask)
        if (forced(&g)) tok = g.close_ids[g.closed++];
        if (g.constrained && in_answer(&g))
            tok = constrained_pick_choice(&g.con, &g.choice, sampled, req->max_tokens - res->n, last_row, &g);
        if (emit(&g, tok)) {
            rc = res->rc;
            break;
        }
        // The next step's mask depends on tok only: on the helper thread while the step runs.
        if (g.constrained && in_answer(&g)) constrained_prepare(&g.con);
        bool ended = false;
        rc = g.dr ? speculate(&g, &tok, &ended) : forward(&g, &tok, 1, &tok, g.pick);
        if (rc == ENGINE_OK && ended) {
            rc = res->rc;
            break;
        }
    }
    if (rc == ENGINE_OK) {
        if (res->finish != GEN_FINISH_STOP_SEQUENCE && env->tok) { // flush what the decoder and the channel still hold
            const char *tail;
            size_t tl;
            tokenizer_stream_flush(&g.ts, &tail, &tl);
            if (gen_text_push(&g.text, tail, tl, true) && res->finish != GEN_FINISH_STOP)
                res->finish = GEN_FINISH_STOP_SEQUENCE;
        }
        if (gen_text_calls(&g.text)) res->finish = GEN_FINISH_TOOL_CALLS;
        if (res->finish == GEN_FINISH_STOP_SEQUENCE) res->stop = g.text.stop;
    }
    if (env->tok) tokenizer_stream_free(&g.ts);
    gen_text_free(&g.text);
    if (g.constrained) constrained_free(&g.con);
    free(g.seen);
    if (g.dr) draft_free(g.dr);
    res->t_end = now_s();
    return res->rc = rc;
}
