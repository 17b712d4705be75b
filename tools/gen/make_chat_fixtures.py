#!/usr/bin/env python3
"""make_chat_fixtures.py: renders chat requests with tools through the official Qwen3.6
chat_template.jinja (jinja2, set up as Hugging Face transformers does: trim_blocks, lstrip_blocks,
its tojson = json.dumps(ensure_ascii=False)) and writes them as fixtures for tests/test_openai.c.

    python3 tools/gen/make_chat_fixtures.py --template chat_template.jinja --out tests/data/chat/tools.jsonl

The template is not kept in this repository: take chat_template.jinja from the model's Hugging Face
repository (Qwen/Qwen3.6-35B-A3B).  Each output line is {"name", "request", "expected"}: request is
the OpenAI request body as a client sends it (tool_calls arguments as JSON strings, which are
parsed into objects before rendering, as servers do).
"""
import argparse
import copy
import json
import random

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


def render(template, req):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    msgs = copy.deepcopy(req["messages"])
    for m in msgs:
        for tc in m.get("tool_calls") or []:
            a = tc["function"].get("arguments")
            if isinstance(a, str):
                tc["function"]["arguments"] = json.loads(a)
    kw = dict(req.get("chat_template_kwargs", {}))
    tools = req.get("tools")
    if req.get("tool_choice") == "none":
        tools = None
    return env.from_string(template).render(messages=msgs, tools=tools, add_generation_prompt=True, **kw)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "days": {"type": "integer"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city"], "additionalProperties": False}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web \"quoted\" \\ back\\slash\ttab",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "limit": {"type": "number", "minimum": 0.5, "maximum": 1e3},
        "filters": {"type": "object", "properties": {"site": {"type": "string"}, "safe": {"type": "boolean"}}},
        "tags": {"type": "array", "items": {"type": "string"}}, "nothing": {"type": "null"}},
        "required": ["query"]}}}
NOPARAMS = {"type": "function", "function": {"name": "now"}}


def call(i, name, args):
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def cases():
    out = []
    u = {"role": "user", "content": "What's the weather in Zürich?"}
    out.append(("tools, no system", {"messages": [u], "tools": [WEATHER]}))
    out.append(("tools + system", {"messages": [{"role": "system", "content": "  Be brief.\n"}, u],
                                   "tools": [WEATHER, SEARCH, NOPARAMS]}))
    out.append(("tools + empty system", {"messages": [{"role": "system", "content": " "}, u], "tools": [WEATHER]}))
    out.append(("tools, thinking off", {"messages": [u], "tools": [SEARCH],
                                        "chat_template_kwargs": {"enable_thinking": False}}))
    out.append(("tool_choice none drops the tools", {"messages": [u], "tools": [WEATHER], "tool_choice": "none"}))
    a1 = {"role": "assistant", "content": None, "tool_calls": [call(1, "get_weather", {"city": "Zürich", "days": 3})]}
    t1 = {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21.5}"}
    out.append(("tool loop: call, response", {"messages": [u, a1, t1], "tools": [WEATHER]}))
    a2 = {"role": "assistant", "content": "Let me look.", "reasoning_content": "need data",
          "tool_calls": [call(2, "search", {"query": "a\nb", "limit": 2.5, "filters": {"site": "x.org", "safe": True},
                                            "tags": ["α", "β"], "nothing": None}),
                         call(3, "get_weather", {"city": "Bern"})]}
    out.append(("two calls with content, typed values", {"messages": [u, a2, t1, dict(t1, content="ok")],
                                                        "tools": [WEATHER, SEARCH]}))
    out.append(("tool loop continues after the answer",
                {"messages": [u, a1, t1, {"role": "assistant", "content": "It is 21.5 degrees."},
                              {"role": "user", "content": "And tomorrow?"}], "tools": [WEATHER]}))
    out.append(("preserve_thinking with calls",
                {"messages": [u, dict(a2, content="  "), t1], "tools": [WEATHER, SEARCH],
                 "chat_template_kwargs": {"preserve_thinking": True}}))
    out.append(("call without arguments", {"messages": [u, {"role": "assistant", "content": "",
                                                           "tool_calls": [call(4, "now", {})]}, t1],
                                          "tools": [NOPARAMS]}))
    out.append(("calls in history, no tools given", {"messages": [u, a1, t1]}))
    rng = random.Random(7)
    words = ["alpha", "Zürich", "日本", "x\"y", "back\\slash", "tab\there", "line\nbreak", "", "0", "3.25", "true"]
    for k in range(12):
        msgs = [{"role": "system", "content": rng.choice(words)}] if rng.random() < 0.5 else []
        msgs.append({"role": "user", "content": " ".join(rng.sample(words, 3))})
        for t in range(rng.randint(0, 2)):
            args = {}
            for p in rng.sample(["city", "days", "unit", "query", "limit", "filters", "tags"], rng.randint(0, 3)):
                args[p] = rng.choice([rng.choice(words), rng.randint(-5, 10 ** 6), rng.random() * 100, True, False,
                                      None, [1, "two", 3.5], {"k": rng.choice(words), "n": [True]}])
            msgs.append({"role": "assistant", "content": rng.choice([None, "", "Sure.", "<think>\nhm\n</think>\n\nok"]),
                         "tool_calls": [call(10 * k + t, rng.choice(["get_weather", "search"]), args)]})
            for r in range(rng.randint(1, 2)):
                msgs.append({"role": "tool", "tool_call_id": f"call_{10 * k + t}", "content": rng.choice(words) or "x"})
            if rng.random() < 0.4:
                msgs.append({"role": "assistant", "content": rng.choice(words)})
                msgs.append({"role": "user", "content": rng.choice(words) or "q"})
        kw = {"enable_thinking": rng.random() < 0.7}
        if rng.random() < 0.3:
            kw["preserve_thinking"] = True
        out.append((f"random {k}", {"messages": msgs, "tools": rng.sample([WEATHER, SEARCH, NOPARAMS], rng.randint(1, 3)),
                                    "chat_template_kwargs": kw}))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--template", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    template = open(a.template, encoding="utf-8").read()
    with open(a.out, "w", encoding="utf-8") as f:
        for name, req in cases():
            f.write(json.dumps({"name": name, "request": req, "expected": render(template, req)}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
