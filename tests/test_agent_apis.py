#!/usr/bin/env python3
"""test_agent_apis.py: the APIs coding agents speak, end to end on loopback, with the official clients:
Anthropic's Messages API (/v1/messages, Claude Code) through the `anthropic` package and OpenAI's
Responses API (/v1/responses, Codex) through the `openai` package, against `calla serve` on a
test-geometry checkpoint.

Run by build/tests/test_server (tests/test_server.c), which makes the checkpoint; by hand:
    python3 tests/test_agent_apis.py --bin build/calla --model DIR [--quick]

The model has random weights, so the text is gibberish: the checks are about the protocols (what
the clients parse, the event sequences, the stream equal to the whole answer), forced tool calls
and structured output (valid by construction, checked with jsonschema), the session cache through
previous_response_id, auth, and hostile input (a clear 4xx in each API's shape, never a crash).
Every request has a timeout; only 127.0.0.1 is contacted.  Exit status 0 only if every check passed.
"""
import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_server import HOST, RESULTS, FAILURES, Server, check, request  # noqa: E402

KEY = "sk-agent-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
WEATHER = {"type": "object", "properties": {"days": {"type": "integer"}, "metric": {"type": "boolean"}},
           "required": ["days", "metric"]}


def post(port, path, body, headers=None):
    st, h, b = request(port, "POST", path, body, headers=dict(AUTH, **(headers or {})))
    try:
        return st, h, json.loads(b)
    except ValueError:
        return st, h, None


def sse(port, path, body, headers=None):
    """A streamed POST -> (status, [(event name, data)])."""
    import http.client
    c = http.client.HTTPConnection(HOST, port, timeout=120)
    try:
        c.request("POST", path, body=json.dumps(dict(body, stream=True)).encode(),
                  headers=dict({"Content-Type": "application/json"}, **AUTH, **(headers or {})))
        r = c.getresponse()
        text = r.read().decode()
        out, name = [], None
        for line in text.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[6:])))
                name = None
        return r.status, out
    finally:
        c.close()


def anthropic_error(b, etype):
    return isinstance(b, dict) and b.get("type") == "error" and b.get("error", {}).get("type") == etype \
        and isinstance(b["error"].get("message"), str)


def openai_error(b):
    return isinstance(b, dict) and isinstance(b.get("error"), dict) and isinstance(b["error"].get("message"), str)


# ---- Anthropic's Messages API ----------------------------------------------------------------------

def test_messages(port, anthropic, jsonschema):
    cl = anthropic.Anthropic(base_url=f"http://{HOST}:{port}", api_key=KEY, max_retries=0, timeout=120)
    msgs = [{"role": "user", "content": "Say hello."}]
    m = cl.messages.create(model="calla", max_tokens=6, messages=msgs)
    check("messages: create -> a message with a text block, max_tokens, usage",
          m.id.startswith("msg_") and m.role == "assistant" and m.content and m.content[0].type == "text"
          and m.stop_reason == "max_tokens" and m.usage.output_tokens == 6 and m.usage.input_tokens > 0, m)
    with cl.messages.stream(model="calla", max_tokens=6, messages=msgs) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    check("messages: streamed text == the whole message's (same request, greedy)",
          text == m.content[0].text == final.content[0].text and final.stop_reason == "max_tokens", (text, m, final))
    st, ev = sse(port, "/v1/messages", {"model": "calla", "max_tokens": 6, "messages": msgs})
    names = [n for n, _ in ev if n != "ping"]
    ok = st == 200 and names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    ok = ok and names.count("content_block_start") == names.count("content_block_stop") >= 1
    ok = ok and all(n == d["type"] for n, d in ev)
    check("messages: the event sequence (message_start ... message_delta, message_stop; blocks opened and closed)",
          ok, names)

    # Thinking with a budget: the thinking block is closed when the budget is spent, the answer follows.
    m = cl.messages.create(model="calla", max_tokens=12, messages=msgs,
                           thinking={"type": "enabled", "budget_tokens": 4})
    kinds = [b.type for b in m.content]
    check("messages: thinking budget_tokens 4 of max_tokens 12 -> a thinking block, then text",
          kinds[:1] == ["thinking"] and "text" in kinds and m.content[0].thinking, m)
    st, ev = sse(port, "/v1/messages", {"model": "calla", "max_tokens": 12, "messages": msgs,
                                        "thinking": {"type": "enabled", "budget_tokens": 4}})
    deltas = [d["delta"]["type"] for n, d in ev if n == "content_block_delta"]
    check("messages: streamed thinking_delta then text_delta", "thinking_delta" in deltas and "text_delta" in deltas
          and deltas.index("thinking_delta") < deltas.index("text_delta"), deltas)
    m2 = cl.messages.create(model="calla", max_tokens=6, messages=msgs, thinking={"type": "disabled"})
    check("messages: thinking disabled (and absent): no thinking block",
          all(b.type != "thinking" for b in m2.content) and m2.usage.input_tokens + (m2.usage.cache_read_input_tokens or 0)
          == cl.messages.count_tokens(model="calla", messages=msgs).input_tokens, m2)

    # count_tokens: the prompt a generation of the same body counts (input read anew + read from the cache).
    body = {"model": "calla", "system": "You count.", "messages": [{"role": "user", "content": f"count {time.time()}"}]}
    n = cl.messages.count_tokens(**body).input_tokens
    m = cl.messages.create(max_tokens=1, **body)
    check("messages: count_tokens == usage.input_tokens + cache_read_input_tokens",
          n == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 0, (n, m.usage))
    m = cl.messages.create(max_tokens=1, **body)
    check("messages: the same prompt again is read from the session cache (cache_read_input_tokens > 0)",
          (m.usage.cache_read_input_tokens or 0) > 0 and m.usage.input_tokens + m.usage.cache_read_input_tokens == n,
          m.usage)

    # A forced tool call -> parsed by the SDK -> its result sent back -> an answer.
    tools = [{"name": "get_weather", "description": "Weather forecast", "input_schema": WEATHER},
             {"name": "now", "description": "The time", "input_schema": {"type": "object", "properties": {}}}]
    ask = [{"role": "user", "content": "Weather in Bern for 3 days?"}]
    m = cl.messages.create(model="calla", max_tokens=60, messages=ask, tools=tools,
                           tool_choice={"type": "tool", "name": "get_weather"})
    use = [b for b in m.content if b.type == "tool_use"]
    ok = m.stop_reason == "tool_use" and len(use) == 1 and use[0].name == "get_weather" and use[0].id.startswith("toolu_")
    try:
        jsonschema.validate(use[0].input, WEATHER)
    except Exception as e:  # noqa: BLE001
        ok, m = False, (m, repr(e))
    check("messages: tool_choice tool -> one tool_use whose input validates against input_schema", ok, m)
    if ok:
        back = ask + [{"role": "assistant", "content": [b.model_dump() for b in m.content]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id,
                                                    "content": "Sunny, 21 degrees."}]}]
        r = cl.messages.create(model="calla", max_tokens=4, messages=back, tools=tools)
        check("messages: the tool result sent back -> an answer", r.stop_reason in ("end_turn", "max_tokens", "tool_use")
              and r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) > m.usage.input_tokens, r)
        r = cl.messages.create(model="calla", max_tokens=4, messages=back[:2] + [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use[0].id, "is_error": True,
             "content": [{"type": "text", "text": "no network"}]}, {"type": "text", "text": "Try again?"}]}], tools=tools)
        check("messages: an error tool_result (blocks) and text in one user message", r.stop_reason is not None, r)
    with cl.messages.stream(model="calla", max_tokens=60, messages=ask, tools=tools,
                            tool_choice={"type": "tool", "name": "get_weather"}) as s:
        events = list(s)
        final = s.get_final_message()
    parts = [e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    fuse = [b for b in final.content if b.type == "tool_use"]
    check("messages: the forced call streamed as input_json_delta pieces, joined == the whole call's input",
          len(parts) >= 2 and ok and fuse and fuse[0].input == use[0].input
          and json.loads("".join(parts)) == use[0].input, (parts, final))
    m = cl.messages.create(model="calla", max_tokens=60, messages=ask, tools=tools, tool_choice={"type": "any"},
                           thinking={"type": "enabled", "budget_tokens": 4})
    kinds = [b.type for b in m.content]
    check("messages: tool_choice any with a thinking budget: thinking, then one call",
          kinds[0] == "thinking" and kinds.count("tool_use") == 1 and m.stop_reason == "tool_use", m)

    # Stop sequences: a piece of a known answer stops it there.
    m = cl.messages.create(model="calla", max_tokens=8, messages=msgs)
    t = m.content[0].text
    stop = t[len(t) // 2:len(t) // 2 + 3] if len(t) > 6 else None
    if stop and stop.strip():
        r = cl.messages.create(model="calla", max_tokens=8, messages=msgs, stop_sequences=[stop])
        check("messages: stop_sequences -> stop_reason stop_sequence, the sequence named, the text cut before it",
              r.stop_reason == "stop_sequence" and r.stop_sequence == stop and stop not in "".join(
                  b.text for b in r.content if b.type == "text"), (stop, r))

    # Sampling: greedy only; auth: x-api-key or Bearer; the session key mirrored.
    try:
        cl.messages.create(model="calla", max_tokens=2, messages=msgs, extra_body={"temperature": 0.7})
        check("messages: temperature 0.7 -> 400", False)
    except anthropic.BadRequestError as e:
        check("messages: temperature 0.7 -> 400 invalid_request_error naming temperature",
              anthropic_error(e.body, "invalid_request_error") and "temperature" in e.body["error"]["message"], e.body)
    try:
        anthropic.Anthropic(base_url=f"http://{HOST}:{port}", api_key="wrong", max_retries=0).messages.create(
            model="calla", max_tokens=1, messages=msgs)
        check("messages: a wrong key -> AuthenticationError", False)
    except anthropic.AuthenticationError as e:
        check("messages: a wrong key -> 401 authentication_error in Anthropic's shape",
              anthropic_error(e.body, "authentication_error"), e.body)
    body = {"model": "calla", "max_tokens": 1, "messages": msgs, "metadata": {"user_id": "agent-7"}}
    for name, h in (("x-api-key", {"x-api-key": KEY}), ("Bearer", AUTH)):
        st, hd, b = request(port, "POST", "/v1/messages", body, headers=dict(h, **{"anthropic-version": "2023-06-01"}))
        check(f"messages: the key as {name}, anthropic-version accepted; metadata.user_id mirrored as X-Session-Id",
              st == 200 and hd.get("x-session-id") == "agent-7", (st, hd, b[:200]))
    st, _, b = request(port, "POST", "/v1/messages", body)
    check("messages: no key -> 401 in Anthropic's shape", st == 401 and anthropic_error(json.loads(b), "authentication_error"), b)
    st, _, b = request(port, "POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 1}, headers={"x-api-key": KEY})
    check("chat completions: x-api-key is not a key there (Bearer only)", st == 401 and openai_error(json.loads(b)), b)


# ---- OpenAI's Responses API --------------------------------------------------------------------------

def test_responses(port, openai, jsonschema):
    cl = openai.OpenAI(base_url=f"http://{HOST}:{port}/v1", api_key=KEY, max_retries=0, timeout=120)
    off = {"effort": "none"}
    r = cl.responses.create(model="calla", input="Say hello.", max_output_tokens=6, reasoning=off)
    check("responses: create -> a message item, incomplete at max_output_tokens, usage",
          r.id.startswith("resp_") and r.output and r.output[0].type == "message" and r.output_text
          and r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
          and r.usage.output_tokens == 6 and r.usage.input_tokens > 0, r)
    events = list(cl.responses.create(model="calla", input="Say hello.", max_output_tokens=6, reasoning=off, stream=True))
    types = [e.type for e in events]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    ok = types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.incomplete"
    ok = ok and types.count("response.output_item.added") == types.count("response.output_item.done") >= 1
    ok = ok and "response.content_part.added" in types and [e.sequence_number for e in events] == list(range(len(events)))
    check("responses: the event sequence (created, in_progress, item added / part added / deltas / done, incomplete)",
          ok, types)
    check("responses: streamed text == the whole response's", text == r.output_text
          and events[-1].response.output_text == r.output_text, (text, r.output_text))
    r2 = cl.responses.create(model="calla", input="Say hello.", max_output_tokens=6)
    check("responses: reasoning on (the default): a reasoning item with its text first",
          r2.output[0].type == "reasoning" and r2.output[0].content and r2.output[0].content[0].text
          and r2.usage.output_tokens_details.reasoning_tokens > 0, r2)

    # A forced call -> parsed by the SDK -> its output sent back by previous_response_id: the session
    # cache holds the first turn, so the second prefills only what is new.
    tools = [{"type": "function", "name": "get_weather", "description": "Weather forecast", "parameters": WEATHER},
             {"type": "function", "name": "now", "parameters": {"type": "object", "properties": {}}}]
    ask = "Weather in Bern for 3 days?"
    r = cl.responses.create(model="calla", input=ask, tools=tools, tool_choice="required", max_output_tokens=60,
                            reasoning=off)
    calls = [o for o in r.output if o.type == "function_call"]
    ok = r.status == "completed" and len(calls) == 1 and calls[0].call_id.startswith("call_")
    try:
        args = json.loads(calls[0].arguments)
        jsonschema.validate(args, {"get_weather": WEATHER, "now": tools[1]["parameters"]}[calls[0].name])
    except Exception as e:  # noqa: BLE001
        ok, r = False, (r, repr(e))
    check("responses: tool_choice required -> one function_call whose arguments validate", ok, r)
    if ok:
        r2 = cl.responses.create(model="calla", previous_response_id=r.id, tools=tools, max_output_tokens=4, reasoning=off,
                                 input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "21 C"}])
        cached = r2.usage.input_tokens_details.cached_tokens
        check("responses: previous_response_id continues the stored turn: cached_tokens = its prompt + output - 1",
              cached == r.usage.input_tokens + r.usage.output_tokens - 1 and r2.usage.input_tokens > cached,
              (r.usage, r2.usage))
        full = [{"role": "user", "content": ask}, {"type": "function_call", "call_id": calls[0].call_id,
                                                   "name": calls[0].name, "arguments": calls[0].arguments},
                {"type": "function_call_output", "call_id": calls[0].call_id, "output": "21 C"}]
        r3 = cl.responses.create(model="calla", input=full, tools=tools, max_output_tokens=4, reasoning=off, store=False)
        check("responses: the whole history as items instead (store false): answered",
              r3.status in ("completed", "incomplete") and r3.usage.input_tokens > r.usage.input_tokens, r3)
        try:
            cl.responses.retrieve(r3.id)
            check("responses: store false -> not retrievable", False)
        except openai.NotFoundError:
            check("responses: store false -> not retrievable (404)", True)
    with cl.responses.stream(model="calla", input=ask, tools=tools, tool_choice={"type": "function", "name": "get_weather"},
                             max_output_tokens=60, reasoning=off) as s:
        events = list(s)
        final = s.get_final_response()
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    fcalls = [o for o in final.output if o.type == "function_call"]
    check("responses: a named forced call streamed: argument deltas joined == .done == the final item",
          len(deltas) >= 2 and done and "".join(deltas) == done[0].arguments == fcalls[0].arguments
          and isinstance(json.loads(fcalls[0].arguments)["metric"], bool), (deltas, final))

    # Structured output: text.format json_schema, valid by construction.
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                               "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
              "required": ["name", "age", "tags"], "additionalProperties": False}
    r = cl.responses.create(model="calla", input="A person as JSON.", max_output_tokens=60, reasoning=off,
                            text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}})
    try:
        jsonschema.validate(json.loads(r.output_text), schema)
        ok = r.status == "completed"
    except Exception as e:  # noqa: BLE001
        ok, r = False, (r, repr(e))
    check("responses: text.format json_schema -> output_text validates against the schema", ok, r)

    # The store: previous_response_id on a plain turn, retrieve, delete.
    a = cl.responses.create(model="calla", instructions="Be brief.", input="Turn one.", max_output_tokens=4, reasoning=off)
    b = cl.responses.create(model="calla", instructions="Be brief.", previous_response_id=a.id, input="Turn two.",
                            max_output_tokens=4, reasoning=off)
    check("responses: a second turn by previous_response_id reports cached_tokens > 0",
          b.usage.input_tokens_details.cached_tokens > 0 and b.previous_response_id == a.id, b.usage)
    got = cl.responses.retrieve(a.id)
    check("responses: GET /v1/responses/{id} returns the stored response", got.id == a.id and got.output_text == a.output_text)
    d = cl.responses.delete(a.id)
    try:
        cl.responses.retrieve(a.id)
        check("responses: DELETE, then GET -> 404", False)
    except openai.NotFoundError:
        check("responses: DELETE, then GET -> 404", d is None)
    for what, call in (("unknown previous_response_id", lambda: cl.responses.create(
            model="calla", input="x", previous_response_id="resp_nope", max_output_tokens=1)),
                       ("GET of an unknown id", lambda: cl.responses.retrieve("resp_nope"))):
        try:
            call()
            check(f"responses: {what} -> NotFoundError", False)
        except openai.NotFoundError as e:
            check(f"responses: {what} -> 404 in OpenAI's shape", isinstance(e.body, dict) and "message" in e.body, e.body)

    # Refusals: parallel calls that the forced grammar cannot make, sampling, the key.
    try:
        cl.responses.create(model="calla", input=ask, tools=tools, tool_choice="required", parallel_tool_calls=True,
                            max_output_tokens=60)
        check("responses: parallel_tool_calls true with tool_choice required -> 400", False)
    except openai.BadRequestError as e:
        check("responses: parallel_tool_calls true with tool_choice required -> 400 naming it, saying why",
              e.body.get("param") == "parallel_tool_calls" and "exactly one" in e.body.get("message", ""), e.body)
    try:
        cl.responses.create(model="calla", input="x", temperature=0.5, max_output_tokens=1)
        check("responses: temperature 0.5 -> 400", False)
    except openai.BadRequestError as e:
        check("responses: temperature 0.5 -> 400 naming temperature", e.body.get("param") == "temperature", e.body)
    try:
        openai.OpenAI(base_url=f"http://{HOST}:{port}/v1", api_key="wrong", max_retries=0).responses.create(
            model="calla", input="x", max_output_tokens=1)
        check("responses: a wrong key -> AuthenticationError", False)
    except openai.AuthenticationError as e:
        check("responses: a wrong key -> 401 in OpenAI's shape, code invalid_api_key",
              (e.body or {}).get("code") == "invalid_api_key", e.body)
    st, h, _ = post(port, "/v1/responses", {"input": "x", "max_output_tokens": 1, "prompt_cache_key": "codex-conv-1",
                                            "store": False})
    check("responses: prompt_cache_key mirrored as X-Session-Id", st == 200 and h.get("x-session-id") == "codex-conv-1", h)


# ---- hostile input ----------------------------------------------------------------------------------

M = [{"role": "user", "content": "hi"}]
MSG_OK = {"model": "m", "max_tokens": 1, "messages": M}
RESP_OK = {"model": "m", "input": "hi", "max_output_tokens": 1}
TYPES = {"int": 1, "real": 1.5, "str": "x", "list": [], "obj": {}, "bool": True}
# field -> the JSON types it takes (null is "absent" for all but the required ones)
MSG_FIELDS = {"model": "str", "max_tokens": "int", "messages": "list", "system": "str list", "stream": "bool",
              "metadata": "obj", "stop_sequences": "list", "tools": "list", "tool_choice": "obj", "thinking": "obj",
              "output_config": "obj", "temperature": "", "top_p": "", "top_k": "", "mcp_servers": "list"}
RESP_FIELDS = {"model": "str", "input": "str list", "instructions": "str", "tools": "list", "tool_choice": "str obj",
               "parallel_tool_calls": "bool", "text": "obj", "reasoning": "obj", "max_output_tokens": "int",
               "store": "bool", "stream": "bool", "previous_response_id": "str", "metadata": "obj", "user": "str",
               "prompt_cache_key": "str", "temperature": "", "top_p": "", "truncation": "", "include": "list",
               "background": "bool", "max_tool_calls": "int", "safety_identifier": "str", "stream_options": "obj",
               "service_tier": "str", "top_logprobs": ""}

MSG_BAD = [   # (name, body, status, regex)
    ("malformed JSON", b'{"messages": [', 400, "malformed JSON"),
    ("not an object", b"[1, 2]", 400, "JSON object"),
    ("no max_tokens", {"messages": M}, 400, "max_tokens is required"),
    ("max_tokens 0", dict(MSG_OK, max_tokens=0), 400, "max_tokens"),
    ("no messages", {"max_tokens": 1}, 400, "messages is required"),
    ("empty messages", dict(MSG_OK, messages=[]), 400, "must not be empty"),
    ("role system in messages", dict(MSG_OK, messages=[{"role": "system", "content": "x"}]), 400, "role"),
    ("message not an object", dict(MSG_OK, messages=[3]), 400, "role"),
    ("content a number", dict(MSG_OK, messages=[{"role": "user", "content": 3}]), 400, "content"),
    ("empty content", dict(MSG_OK, messages=[{"role": "user", "content": ""}]), 400, "empty"),
    ("block without type", dict(MSG_OK, messages=[{"role": "user", "content": [{"text": "x"}]}]), 400, "type"),
    ("unknown block type", dict(MSG_OK, messages=[{"role": "user", "content": [{"type": "audio"}]}]), 400, "audio"),
    ("image block", dict(MSG_OK, messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]), 400, "text only"),
    ("text not a string", dict(MSG_OK, messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]), 400, "text"),
    ("tool_result without id", dict(MSG_OK, messages=[{"role": "user", "content": [{"type": "tool_result"}]}]), 400,
     "tool_use_id"),
    ("tool_result content a number", dict(MSG_OK, messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": 5}]}]), 400, "content"),
    ("tool_result image content", dict(MSG_OK, messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}]}]), 400, "text only"),
    ("is_error not a boolean", dict(MSG_OK, messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}]}]), 400, "is_error"),
    ("tool_use in a user message", dict(MSG_OK, messages=[{"role": "user", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]), 400, "tool_use"),
    ("tool_use input a string", dict(MSG_OK, messages=M + [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]}, M[0]]), 400, "input"),
    ("tool_use bad name", dict(MSG_OK, messages=M + [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "a b", "input": {}}]}, M[0]]), 400, "name"),
    ("thinking not a string", dict(MSG_OK, messages=M + [{"role": "assistant", "content": [
        {"type": "thinking", "thinking": 1}]}, M[0]]), 400, "thinking"),
    ("final assistant message", dict(MSG_OK, messages=M + [{"role": "assistant", "content": "Sure"}]), 400, "prefill"),
    ("system block not text", dict(MSG_OK, system=[{"type": "image"}]), 400, "text only"),
    ("server tool", dict(MSG_OK, tools=[{"type": "web_search_20250305", "name": "web_search"}]), 400, "server tool"),
    ("tool without input_schema", dict(MSG_OK, tools=[{"name": "f"}]), 400, "input_schema"),
    ("tool name with markup", dict(MSG_OK, tools=[{"name": "f>", "input_schema": {}}]), 400, "name"),
    ("tool_choice unknown type", dict(MSG_OK, tools=[{"name": "f", "input_schema": {}}], tool_choice={"type": "x"}), 400,
     "tool_choice"),
    ("tool_choice tool without name", dict(MSG_OK, tools=[{"name": "f", "input_schema": {}}],
                                           tool_choice={"type": "tool"}), 400, "name"),
    ("tool_choice an unknown tool", dict(MSG_OK, tools=[{"name": "f", "input_schema": {}}],
                                         tool_choice={"type": "tool", "name": "g"}), 400, "no tool named"),
    ("thinking unknown type", dict(MSG_OK, thinking={"type": "maybe"}), 400, "thinking.type"),
    ("thinking without budget", dict(MSG_OK, max_tokens=10, thinking={"type": "enabled"}), 400, "budget_tokens"),
    ("thinking budget >= max_tokens", dict(MSG_OK, max_tokens=10, thinking={"type": "enabled", "budget_tokens": 10}), 400,
     "less than max_tokens"),
    ("top_k 40", dict(MSG_OK, top_k=40), 400, "top_k"),
    ("stop_sequences a string", dict(MSG_OK, stop_sequences="x"), 400, "array"),
    ("stop_sequences empty string", dict(MSG_OK, stop_sequences=[""]), 400, "empty"),
    ("17 stop_sequences", dict(MSG_OK, stop_sequences=[str(i) for i in range(17)]), 400, "at most"),
    ("metadata.user_id a number", dict(MSG_OK, metadata={"user_id": 5}), 400, "user_id"),
    ("output_config.format not a schema", dict(MSG_OK, output_config={"format": {"type": "json_schema"}}), 400, "format"),
    ("output_config.format unsupported keyword", dict(MSG_OK, output_config={"format": {
        "type": "json_schema", "schema": {"type": "string", "pattern": "a+"}}}), 400, "pattern"),
    ("mcp_servers", dict(MSG_OK, mcp_servers=[{"type": "url", "url": "http://x"}]), 400, "mcp_servers"),
    ("a prompt longer than the context", dict(MSG_OK, messages=[{"role": "user", "content": "word " * 2500}]), 400,
     "context"),
    ("invalid UTF-8", b'{"max_tokens": 1, "messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, "malformed JSON"),
    ("deep nesting", b'{"max_tokens": 1, "metadata": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "malformed JSON|metadata"),
]

RESP_BAD = [
    ("malformed JSON", b'{"input": [', 400, "malformed JSON"),
    ("no input", {"max_output_tokens": 1}, 400, "input is required"),
    ("empty input", dict(RESP_OK, input=[]), 400, "must not be empty"),
    ("input a number", dict(RESP_OK, input=3), 400, "input"),
    ("item not an object", dict(RESP_OK, input=[3]), 400, "object"),
    ("unknown item type", dict(RESP_OK, input=[{"type": "web_search_call", "id": "x"}]), 400, "web_search_call"),
    ("item_reference", dict(RESP_OK, input=[{"type": "item_reference", "id": "x"}]), 400, "item_reference"),
    ("unknown role", dict(RESP_OK, input=[{"role": "robot", "content": "x"}]), 400, "role"),
    ("message without content", dict(RESP_OK, input=[{"role": "user"}]), 400, "content"),
    ("content part unknown", dict(RESP_OK, input=[{"role": "user", "content": [{"type": "x"}]}]), 400, "unknown"),
    ("input_image", dict(RESP_OK, input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]), 400,
     "text only"),
    ("text part without text", dict(RESP_OK, input=[{"role": "user", "content": [{"type": "input_text"}]}]), 400, "text"),
    ("function_call arguments not JSON", dict(RESP_OK, input=[{"role": "user", "content": "x"}, {
        "type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]), 400, "arguments"),
    ("function_call without call_id", dict(RESP_OK, input=[{"type": "function_call", "name": "f", "arguments": "{}"}]),
     400, "call_id"),
    ("function_call bad name", dict(RESP_OK, input=[{"type": "function_call", "call_id": "c", "name": "<f>",
                                                      "arguments": "{}"}]), 400, "name"),
    ("function_call_output without output", dict(RESP_OK, input=[{"type": "function_call_output", "call_id": "c"}]),
     400, "output"),
    ("reasoning summary a string", dict(RESP_OK, input=[{"type": "reasoning", "summary": "x"}]), 400, "arrays"),
    ("only assistant items", dict(RESP_OK, input=[{"role": "assistant", "content": "x"}]), 400, "user query"),
    ("built-in tool", dict(RESP_OK, tools=[{"type": "web_search"}]), 400, "function tools"),
    ("tool parameters a string", dict(RESP_OK, tools=[{"type": "function", "name": "f", "parameters": "x"}]), 400,
     "parameters"),
    ("tool_choice unknown", dict(RESP_OK, tools=[{"type": "function", "name": "f"}], tool_choice="maybe"), 400,
     "tool_choice"),
    ("tool_choice allowed_tools", dict(RESP_OK, tools=[{"type": "function", "name": "f"}],
                                       tool_choice={"type": "allowed_tools", "tools": []}), 400, "tool_choice"),
    ("tool_choice required without tools", dict(RESP_OK, tool_choice="required"), 400, "needs tools"),
    ("text.format unknown", dict(RESP_OK, text={"format": {"type": "xml"}}), 400, "text.format"),
    ("text.format schema keyword", dict(RESP_OK, text={"format": {"type": "json_schema", "name": "n", "schema": {
        "type": "object", "patternProperties": {}}}}), 400, "patternProperties"),
    ("reasoning.effort unknown", dict(RESP_OK, reasoning={"effort": "max"}), 400, "effort"),
    ("truncation auto", dict(RESP_OK, truncation="auto"), 400, "truncation"),
    ("background", dict(RESP_OK, background=True), 400, "background"),
    ("conversation", dict(RESP_OK, conversation="conv_1"), 400, "conversation"),
    ("top_logprobs 3", dict(RESP_OK, top_logprobs=3), 400, "top_logprobs"),
    ("max_output_tokens 0", dict(RESP_OK, max_output_tokens=0), 400, "max_output_tokens"),
    ("max_output_tokens over the context", dict(RESP_OK, max_output_tokens=100000), 400, "context"),
    ("a prompt longer than the context", dict(RESP_OK, input="word " * 2500), 400, "context"),
    ("forced call and a JSON format", dict(RESP_OK, tools=[{"type": "function", "name": "f"}], tool_choice="required",
                                          text={"format": {"type": "json_object"}}), 400, "cannot be combined"),
]


def test_hostile(port, max_body, quick):
    n = 0
    for path, ok_body, fields, bad, anth in (("/v1/messages", MSG_OK, MSG_FIELDS, MSG_BAD, True),
                                             ("/v1/responses", RESP_OK, RESP_FIELDS, RESP_BAD, False)):
        api = path.rsplit("/", 1)[1]
        shape = (lambda b: anthropic_error(b, "invalid_request_error")) if anth else openai_error
        for name, body, status, pattern in bad:
            st, _, b = request(port, "POST", path, body, headers=AUTH)
            try:
                j = json.loads(b)
            except ValueError:
                j = None
            msg = (j or {}).get("error", {}).get("message", "") if isinstance(j, dict) else ""
            import re
            check(f"{api}: {name} -> {status} in the API's shape", st == status and shape(j) and re.search(pattern, msg)
                  is not None, (st, b[:300]))
            n += 1
        # Every field given a value of every JSON type it does not take: a 400 naming it.
        wrong = 0
        for field, takes in fields.items():
            for tname, v in TYPES.items():
                if tname in takes.split():
                    continue
                if not takes and tname in ("int", "real"):   # sampling numbers: the greedy value or a 400 either way
                    continue
                st, _, b = request(port, "POST", path, dict(ok_body, **{field: v}), headers=AUTH)
                j = json.loads(b) if b[:1] == b"{" else None
                if not (st == 400 and shape(j)):
                    wrong += 1
                    check(f"{api}: {field} = {json.dumps(v)} -> 400", False, (st, b[:300]))
                n += 1
        check(f"{api}: every field with a value of a wrong type -> 400 in the API's shape", wrong == 0, wrong)
        st, _, b = request(port, "POST", path, b'{"x": "' + b"a" * (max_body + 10) + b'"}', headers=AUTH)
        check(f"{api}: a body over --max-body -> 413 in the API's shape", st == 413 and (
            anthropic_error(json.loads(b), "request_too_large") if anth else openai_error(json.loads(b))), (st, b[:200]))
        st, h, b = request(port, "GET", path, headers=AUTH)
        check(f"{api}: GET -> 405, Allow: POST, in the API's shape", st == 405 and h.get("allow") == "POST"
              and (anthropic_error(json.loads(b), "invalid_request_error") if anth else openai_error(json.loads(b))), (st, h))
        # Seeded random byte mutations of a valid body: never a 5xx, never a crash or a hang.
        rng = random.Random(34 + anth)
        seed = json.dumps(dict(ok_body, tools=[{"name": "f", "input_schema": {"type": "object"}}] if anth else
                               [{"type": "function", "name": "f"}])).encode()
        bad5 = 0
        for _ in range(40 if quick else 150):
            b = bytearray(seed)
            for _ in range(rng.randint(1, 4)):
                k = rng.randrange(len(b))
                op = rng.random()
                if op < 0.4:
                    b[k] = rng.randrange(256)
                elif op < 0.7:
                    del b[k]
                else:
                    b.insert(k, rng.choice(b'{}[]",:0123456789ae\\'))
            st, _, _ = request(port, "POST", path, bytes(b), headers=AUTH)
            bad5 += st >= 500
            n += 1
        check(f"{api}: random mutations of a valid body: no 5xx", bad5 == 0, bad5)
    st, h, b = request(port, "DELETE", "/v1/responses/resp_nope", headers=AUTH)
    check("responses: DELETE of an unknown id -> 404", st == 404 and openai_error(json.loads(b)), (st, b))
    st, h, b = request(port, "POST", "/v1/responses/resp_x", b"{}", headers=AUTH)
    check("responses: POST on /v1/responses/{id} -> 405, Allow: GET, HEAD, DELETE",
          st == 405 and h.get("allow") == "GET, HEAD, DELETE", (st, h))
    st, _, _ = request(port, "GET", "/health")
    check(f"server alive after {n} hostile requests", st == 200)


def test_metrics(port):
    st, _, b = request(port, "GET", "/metrics", headers=AUTH)
    text = b.decode()
    ok = st == 200
    for ep in ("messages", "count_tokens", "responses", "responses_by_id"):
        ok = ok and f'calla_requests_total{{endpoint="{ep}",status="200"}}' in text
    ok = ok and 'calla_requests_total{endpoint="messages",status="400"}' in text
    check("metrics: the new endpoints counted by status", ok, [l for l in text.splitlines() if "requests_total" in l])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--quick", action="store_true", help="fewer mutations (sanitizer builds)")
    a = ap.parse_args()
    t0 = time.time()
    try:
        import anthropic
        import jsonschema
        import openai
    except ImportError as e:
        check("anthropic, openai and jsonschema installed (pip install anthropic openai jsonschema)",
              not os.environ.get("CI"), repr(e))
        print(f"skip test_agent_apis.py: {e}", flush=True)
        return 1 if os.environ.get("CI") else 0
    max_body = 65536
    srv = Server(a.bin, a.model, "--context", 2048, "--threads", 2, "--max-body", max_body, "--api-key", KEY,
                 "--store-entries", 8, "--default-max-tokens", 8)
    try:
        test_messages(srv.port, anthropic, jsonschema)
        test_responses(srv.port, openai, jsonschema)
        test_hostile(srv.port, max_body, a.quick)
        test_metrics(srv.port)
    except Exception as e:  # noqa: BLE001 (a client failing is a failed check)
        import traceback
        traceback.print_exc()
        check("agent APIs: no exception", False, repr(e))
    finally:
        if RESULTS["fail"]:
            print("---- server log (tail) ----\n" + srv.text()[-4000:], flush=True)
        srv.close("agent-APIs server")
    print(f"test_agent_apis.py: {RESULTS['ok']} checks ok, {RESULTS['fail']} failed in {time.time() - t0:.0f} s"
          + (" (" + ", ".join(FAILURES) + ")" if FAILURES else ""), flush=True)
    return 1 if RESULTS["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
