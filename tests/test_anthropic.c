// test_anthropic.c: Anthropic's Messages API (anthropic.c) without sockets or a model.
//
//   1. Requests translate into the template's input: an Anthropic body and the OpenAI chat body
//      that says the same (system blocks, text, thinking, tool_use, tool_result) give the same
//      prompt tokens; thinking's switch and budget, disable_parallel_tool_use, stop_sequences,
//      the session key; count_tokens counts that prompt.
//   2. Bad requests: a 400 naming the field, the error in Anthropic's shape.
//   3. The sink: an output with thinking, text and a tool call, cut at every byte, streamed and
//      whole: the same blocks; the event sequence; input_json_delta pieces joined == the input.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "anthropic.h"
#include "sse_events.h"
#include "openai.h"
#include "synth.h"
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct tokenizer *tok;
static char tok_dir[] = "/tmp/calla_anthropic_XXXXXX";

static struct chatreq_ctx ctx(void) {
    return (struct chatreq_ctx){
        .tok = tok, .vocab = 248320, .context = 4096, .default_max_tokens = 8, .model_name = "m"};
}

static struct job *parse_with(const char *body, bool allow_sampling, struct req_error *re) {
    struct chatreq_ctx c = ctx();
    c.allow_sampling = allow_sampling;
    *re = (struct req_error){0};
    return anthropic_parse_request(&c, body, strlen(body), re);
}

static struct job *parse(const char *body, struct req_error *re) {
    return parse_with(body, false, re);
}

static struct job *parse_openai(const char *body) {
    struct openai_ctx oc = {.tok = tok, .vocab = 248320, .context = 4096, .default_max_tokens = 8, .model_name = "m"};
    struct req_error re = {0};
    struct job *j = openai_parse_request(&oc, OPENAI_CHAT, body, strlen(body), &re);
    if (!j) fail_msg("openai: %s", re.msg);
    return j;
}

static void expect_same_prompt(const char *anthropic_body, const char *openai_body) {
    struct req_error re;
    struct job *a = parse(anthropic_body, &re);
    if (!a) fail_msg("%s: %s", anthropic_body, re.msg);
    struct job *o = parse_openai(openai_body);
    if (a->req.n_prompt != o->req.n_prompt ||
        memcmp(a->req.prompt, o->req.prompt, sizeof *a->req.prompt * (size_t)a->req.n_prompt))
        fail_msg("%s: %d tokens, the OpenAI body %d", anthropic_body, a->req.n_prompt, o->req.n_prompt);
    assert_int_equal(a->req.boundary, o->req.boundary);
    assert_int_equal(a->req.reasoning, o->req.reasoning);
    assert_int_equal(!a->req.tools, !o->req.tools);
    assert_int_equal(!a->req.schema, !o->req.schema);
    job_unref(a), job_unref(o);
}

#define TOOL_A                                                                                                         \
    "{\"name\": \"get_weather\", \"description\": \"Weather\", \"input_schema\": {\"type\": \"object\", "              \
    "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}"
#define TOOL_O                                                                                                         \
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\", "                \
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, "                      \
    "\"required\": [\"city\"]}}}"
#define OFF "\"chat_template_kwargs\": {\"enable_thinking\": false}"

static void test_translation(void **state) {
    expect_same_prompt("{\"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}",
                       "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], " OFF "}");
    expect_same_prompt(
        "{\"max_tokens\": 4, \"system\": [{\"type\": \"text\", \"text\": \"Be \"}, {\"type\": \"text\", "
        "\"text\": \"brief.\", \"cache_control\": {\"type\": \"ephemeral\"}}], \"messages\": [{\"role\": "
        "\"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]}]}",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
        "\"ab\"}], " OFF "}");
    // A tool loop: thinking and a call, the result with an error, text after it; thinking on with a budget.
    expect_same_prompt(
        "{\"max_tokens\": 40, \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 16}, \"tools\": [" TOOL_A "], "
        "\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}, {\"role\": \"assistant\", \"content\": ["
        "{\"type\": \"thinking\", \"thinking\": \"need it\", \"signature\": \"s\"}, {\"type\": \"text\", \"text\": "
        "\"Checking.\"},"
        " {\"type\": \"tool_use\", \"id\": \"toolu_1\", \"name\": \"get_weather\", \"input\": {\"city\": \"Bern\"}}]}, "
        "{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": \"toolu_1\", \"is_error\": "
        "true, "
        "\"content\": [{\"type\": \"text\", \"text\": \"down\"}]}, {\"type\": \"text\", \"text\": \"Retry?\"}]}]}",
        "{\"tools\": [" TOOL_O "], \"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}, {\"role\": "
        "\"assistant\", \"content\": \"Checking.\", \"reasoning_content\": \"need it\", \"tool_calls\": [{\"id\": "
        "\"toolu_1\", "
        "\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bern\"}}}]}, "
        "{\"role\": \"tool\", \"content\": \"Error: down\"}, {\"role\": \"user\", \"content\": \"Retry?\"}]}");
    // tool_choice any / tool / none.
    expect_same_prompt("{\"max_tokens\": 40, \"tools\": [" TOOL_A
                       "], \"tool_choice\": {\"type\": \"any\"}, \"messages\": "
                       "[{\"role\": \"user\", \"content\": \"x\"}]}",
                       "{\"tools\": [" TOOL_O "], \"tool_choice\": \"required\", \"messages\": [{\"role\": \"user\", "
                       "\"content\": \"x\"}], " OFF "}");
    expect_same_prompt("{\"max_tokens\": 40, \"tools\": [" TOOL_A "], \"tool_choice\": {\"type\": \"tool\", \"name\": "
                       "\"get_weather\"}, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
                       "{\"tools\": [" TOOL_O "], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
                       "\"get_weather\"}}, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], " OFF "}");
    expect_same_prompt("{\"max_tokens\": 4, \"tools\": [" TOOL_A
                       "], \"tool_choice\": {\"type\": \"none\"}, \"messages\": "
                       "[{\"role\": \"user\", \"content\": \"x\"}]}",
                       "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], " OFF "}");

    // The rest of the request: budget, one call, stops, session key, count_tokens.
    struct req_error re;
    const char *body =
        "{\"max_tokens\": 40, \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 16}, \"stop_sequences\": "
        "[\"END\", \"\\n\\n\"], \"metadata\": {\"user_id\": \"u-1\"}, \"tools\": [" TOOL_A "], \"tool_choice\": "
        "{\"type\": \"auto\", \"disable_parallel_tool_use\": true}, \"temperature\": 0, \"top_k\": 1, "
        "\"stream\": true, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}";
    struct job *j = parse(body, &re);
    if (!j) fail_msg("%s", re.msg);
    assert_true(j->req.reasoning);
    assert_int_equal(j->req.reasoning_budget, 16);
    assert_int_equal(j->req.max_calls, 1);
    assert_int_equal(j->req.max_tokens, 40);
    assert_int_equal(j->req.n_stops, 2);
    assert_string_equal(j->req.stops[1], "\n\n");
    assert_string_equal(j->session, "u-1");
    assert_true(j->stream);
    assert_string_equal(j->kind, "messages");
    assert_int_equal(strncmp(j->id, "msg_", 4), 0);
    struct chatreq_ctx c = ctx();
    int n = 0;
    assert_int_equal(anthropic_count_tokens(&c, body, strlen(body), &n, &re), 0);
    assert_int_equal(n, j->req.n_prompt);
    job_unref(j);
    const char *no_max =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}"; // count_tokens needs no max_tokens
    assert_int_equal(anthropic_count_tokens(&c, no_max, strlen(no_max), &n, &re), 0);
    assert_true(n > 0);
}

static void expect_bad_with(const char *body, bool allow_sampling, const char *param, const char *needle) {
    struct req_error re;
    struct job *j = parse_with(body, allow_sampling, &re);
    if (j) fail_msg("accepted: %s", body);
    assert_int_equal(re.status, 400);
    if (param) assert_string_equal(re.param ? re.param : "(null)", param);
    if (!strstr(re.msg, needle)) fail_msg("\"%s\" lacks \"%s\"", re.msg, needle);
    json_t *e = anthropic_error_body(re.status, re.msg);
    assert_string_equal(json_string_value(json_object_get(e, "type")), "error");
    assert_string_equal(json_string_value(json_object_get(json_object_get(e, "error"), "type")),
                        "invalid_request_error");
    json_decref(e);
}

static void expect_bad(const char *body, const char *param, const char *needle) {
    expect_bad_with(body, false, param, needle);
}

static void test_bad_requests(void **state) {
#define U "\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]"
    expect_bad("{" U "}", "max_tokens", "required");
    expect_bad("{\"max_tokens\": 1.5, " U "}", "max_tokens", "integer");
    expect_bad("{\"max_tokens\": 4, \"temperature\": 0.5, " U "}", "temperature", "greedy");
    expect_bad("{\"max_tokens\": 4, \"top_p\": 0.9, " U "}", "top_p", "greedy");
    expect_bad("{\"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"video\"}]}]}",
               "messages", "video");
    expect_bad("{\"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"document\"}]}]}",
               "messages", "text only");
    expect_bad("{\"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": []}]}", "messages", "non-empty");
    expect_bad("{\"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", "
               "\"content\": [{\"type\": \"server_tool_use\"}]}, {\"role\": \"user\", \"content\": \"y\"}]}",
               "messages", "server_tool_use");
    expect_bad("{\"max_tokens\": 4, \"tools\": [{\"type\": \"bash_20250124\", \"name\": \"bash\"}], " U "}", "tools",
               "server tool");
    expect_bad("{\"max_tokens\": 4, \"tools\": [{\"name\": \"f\", \"input_schema\": []}], " U "}", "tools",
               "input_schema");
    expect_bad("{\"max_tokens\": 4, \"tools\": [" TOOL_A ", " TOOL_A "], " U "}", "tools", "twice");
    expect_bad("{\"max_tokens\": 4, \"tool_choice\": {\"type\": \"any\"}, " U "}", "tool_choice", "needs tools");
    expect_bad("{\"max_tokens\": 4, \"tools\": [" TOOL_A "], \"tool_choice\": {\"type\": \"auto\", "
               "\"disable_parallel_tool_use\": 1}, " U "}",
               "tool_choice", "boolean");
    expect_bad("{\"max_tokens\": 4, \"thinking\": {\"type\": \"disabled\", \"budget_tokens\": 3}, " U "}", "thinking",
               "enabled");
    expect_bad("{\"max_tokens\": 4, \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 8}, " U "}", "thinking",
               "less than max_tokens");
    expect_bad("{\"max_tokens\": 4, \"thinking\": {\"type\": \"adaptive\", \"display\": \"full\"}, " U "}", "thinking",
               "display");
    expect_bad("{\"max_tokens\": 4, \"tools\": [" TOOL_A "], \"tool_choice\": {\"type\": \"any\"}, \"output_config\": "
               "{\"format\": {\"type\": \"json_schema\", \"schema\": {\"type\": \"object\"}}}, " U "}",
               "output_config", "cannot be combined");
    expect_bad("{\"max_tokens\": 4090, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "max_tokens",
               "context");
#undef U
    // Statuses and Anthropic's error types.
    static const struct {
        int status;
        const char *type;
    } st[] = {{400, "invalid_request_error"}, {401, "authentication_error"},
              {403, "permission_error"},      {404, "not_found_error"},
              {405, "invalid_request_error"}, {413, "request_too_large"},
              {429, "rate_limit_error"},      {500, "api_error"},
              {503, "overloaded_error"}};
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
        json_t *e = anthropic_error_body(st[i].status, "m\xff"); // a message cut mid-character stays valid JSON
        char *s = json_dumps(e, 0);
        assert_non_null(s);
        assert_string_equal(json_string_value(json_object_get(json_object_get(e, "error"), "type")), st[i].type);
        free(s);
        json_decref(e);
    }
}

// ---- the sink --------------------------------------------------------------------------------------

// Every top-level field is one the API knows: others are refused, named; the inert ones pass.
// Sampling: greedy values only, unless the server samples (--allow-sampling): then temperature
// (0 to 1, as Anthropic's), top_p and top_k fill the request's sampling.
static void test_fields_and_sampling(void **state) {
#define U "\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]"
    expect_bad("{\"max_tokens\": 4, \"temprature\": 0, " U "}", NULL, "temprature: Extra inputs are not permitted");
    expect_bad("{\"max_tokens\": 4, \"min_p\": 0.1, " U "}", NULL, "min_p: Extra inputs"); // not Anthropic's
    expect_bad("{\"max_tokens\": 4, \"service_tier\": 1, " U "}", "service_tier", "a string");
    expect_bad("{\"max_tokens\": 4, \"temperature\": 0.7, " U "}", "temperature", "--allow-sampling");
    expect_bad("{\"max_tokens\": 4, \"top_k\": 40, " U "}", "top_k", "--allow-sampling");
    expect_bad_with("{\"max_tokens\": 4, \"temperature\": 1.5, " U "}", true, "temperature", "between 0 and 1");
    expect_bad_with("{\"max_tokens\": 4, \"top_k\": 40, " U "}", true, "top_k", "needs a temperature above 0");
    struct req_error re;
    static const char *const fine[] = {
        "{\"max_tokens\": 4, \"service_tier\": \"auto\", \"container\": null, \"context_management\": {\"edits\": []}, "
        "\"inference_geo\": \"us\", \"cache_control\": {\"type\": \"ephemeral\"}, \"unheard_of\": null, " U "}",
        "{\"max_tokens\": 4, \"temperature\": 0, \"top_p\": 1, \"top_k\": 1, " U "}",
    };
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
        struct job *j = parse(fine[i], &re);
        if (!j) fail_msg("%s: %s", fine[i], re.msg);
        assert_false(j->req.sampling.on);
        job_unref(j);
    }
    struct job *j =
        parse_with("{\"max_tokens\": 4, \"temperature\": 0.7, \"top_p\": 0.9, \"top_k\": 20, " U "}", true, &re);
    if (!j) fail_msg("%s", re.msg);
    const struct gen_sampling *s = &j->req.sampling;
    assert_true(s->on && s->temperature == 0.7f && s->top_p == 0.9f && s->top_k == 20 && s->min_p == 0 && !s->has_seed);
    job_unref(j);
    // count_tokens reads the same body (its sampling parameters change no count).
    struct chatreq_ctx c = ctx();
    static const char unknown[] = "{\"nope\": 1, " U "}";
    int n;
    assert_int_equal(anthropic_count_tokens(&c, unknown, strlen(unknown), &n, &re), -1);
    assert_int_equal(re.status, 400);
#undef U
}

static void test_sink(void **state) {
    static const char reasoning[] = "The user wants the weather.";
    static const char answer[] =
        "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nZ\xc3\xbcrich \"centre\"\n"
        "</parameter>\n</function>\n</tool_call>";
    const struct chatreq_ctx c = ctx();
    json_t *whole_content = NULL;
    const size_t n = sizeof answer - 1;
    for (size_t cut = 0; cut <= n; cut++)
        for (int stream = 0; stream < 2; stream++) {
            struct job *j = anthropic_job_new(&c);
            assert_non_null(j);
            j->stream = stream;
            j->req.reasoning = true;
            j->req.tools = json_loads("[" TOOL_O "]", 0, NULL);
            j->req.n_prompt = 10;
            j->n_cached = 4;
            struct gen_text t;
            gen_text_init(&t, &j->req, &j->sink);
            j->sink.begin(j->sink.ctx);
            gen_text_push(&t, reasoning, sizeof reasoning - 1, true);
            gen_text_answer(&t);
            gen_text_push(&t, answer, cut, false);
            gen_text_push(&t, answer + cut, n - cut, true);
            const int32_t ids[3] = {1, 2, 3};
            j->sink.end(j->sink.ctx,
                        &(struct gen_end){
                            .finish = GEN_FINISH_TOOL_CALLS, .ids = ids, .n_gen = 3, .n_prompt = 10, .n_cached = 4});
            gen_text_free(&t);
            json_t *content;
            if (stream) { // rebuild the blocks from the events, as a client does
                json_t *ev = sse_events(j);
                assert_non_null(ev);
                content = json_array();
                json_t *partial = json_array();
                size_t i;
                json_t *e;
                int open = -1;
                const char *last = NULL;
                json_array_foreach(ev, i, e) {
                    const char *name = json_string_value(json_object_get(e, "event"));
                    json_t *d = json_object_get(e, "data");
                    assert_string_equal(name, json_string_value(json_object_get(d, "type")));
                    int idx = (int)json_integer_value(json_object_get(d, "index"));
                    if (i == 0) assert_string_equal(name, "message_start");
                    if (!strcmp(name, "message_start")) {
                        json_t *u = json_object_get(json_object_get(d, "message"), "usage");
                        assert_int_equal(json_integer_value(json_object_get(u, "input_tokens")), 6);
                        assert_int_equal(json_integer_value(json_object_get(u, "cache_read_input_tokens")), 4);
                    } else if (!strcmp(name, "content_block_start")) {
                        assert_int_equal(open, -1);
                        assert_int_equal(idx, (int)json_array_size(content));
                        open = idx;
                        json_array_append(content, json_object_get(d, "content_block"));
                        json_array_append_new(partial, json_string(""));
                    } else if (!strcmp(name, "content_block_delta")) {
                        assert_int_equal(idx, open);
                        json_t *delta = json_object_get(d, "delta"), *b = json_array_get(content, (size_t)idx);
                        const char *dt = json_string_value(json_object_get(delta, "type"));
                        const char *field = !strcmp(dt, "text_delta")       ? "text"
                                            : !strcmp(dt, "thinking_delta") ? "thinking"
                                                                            : NULL;
                        if (field) {
                            char *s;
                            assert_true(asprintf(&s, "%s%s", json_string_value(json_object_get(b, field)),
                                                 json_string_value(json_object_get(delta, field))) > 0);
                            json_object_set_new(b, field, json_string(s));
                            free(s);
                        } else {
                            assert_string_equal(dt, "input_json_delta");
                            char *s;
                            assert_true(asprintf(&s, "%s%s", json_string_value(json_array_get(partial, (size_t)idx)),
                                                 json_string_value(json_object_get(delta, "partial_json"))) > 0);
                            json_array_set_new(partial, (size_t)idx, json_string(s));
                            free(s);
                        }
                    } else if (!strcmp(name, "content_block_stop")) {
                        assert_int_equal(idx, open);
                        json_t *b = json_array_get(content, (size_t)idx);
                        if (!strcmp(json_string_value(json_object_get(b, "type")), "tool_use"))
                            json_object_set_new(
                                b, "input",
                                json_loads(json_string_value(json_array_get(partial, (size_t)idx)), 0, NULL));
                        open = -1;
                    } else if (!strcmp(name, "message_delta")) {
                        assert_string_equal(
                            json_string_value(json_object_get(json_object_get(d, "delta"), "stop_reason")), "tool_use");
                        assert_int_equal(
                            json_integer_value(json_object_get(json_object_get(d, "usage"), "output_tokens")), 3);
                    }
                    last = name;
                }
                assert_string_equal(last, "message_stop");
                json_decref(partial);
                json_decref(ev);
            } else {
                assert_int_equal(j->status, 200);
                json_t *m = json_loads(j->out.p, 0, NULL);
                assert_non_null(m);
                assert_string_equal(json_string_value(json_object_get(m, "stop_reason")), "tool_use");
                assert_int_equal(json_integer_value(json_object_get(json_object_get(m, "usage"), "input_tokens")), 6);
                content = json_incref(json_object_get(m, "content"));
                json_decref(m);
            }
            // The ids are random: compare without them.
            json_t *b2 = json_array_get(content, 2);
            assert_int_equal(strncmp(json_string_value(json_object_get(b2, "id")), "toolu_", 6), 0);
            json_object_del(b2, "id");
            assert_int_equal(json_array_size(content), 3);
            assert_string_equal(json_string_value(json_object_get(json_array_get(content, 0), "thinking")), reasoning);
            assert_string_equal(json_string_value(json_object_get(json_array_get(content, 1), "text")),
                                "Let me check.");
            assert_string_equal(json_string_value(json_object_get(json_object_get(b2, "input"), "city")),
                                "Z\xc3\xbcrich \"centre\"");
            if (!whole_content)
                whole_content = json_incref(content);
            else if (!json_equal(whole_content, content)) {
                char *a = json_dumps(whole_content, 0), *b = json_dumps(content, 0);
                fail_msg("cut %zu, stream %d:\n%s\n%s", cut, stream, a, b);
            }
            json_decref(content);
            job_unref(j);
        }
    json_decref(whole_content);
}

static int setup(void **state) {
    char err[256];
    if (!mkdtemp(tok_dir) || synth_write_small_tokenizer(tok_dir, err, sizeof err) ||
        tokenizer_load(tok_dir, &tok, err, sizeof err)) {
        fprintf(stderr, "tokenizer: %s\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    tokenizer_free(tok);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tok_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_translation),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_fields_and_sampling),
        cmocka_unit_test(test_sink),
    };
    return cmocka_run_group_tests_name("anthropic", tests, setup, teardown);
}
