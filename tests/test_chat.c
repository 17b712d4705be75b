// test_chat.c: the Qwen3.6 chat format.  Expected strings were checked against the official
// chat_template.jinja rendered by jinja2 (400 random conversations agreed byte for byte while
// this was written); here they are spelled out so the format is readable in one place.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"

#define MSG(r, c, rs)                                                                                                  \
    { .role = r, .content = c, .reasoning = rs }

static void expect_render(const struct chat_message *m, size_t n, const struct chat_options *o, const char *want,
                          size_t want_boundary) {
    char *out, err[256];
    size_t len, boundary;
    assert_int_equal(chat_render(m, n, o, &out, &len, &boundary, err, sizeof err), 0);
    assert_string_equal(out, want);
    assert_int_equal(len, strlen(want));
    assert_int_equal(boundary, want_boundary);
    free(out);
}

static void test_single_turn(void **state) {
    struct chat_message m[] = {MSG("system", "You are helpful.", NULL), MSG("user", "  What is 2+2?\n", NULL)};
    const char *head = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n";
    size_t b = strlen("<|im_start|>system\nYou are helpful.<|im_end|>\n");
    char want[512];
    snprintf(want, sizeof want, "%s<|im_start|>assistant\n<think>\n", head);
    expect_render(m, 2, NULL, want, b); // defaults: thinking on
    struct chat_options off = {.enable_thinking = 0, .add_generation_prompt = 1};
    snprintf(want, sizeof want, "%s<|im_start|>assistant\n<think>\n\n</think>\n\n", head);
    expect_render(m, 2, &off, want, b);
    struct chat_options none = {.enable_thinking = 1};
    expect_render(m, 2, &none, head, b);
    expect_render(m + 1, 1, NULL, "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n", 0);
}

static void test_multi_turn(void **state) {
    struct chat_message m[] = {
        MSG("user", "Hi", NULL),
        MSG("assistant", "<think>\nthe user greets\n</think>\n\nHello!", NULL), // reasoning inline
        MSG("user", "Name?", NULL),
        MSG("assistant", "Calla.", "  asked for a name "), // reasoning given apart
        MSG("user", "Bye", NULL),
    };
    const char *dropped =
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nName?<|im_end|>\n"
        "<|im_start|>assistant\nCalla.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n<think>\n";
    size_t b = strlen(dropped) - strlen("<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n<think>\n");
    expect_render(m, 5, NULL, dropped, b);
    struct chat_options keep = {.enable_thinking = 1, .preserve_thinking = 1, .add_generation_prompt = 1};
    const char *kept = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nthe user "
                       "greets\n</think>\n\nHello!<|im_end|>\n"
                       "<|im_start|>user\nName?<|im_end|>\n<|im_start|>assistant\n<think>\nasked for a "
                       "name\n</think>\n\nCalla.<|im_end|>\n"
                       "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n<think>\n";
    b = strlen(kept) - strlen("<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n<think>\n");
    expect_render(m, 5, &keep, kept, b);
}

// Turns after the last real user query (a tool loop) keep their reasoning.
static void test_tool_loop(void **state) {
    struct chat_message m[] = {
        MSG("user", "Weather?", NULL),
        MSG("assistant", "<tool_call>\n<function=weather>\n</function>\n</tool_call>", "need the tool"),
        MSG("tool", "{\"t\": 21}", NULL),
        MSG("tool", "{\"h\": 40}", NULL),
    };
    const char *want =
        "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<think>\nneed the tool\n</think>\n\n"
        "<tool_call>\n<function=weather>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n{\"t\": 21}\n</tool_response>\n<tool_response>\n{\"h\": "
        "40}\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n<think>\n";
    expect_render(m, 4, NULL, want, strstr(want, "\n<tool_response>\n{\"h\"") - want);
}

// A continuation after a rendered assistant turn: the rendered turn (minus its closing newline)
// followed by the continuation is the whole conversation rendered at once (reasoning kept).
static void test_after_turn(void **state) {
    struct chat_message m[] = {
        MSG("system", "s", NULL),
        MSG("user", "Weather?", NULL),
        MSG("assistant", "<tool_call>\n<function=weather>\n</function>\n</tool_call>", "need the tool"),
        MSG("tool", "{\"t\": 21}", NULL),
        MSG("tool", "{\"h\": 40}", NULL),
        MSG("assistant", "21 degrees.", "done"),
        MSG("user", "Thanks", NULL),
    };
    struct chat_options keep = {.enable_thinking = 1, .preserve_thinking = 1, .add_generation_prompt = 1};
    struct chat_options hist = keep, cont = keep;
    hist.add_generation_prompt = 0;
    cont.after_turn = 1;
    char *whole, *head, *tail, err[256];
    size_t wl, hl, tl, b;
    assert_int_equal(chat_render(m, 7, &keep, &whole, &wl, NULL, err, sizeof err), 0);
    for (size_t k = 3; k <= 6; k += 3) { // after each assistant turn
        assert_int_equal(chat_render(m, k, &hist, &head, &hl, NULL, err, sizeof err), 0);
        assert_int_equal(chat_render(m + k, 7 - k, &cont, &tail, &tl, &b, err, sizeof err), 0);
        assert_true(hl > 0 && head[hl - 1] == '\n');
        assert_int_equal(hl - 1 + tl, wl);
        assert_memory_equal(whole, head, hl - 1);
        assert_string_equal(whole + hl - 1, tail);
        free(head), free(tail);
    }
    free(whole);
    // No system message in a continuation; no user query needed.
    assert_int_equal(chat_render(m, 1, &cont, &tail, &tl, NULL, err, sizeof err), -1);
    assert_int_equal(chat_render(m + 3, 1, &cont, &tail, &tl, NULL, err, sizeof err), 0);
    assert_string_equal(tail, "\n<|im_start|>user\n<tool_response>\n{\"t\": 21}\n</tool_response><|im_end|>\n"
                              "<|im_start|>assistant\n<think>\n");
    free(tail);
}

static void test_errors(void **state) {
    char *out = (char *)1, err[256];
    size_t len;
    struct chat_message bad_role[] = {MSG("user", "a", NULL), MSG("robot", "b", NULL)};
    assert_int_equal(chat_render(bad_role, 2, NULL, &out, &len, NULL, err, sizeof err), -1);
    assert_null(out);
    assert_non_null(strstr(err, "robot"));
    struct chat_message null_role[] = {MSG(NULL, "a", NULL)};
    assert_int_equal(chat_render(null_role, 1, NULL, &out, &len, NULL, err, sizeof err), -1);
    struct chat_message late_system[] = {MSG("user", "a", NULL), MSG("system", "b", NULL)};
    assert_int_equal(chat_render(late_system, 2, NULL, &out, &len, NULL, err, sizeof err), -1);
    struct chat_message no_query[] = {MSG("system", "s", NULL), MSG("user", "<tool_response>x</tool_response>", NULL)};
    assert_int_equal(chat_render(no_query, 2, NULL, &out, &len, NULL, err, sizeof err), -1);
    assert_int_equal(chat_render(NULL, 0, NULL, &out, &len, NULL, err, sizeof err), -1);
}

static void test_stop_ids(void **state) {
    assert_true(chat_is_stop(248046));
    assert_true(chat_is_stop(248044));
    assert_false(chat_is_stop(248045));
    assert_int_equal(chat_stop_ids[0], 248046);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_turn), cmocka_unit_test(test_multi_turn), cmocka_unit_test(test_tool_loop),
        cmocka_unit_test(test_errors),      cmocka_unit_test(test_stop_ids),   cmocka_unit_test(test_after_turn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
