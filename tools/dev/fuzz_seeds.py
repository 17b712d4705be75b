#!/usr/bin/env python3
"""Seed corpora for the server's fuzz targets (tools/dev/fuzz.sh): the requests, schemas and model
outputs of the tests (tests/test_server.py's BAD and SCHEMAS, tests/test_agent_apis.py's cases,
tests/test_openai.c's outputs).
usage: tools/dev/fuzz_seeds.py OUT_DIR  (writes OUT_DIR/corpus-{openai,toolcall,constrain}/seed-*)"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
import test_server  # noqa: E402  (definitions only; its main() runs under __main__)

out = sys.argv[1]


def write(target, i, data):
    with open(os.path.join(out, f"corpus-{target}", f"seed-{i:03d}"), "wb") as f:
        f.write(data)


def enc(v):
    return v if isinstance(v, bytes) else json.dumps(v, ensure_ascii=False).encode()


MSG = [{"role": "user", "content": "What is the weather in Bern?"}]
TOOLS = [test_server.TOOL, {"type": "function", "function": {"name": "now"}}]
GOOD = [
    {"messages": MSG, "max_tokens": 4},
    {"messages": [{"role": "system", "content": "Be brief."}] + MSG, "stream": True, "stop": ["\n", "x"]},
    {"messages": MSG, "tools": TOOLS, "tool_choice": "auto"},
    {"messages": MSG, "tools": TOOLS, "tool_choice": "required"},
    {"messages": MSG, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    {"messages": MSG + [{"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Bern\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}], "tools": TOOLS},
    {"messages": MSG, "logprobs": True, "top_logprobs": 3, "max_completion_tokens": 5},
    {"messages": MSG, "response_format": {"type": "json_object"}},
    {"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {"name": "w", "strict": True,
     "schema": test_server.SCHEMAS[8]}}},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "chat_template_kwargs":
     {"enable_thinking": False}, "user": "session-1"},
    {"prompt": "Once upon a time", "max_tokens": 3, "logprobs": 2, "echo": False},
    {"prompt": [1, 2, 3], "max_tokens": 1},
]
i = 0
for body in GOOD:
    # The first byte picks the endpoint (fuzz_openai.c): even chat, odd completions.
    write("openai", i, (b"\1" if "prompt" in body else b"\0") + enc(body)); i += 1
for name, path, body, *_ in test_server.BAD:
    write("openai", i, (b"\0" if path == "chat" else b"\1") + enc(body)); i += 1
# Anthropic's messages (first byte 2) and the Responses API (3): tests/test_agent_apis.py's cases.
import test_agent_apis  # noqa: E402
AGENT_GOOD = [
    (2, test_agent_apis.MSG_OK),
    (2, dict(test_agent_apis.MSG_OK, system=[{"type": "text", "text": "s"}], stream=True, stop_sequences=["x"],
             thinking={"type": "enabled", "budget_tokens": 2}, max_tokens=8,
             tools=[{"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}],
             tool_choice={"type": "any"}, metadata={"user_id": "u"},
             messages=MSG + [{"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": ""},
                                                              {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "2"}]}])),
    (3, test_agent_apis.RESP_OK),
    (3, dict(test_agent_apis.RESP_OK, instructions="i", previous_response_id="resp_fuzz", tools=[
        {"type": "function", "name": "f", "parameters": {"type": "object"}}], tool_choice="required",
        input=[{"role": "developer", "content": "d"}, {"type": "function_call", "call_id": "c", "name": "f",
                                                       "arguments": "{}"},
               {"type": "function_call_output", "call_id": "c", "output": "o"},
               {"type": "reasoning", "summary": [{"type": "summary_text", "text": "r"}]}])),
    (3, dict(test_agent_apis.RESP_OK, text={"format": {"type": "json_schema", "name": "n",
                                                       "schema": test_server.SCHEMAS[8]}})),
]
for ep, body in AGENT_GOOD:
    write("openai", i, bytes([ep]) + enc(body)); i += 1
for ep, cases in ((2, test_agent_apis.MSG_BAD), (3, test_agent_apis.RESP_BAD)):
    for name, body, *_ in cases:
        write("openai", i, bytes([ep]) + enc(body)); i += 1

DOCS = [b'{"name":"x","age":3}', b'{"ok":true}', b'{"a":[1,2.5e-3,-0,"x\\n\\u00e9"],"b":{"c":null}}',
        b'{"v":"n","next":{"next":null,"v":"n"}}', b"<tool_call>\n<function=get_weather>\n<parameter=city>\nBern\n"
        b"</parameter>\n</function>\n</tool_call>"]
for i, s in enumerate(test_server.SCHEMAS):
    write("constrain", i, enc(s) + b"\0" + DOCS[i % len(DOCS)])
write("constrain", 100, b"\0" + DOCS[2])   # no schema: json_object
write("constrain", 101, enc(TOOLS) + b"\0" + DOCS[4])
# A tool with a parameter of each schema form (text, nullable text, JSON) and a complete call of it.
TYPED = {"type": "object", "properties": {k: v[0] for k, v in test_server.TYPED_PARAMS.items()},
         "required": ["unit", "maybe", "maybe_unit", "ref", "size"], "$defs": {"unit": {"enum": test_server.UNITS}}}
write("constrain", 102, enc([{"type": "function", "function": {"name": "typed", "parameters": TYPED}}]) + b"\0"
      + b"<tool_call>\n<function=typed>\n<parameter=unit>\nc\n</parameter>\n<parameter=maybe>\nnull\n</parameter>\n"
      b"<parameter=maybe_unit>\nf\n</parameter>\n<parameter=ref>\nc\n</parameter>\n<parameter=size>\n12\n</parameter>\n"
      b"</function>\n</tool_call>")

OUTPUTS = [
    "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\na\nb\n</parameter>\n<parameter=metric>\ntrue\n"
    "</parameter>\n<parameter=opts>\n{\"x\": [1, 2]}\n</parameter>\n<parameter=code>\n42\n</parameter>\n"
    "<parameter=unit>\nc\n</parameter>\n<parameter=tags>\nnull\n</parameter>\n</function>\n</tool_call>\n"
    "<tool_call>\n<function=now>\n</function>\n</tool_call>",
    "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n<parameter=extra>\n1\n"
    "</parameter>\n</function>\n</tool_call>",
    "Hello <tool world> a < b\n\n", "ends with <tool_c",
    "x <tool_call>\n<function=unknown_fn>\n</function>\n</tool_call>",
    "<tool_call>\n<function=now>\n</function>\n", "<tool_call>garbage</tool_call>",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nx\n</function>\n</tool_call>",
    "<tool_call>\n<function=now>\n</function>\n</tool_call>\nDone.",
    "<tool_call>\n<function=f>\n<parameter=s>\na < b\nc\n</parameter>\n<parameter=n>\n-3\n</parameter>\n"
    "</function>\n</tool_call>",
]
for i, s in enumerate(OUTPUTS):
    # The first byte: how many cut lengths follow (fuzz_toolcall.c); none, then a few.
    write("toolcall", 2 * i, b"\0" + s.encode())
    write("toolcall", 2 * i + 1, b"\5\1\3\7\2\11" + s.encode())
