// test_responses.c: OpenAI's Responses API (responses.c, response_store.c) without sockets or a model.
//
//   1. Requests translate into the template's input: a Responses body and the OpenAI chat body
//      that says the same (instructions and developer messages, input items of every kind) give
//      the same prompt tokens; reasoning effort "none", parallel_tool_calls, the session key.
//   2. Bad requests: a 4xx naming the field (a 404 for an unknown previous_response_id).
//   3. The sink, streamed and whole, cut at every byte: the same output items; the event
//      sequence; argument deltas joined == the call's arguments; the response stored, and what a
//      continuation makes of it (the stored tokens first when the instructions and tools are kept,
//      the whole conversation rendered anew when not).
//   4. The store's bounds: entries and bytes, least recently used first; delete.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "openai.h"
#include "responses.h"
#include "sse_events.h"
#include "synth.h"
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct tokenizer *tok;
static char tok_dir[] = "/tmp/calla_responses_XXXXXX";
static struct rstore store;

static struct chatreq_ctx ctx(void) {
    return (struct chatreq_ctx){
        .tok = tok, .vocab = 248320, .context = 4096, .default_max_tokens = 8, .model_name = "m"};
}

static struct job *parse_with(const char *body, bool allow_sampling, struct req_error *re) {
    struct chatreq_ctx c = ctx();
    c.allow_sampling = allow_sampling;
    *re = (struct req_error){0};
    return responses_parse_request(&c, &store, body, strlen(body), re);
}

static struct job *parse(const char *body, struct req_error *re) {
    return parse_with(body, false, re);
}

static void expect_same_prompt(const char *responses_body, const char *openai_body) {
    struct req_error re;
    struct job *a = parse(responses_body, &re);
    if (!a) fail_msg("%s: %s", responses_body, re.msg);
    struct openai_ctx oc = {.tok = tok, .vocab = 248320, .context = 4096, .default_max_tokens = 8, .model_name = "m"};
    struct job *o = openai_parse_request(&oc, OPENAI_CHAT, openai_body, strlen(openai_body), &re);
    if (!o) fail_msg("openai: %s", re.msg);
    if (a->req.n_prompt != o->req.n_prompt ||
        memcmp(a->req.prompt, o->req.prompt, sizeof *a->req.prompt * (size_t)a->req.n_prompt))
        fail_msg("%s: %d tokens, the OpenAI body %d", responses_body, a->req.n_prompt, o->req.n_prompt);
    assert_int_equal(a->req.boundary, o->req.boundary);
    assert_int_equal(a->req.reasoning, o->req.reasoning);
    assert_int_equal(!a->req.schema, !o->req.schema);
    job_unref(a), job_unref(o);
}

#define TOOL_R                                                                                                         \
    "{\"type\": \"function\", \"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", \"properties\": "      \
    "{\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}"
#define TOOL_O                                                                                                         \
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "       \
    "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}"
#define NONE "\"reasoning\": {\"effort\": \"none\"}"
#define OFF  "\"chat_template_kwargs\": {\"enable_thinking\": false}"

static void test_translation(void **state) {
    expect_same_prompt("{\"input\": \"Hi\"}", "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}");
    expect_same_prompt("{\"input\": \"Hi\", " NONE "}",
                       "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], " OFF "}");
    // Instructions and the developer messages before the conversation: one system message; a later
    // developer message is given as a user message.
    expect_same_prompt(
        "{\"instructions\": \"Be brief.\", \"input\": [{\"role\": \"developer\", \"content\": [{\"type\": "
        "\"input_text\", \"text\": \"No tools.\"}]}, {\"type\": \"message\", \"role\": \"user\", \"content\": "
        "\"Hi\"}, {\"role\": \"developer\", \"content\": \"Later.\"}]}",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\\n\\nNo tools.\"}, {\"role\": \"user\", "
        "\"content\": \"Hi\"}, {\"role\": \"user\", \"content\": \"Later.\"}]}");
    // A Codex-like tool loop: reasoning, a message and a call make one assistant turn.
    expect_same_prompt(
        "{\"tools\": [" TOOL_R
        "], \"input\": [{\"role\": \"user\", \"content\": \"Weather?\"}, {\"type\": \"reasoning\", "
        "\"id\": \"rs_1\", \"summary\": [], \"content\": [{\"type\": \"reasoning_text\", \"text\": \"need it\"}]}, "
        "{\"type\": \"message\", \"role\": \"assistant\", \"content\": [{\"type\": \"output_text\", \"text\": "
        "\"Checking.\", "
        "\"annotations\": []}]}, {\"type\": \"function_call\", \"call_id\": \"call_1\", \"name\": \"get_weather\", "
        "\"arguments\": \"{\\\"city\\\": \\\"Bern\\\"}\"}, {\"type\": \"function_call_output\", \"call_id\": "
        "\"call_1\", "
        "\"output\": \"21 C\"}]}",
        "{\"tools\": [" TOOL_O
        "], \"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}, {\"role\": \"assistant\", "
        "\"content\": \"Checking.\", \"reasoning_content\": \"need it\", \"tool_calls\": [{\"id\": \"call_1\", "
        "\"type\": "
        "\"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Bern\\\"}\"}}]}, "
        "{\"role\": \"tool\", \"content\": \"21 C\"}]}");
    expect_same_prompt("{\"tools\": [" TOOL_R
                       "], \"tool_choice\": {\"type\": \"function\", \"name\": \"get_weather\"}, "
                       "\"input\": \"x\", " NONE "}",
                       "{\"tools\": [" TOOL_O "], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
                       "\"get_weather\"}}, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], " OFF "}");
    expect_same_prompt(
        "{\"text\": {\"format\": {\"type\": \"json_schema\", \"name\": \"n\", \"schema\": {\"type\": "
        "\"object\"}}}, \"input\": \"x\"}",
        "{\"response_format\": {\"type\": \"json_object\"}, \"messages\": [{\"role\": \"user\", \"content\": "
        "\"x\"}]}");
    struct req_error re;
    struct job *j =
        parse("{\"input\": \"x\", \"tools\": [" TOOL_R "], \"parallel_tool_calls\": false, \"max_output_tokens\": "
              "5, \"prompt_cache_key\": \"conv-1\", \"user\": \"u\", \"stream\": true}",
              &re);
    if (!j) fail_msg("%s", re.msg);
    assert_int_equal(j->req.max_calls, 1);
    assert_int_equal(j->req.max_tokens, 5);
    assert_string_equal(j->session, "conv-1"); // prompt_cache_key before user
    assert_true(j->stream);
    assert_int_equal(strncmp(j->id, "resp_", 5), 0);
    job_unref(j);
}

static void expect_bad(const char *body, int status, const char *param, const char *needle) {
    struct req_error re;
    struct job *j = parse(body, &re);
    if (j) fail_msg("accepted: %s", body);
    assert_int_equal(re.status, status);
    if (param) assert_string_equal(re.param ? re.param : "(null)", param);
    if (!strstr(re.msg, needle)) fail_msg("\"%s\" lacks \"%s\"", re.msg, needle);
}

// Every top-level field is one the API knows: others are refused, named; the inert and "off" ones
// pass.  Sampling: greedy values only, unless the server samples: then temperature and top_p.
static void test_fields_and_sampling(void **state) {
    expect_bad("{\"input\": \"x\", \"temprature\": 0}", 400, NULL, "Unknown parameter: 'temprature'");
    expect_bad("{\"input\": \"x\", \"seed\": 5}", 400, NULL, "Unknown parameter: 'seed'"); // not the Responses API's
    expect_bad("{\"input\": \"x\", \"background\": true}", 400, "background", "not supported");
    expect_bad("{\"input\": \"x\", \"prompt\": {\"id\": \"p\"}}", 400, "prompt", "not supported");
    expect_bad("{\"input\": \"x\", \"safety_identifier\": 3}", 400, "safety_identifier", "a string");
    expect_bad("{\"input\": \"x\", \"top_p\": 0.9}", 400, "top_p", "--allow-sampling");
    struct req_error re;
    struct job *j =
        parse("{\"input\": \"x\", \"background\": false, \"service_tier\": \"auto\", \"safety_identifier\": \"u\", "
              "\"conversation\": null, \"reasoning\": {\"effort\": \"minimal\"}}",
              &re);
    if (!j) fail_msg("%s", re.msg);
    assert_false(j->req.sampling.on);
    assert_false(j->req.reasoning); // minimal: thinking off, as the chat API's reasoning_effort
    job_unref(j);
    j = parse_with("{\"input\": \"x\", \"temperature\": 1.2, \"top_p\": 0.5}", true, &re);
    if (!j) fail_msg("%s", re.msg);
    assert_true(j->req.sampling.on && j->req.sampling.temperature == 1.2f && j->req.sampling.top_p == 0.5f &&
                j->req.sampling.top_k == 0);
    job_unref(j);
    j = parse_with("{\"input\": \"x\", \"temperature\": 0}", true, &re);
    if (!j) fail_msg("%s", re.msg);
    assert_false(j->req.sampling.on);
    job_unref(j);
}

static void test_bad_requests(void **state) {
    expect_bad("{}", 400, "input", "required");
    expect_bad("{\"input\": \"x\", \"temperature\": 0.7}", 400, "temperature", "greedy");
    expect_bad("{\"input\": [{\"type\": \"computer_call\"}]}", 400, "input", "computer_call");
    expect_bad("{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_file\"}]}]}", 400, "input",
               "text only");
    expect_bad(
        "{\"input\": [{\"type\": \"function_call\", \"call_id\": \"c\", \"name\": \"f\", \"arguments\": \"[1]\"}]}",
        400, "input", "JSON object");
    expect_bad("{\"input\": [{\"role\": \"assistant\", \"content\": \"x\"}]}", 400, "input", "user query");
    expect_bad("{\"input\": \"x\", \"tools\": [{\"type\": \"file_search\"}]}", 400, "tools", "function tools");
    expect_bad("{\"input\": \"x\", \"tools\": [" TOOL_R
               "], \"tool_choice\": \"required\", \"parallel_tool_calls\": true}",
               400, "parallel_tool_calls", "exactly one call");
    expect_bad("{\"input\": \"x\", \"tools\": [" TOOL_R
               "], \"tool_choice\": {\"type\": \"function\", \"name\": \"nope\"}}",
               400, "tool_choice", "no tool named");
    expect_bad("{\"input\": \"x\", \"reasoning\": {\"effort\": \"extreme\"}}", 400, "reasoning", "reasoning.effort");
    expect_bad(
        "{\"input\": \"x\", \"text\": {\"format\": {\"type\": \"json_schema\", \"schema\": {\"type\": \"object\", "
        "\"minProperties\": 1}}}}",
        400, "text", "minProperties");
    expect_bad("{\"input\": \"x\", \"truncation\": \"auto\"}", 400, "truncation", "never cut");
    expect_bad("{\"input\": \"x\", \"previous_response_id\": \"resp_unknown\"}", 404, "previous_response_id",
               "no stored");
    expect_bad("{\"input\": \"x\", \"max_output_tokens\": 4090}", 400, "max_output_tokens", "context");
    expect_bad("{\"input\": \"x\", \"user\": 3, \"prompt_cache_key\": \"k\"}", 400, "user", "string");
}

// ---- the sink and the store ----------------------------------------------------------------------

// The events' data, each checked to be named by its type.
static json_t *events_of(const struct job *j) {
    json_t *ev = sse_events(j), *out = json_array();
    assert_non_null(ev);
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e) {
        json_t *d = json_object_get(e, "data");
        assert_string_equal(json_string_value(json_object_get(e, "event")),
                            json_string_value(json_object_get(d, "type")));
        json_array_append(out, d);
    }
    json_decref(ev);
    return out;
}

// Runs a parsed job's sink over a reasoning text and an answer cut at cut, as generate would;
// the generated ids end the turn (<|im_end|>) when ended.
static void run_sink(struct job *j, const char *reasoning, const char *answer, size_t cut, bool ended) {
    struct gen_text t;
    gen_text_init(&t, &j->req, &j->sink);
    j->sink.begin(j->sink.ctx);
    if (j->req.reasoning) {
        gen_text_push(&t, reasoning, strlen(reasoning), true);
        gen_text_answer(&t);
    }
    gen_text_push(&t, answer, cut, false);
    gen_text_push(&t, answer + cut, strlen(answer) - cut, true);
    const int32_t ids[4] = {11, TOKEN_THINK_END, 12, ended ? TOKEN_IM_END : 13};
    const enum gen_finish f = gen_text_calls(&t) ? GEN_FINISH_TOOL_CALLS : ended ? GEN_FINISH_STOP : GEN_FINISH_LENGTH;
    j->sink.end(j->sink.ctx,
                &(struct gen_end){.finish = f, .ids = ids, .n_gen = 4, .n_prompt = j->req.n_prompt, .n_cached = 2});
    gen_text_free(&t);
}

// A response's output without its random ids.
static json_t *output_of(const json_t *response) {
    json_t *out = json_deep_copy(json_object_get(response, "output"));
    size_t i;
    json_t *it;
    json_array_foreach(out, i, it) {
        json_object_del(it, "id");
        json_object_del(it, "call_id");
    }
    return out;
}

static void test_sink(void **state) {
    static const char answer[] = "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nBern \\ \"x\"\n"
                                 "</parameter>\n</function>\n</tool_call>";
    const char *body = "{\"input\": \"Weather?\", \"tools\": [" TOOL_R "], \"instructions\": \"Be brief.\"}";
    json_t *want = NULL;
    const size_t n = sizeof answer - 1;
    for (size_t cut = 0; cut <= n; cut++)
        for (int stream = 0; stream < 2; stream++) {
            struct req_error re;
            struct job *j = parse(body, &re);
            if (!j) fail_msg("%s", re.msg);
            j->stream = stream;
            run_sink(j, "thinking it over", answer, cut, true);
            json_t *resp;
            if (stream) {
                json_t *ev = events_of(j);
                const size_t ne = json_array_size(ev);
                assert_string_equal(json_string_value(json_object_get(json_array_get(ev, 0), "type")),
                                    "response.created");
                assert_string_equal(json_string_value(json_object_get(json_array_get(ev, ne - 1), "type")),
                                    "response.completed");
                struct sbuf args = {0};
                int added = 0, done = 0;
                for (size_t i = 0; i < ne; i++) {
                    json_t *e = json_array_get(ev, i);
                    const char *type = json_string_value(json_object_get(e, "type"));
                    assert_int_equal(json_integer_value(json_object_get(e, "sequence_number")), (json_int_t)i);
                    added += !strcmp(type, "response.output_item.added");
                    done += !strcmp(type, "response.output_item.done");
                    if (!strcmp(type, "response.function_call_arguments.delta"))
                        sbuf_adds(&args, json_string_value(json_object_get(e, "delta")));
                    if (!strcmp(type, "response.function_call_arguments.done"))
                        assert_string_equal(args.p, json_string_value(json_object_get(e, "arguments")));
                }
                assert_int_equal(added, 3);
                assert_int_equal(done, 3);
                assert_non_null(args.p);
                sbuf_free(&args);
                resp = json_incref(json_object_get(json_array_get(ev, ne - 1), "response"));
                json_decref(ev);
            } else {
                assert_int_equal(j->status, 200);
                resp = json_loads(j->out.p, 0, NULL);
            }
            assert_non_null(resp);
            assert_string_equal(json_string_value(json_object_get(resp, "status")), "completed");
            assert_int_equal(
                json_integer_value(json_object_get(
                    json_object_get(json_object_get(resp, "usage"), "input_tokens_details"), "cached_tokens")),
                2);
            json_t *out = output_of(resp);
            assert_int_equal(json_array_size(out), 3);
            assert_string_equal(json_string_value(json_object_get(json_array_get(out, 2), "arguments")),
                                "{\"city\":\"Bern \\\\ \\\"x\\\"\"}");
            if (!want)
                want = json_incref(out);
            else if (!json_equal(want, out))
                fail_msg("cut %zu stream %d: another output", cut, stream);
            // Stored: GET gives the response as sent.
            char *got = rstore_get_response(&store, j->id);
            assert_non_null(got);
            json_t *g = json_loads(got, 0, NULL);
            assert_true(json_equal(g, resp));
            json_decref(g), free(got);
            json_decref(out), json_decref(resp);
            job_unref(j);
        }
    json_decref(want);
}

static void test_continuation(void **state) {
    struct req_error re;
    struct job *a =
        parse("{\"input\": \"One.\", \"instructions\": \"Be brief.\", \"reasoning\": {\"effort\": \"none\"}}", &re);
    if (!a) fail_msg("%s", re.msg);
    run_sink(a, "", "Sure.", 0, true); // ended its turn: continuable by tokens
    char body[512];
    snprintf(body, sizeof body,
             "{\"input\": \"Two.\", \"instructions\": \"Be brief.\", \"previous_response_id\": \"%s\", "
             "\"reasoning\": {\"effort\": \"none\"}}",
             a->id);
    struct job *b = parse(body, &re);
    if (!b) fail_msg("%s", re.msg);
    const int stored = a->req.n_prompt + 4; // the prompt and the 4 generated ids
    assert_true(b->req.n_prompt > stored);
    assert_memory_equal(b->req.prompt, a->req.prompt, sizeof *a->req.prompt * (size_t)a->req.n_prompt);
    assert_int_equal(b->req.prompt[stored - 1], TOKEN_IM_END);
    assert_true(b->req.boundary > stored);
    assert_string_equal(b->session, a->id); // no key given: the response continued
    // Other instructions: the whole conversation rendered anew, as the same items sent in full would be.
    snprintf(body, sizeof body,
             "{\"input\": \"Two.\", \"instructions\": \"Be long.\", \"previous_response_id\": \"%s\", "
             "\"reasoning\": {\"effort\": \"none\"}}",
             a->id);
    struct job *c = parse(body, &re);
    if (!c) fail_msg("%s", re.msg);
    expect_same_prompt(
        body, "{\"messages\": [{\"role\": \"system\", \"content\": \"Be long.\"}, {\"role\": \"user\", "
              "\"content\": \"One.\"}, {\"role\": \"assistant\", \"content\": \"Sure.\"}, {\"role\": \"user\", "
              "\"content\": \"Two.\"}], " OFF "}");
    // Not ended (max_output_tokens): rendered anew as well.
    struct job *d = parse("{\"input\": \"One.\", \"reasoning\": {\"effort\": \"none\"}}", &re);
    run_sink(d, "", "Cut", 0, false);
    snprintf(body, sizeof body,
             "{\"input\": \"Two.\", \"previous_response_id\": \"%s\", \"reasoning\": {\"effort\": \"none\"}}", d->id);
    expect_same_prompt(body, "{\"messages\": [{\"role\": \"user\", \"content\": \"One.\"}, {\"role\": \"assistant\", "
                             "\"content\": \"Cut\"}, {\"role\": \"user\", \"content\": \"Two.\"}], " OFF "}");
    // store false: nothing kept.
    struct job *e = parse("{\"input\": \"One.\", \"store\": false}", &re);
    run_sink(e, "r", "x", 0, true);
    assert_null(rstore_get_response(&store, e->id));
    job_unref(a), job_unref(b), job_unref(c), job_unref(d), job_unref(e);
}

static struct rstore_entry *entry(const char *id, int n_tokens) {
    struct rstore_entry *e = calloc(1, sizeof *e);
    snprintf(e->id, sizeof e->id, "%s", id);
    e->response = strdup("{}");
    e->tools = strdup("");
    e->conv = json_array();
    e->tokens = calloc((size_t)n_tokens + 1, sizeof *e->tokens);
    e->n_tokens = n_tokens;
    return e;
}

static void test_store_bounds(void **state) {
    struct rstore s;
    assert_int_equal(rstore_init(&s, 3, 1 << 20), 0);
    assert_int_equal(rstore_put(&s, entry("a", 1)), 0);
    assert_int_equal(rstore_put(&s, entry("b", 1)), 0);
    assert_int_equal(rstore_put(&s, entry("c", 1)), 0);
    free(rstore_get_response(&s, "a")); // a is used: b is the oldest
    assert_int_equal(rstore_put(&s, entry("d", 1)), 0);
    char *r;
    assert_null(rstore_get_response(&s, "b"));
    assert_non_null(r = rstore_get_response(&s, "a")), free(r);
    struct rstore_entry *c = rstore_get(&s, "c");
    assert_non_null(c);
    assert_int_equal(c->n_tokens, 1);
    rstore_entry_free(c);
    // Bytes: an entry of 200,000 tokens (800 kB) pushes the others out; one over the cap is refused.
    assert_int_equal(rstore_put(&s, entry("big", 200000)), 0);
    assert_int_equal(rstore_put(&s, entry("big2", 200000)), 0);
    assert_null(rstore_get_response(&s, "big"));
    assert_int_equal(rstore_put(&s, entry("huge", 300000)), -1);
    assert_true(rstore_delete(&s, "big2"));
    assert_false(rstore_delete(&s, "big2"));
    assert_int_equal(s.bytes, 0);
    rstore_free(&s);
    struct rstore none;
    assert_int_equal(rstore_init(&none, 0, 1 << 20), 0);
    assert_int_equal(rstore_put(&none, entry("a", 1)), -1);
    rstore_free(&none);
}

static int setup(void **state) {
    char err[256];
    if (!mkdtemp(tok_dir) || synth_write_small_tokenizer(tok_dir, err, sizeof err) ||
        tokenizer_load(tok_dir, &tok, err, sizeof err)) {
        fprintf(stderr, "tokenizer: %s\n", err);
        return -1;
    }
    return rstore_init(&store, 64, 16 << 20);
}

static int teardown(void **state) {
    rstore_free(&store);
    tokenizer_free(tok);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tok_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_translation),         cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_fields_and_sampling), cmocka_unit_test(test_sink),
        cmocka_unit_test(test_continuation),        cmocka_unit_test(test_store_bounds),
    };
    return cmocka_run_group_tests_name("responses", tests, setup, teardown);
}
