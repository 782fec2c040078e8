#!/usr/bin/env python3
"""The official `openai` client's Responses API (client.responses) against a running `anvil serve`.

Usage: responses_check.py BASE_URL MODEL_ID MODE
MODE text:  a model without tools (the tiny trained one): greedy responses.create equals
            chat.completions.create for the same messages (text and token counts), streamed and not,
            through responses.stream too; max_output_tokens -> incomplete; JSON mode; refused fields.
MODE tools: the scripted weather model of responses_test.cpp: a named tool_choice gives a
            function_call; the call and its output sent back give a reasoning item and the answer,
            equal to chat's reply for the same history, streamed and not.
Exit 0: every check passed; 77: the openai package is missing or has no Responses API; else failed.
"""
import json
import sys

try:
    import openai
except ImportError as e:  # the GoogleTest wrapper turns 77 into a visible skip
    print(f"SKIP: the openai package is not installed ({e})")
    sys.exit(77)

base, model, mode = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base + "/v1", api_key="none", timeout=120, max_retries=0)
if not hasattr(client, "responses"):
    print(f"SKIP: openai {openai.__version__} has no Responses API")
    sys.exit(77)


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}")
        sys.exit(1)
    print(f"ok: {what}")


def stream_events(**kw):
    """responses.create(stream=True): the events, checked for order and sequence numbers."""
    events = list(client.responses.create(stream=True, **kw))
    check([e.sequence_number for e in events] == list(range(len(events))), "sequence_number 0, 1, 2, ...")
    check(events[0].type == "response.created" and events[1].type == "response.in_progress",
          "stream opens with response.created, response.in_progress")
    check(events[-1].type in ("response.completed", "response.incomplete"), f"stream ends with {events[-1].type}")
    return events


def texts(resp):
    """(reasoning text, answer text, [(name, arguments)]) of a Response."""
    reasoning, calls = "", []
    for item in resp.output:
        if item.type == "reasoning":
            reasoning += "".join(c.text for c in (item.content or []))
        elif item.type == "function_call":
            calls.append((item.name, item.arguments))
    return reasoning, resp.output_text, calls


if mode == "text":
    msgs = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "a function adding two numbers"}]
    for max_out in (8, 40):
        r = client.responses.create(model=model, instructions=msgs[0]["content"], input=msgs[1]["content"],
                                    max_output_tokens=max_out, temperature=0)
        c = client.chat.completions.create(model=model, messages=msgs, max_tokens=max_out, temperature=0)
        check(r.object == "response" and r.id.startswith("resp_"), "response object")
        check(r.output_text == (c.choices[0].message.content or ""),
              f"greedy output_text == chat content ({r.output_text!r})")
        check(r.usage.input_tokens == c.usage.prompt_tokens and r.usage.output_tokens == c.usage.completion_tokens,
              f"same prompt and tokens as chat ({r.usage.input_tokens}, {r.usage.output_tokens})")
        check(r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, "total_tokens")
        check(r.usage.output_tokens_details.reasoning_tokens == 0, "no reasoning tokens")
        want = "incomplete" if c.choices[0].finish_reason == "length" else "completed"
        check(r.status == want, f"status {r.status} for finish_reason {c.choices[0].finish_reason}")
        if want == "incomplete":
            check(r.incomplete_details.reason == "max_output_tokens", "incomplete_details.reason")
        check(len(r.output) == 1 and r.output[0].type == "message" and r.output[0].content[0].type == "output_text",
              "one message item with output_text")
        # The same input as items (input_text parts, a developer message): the same answer.
        r2 = client.responses.create(model=model, input=[
            {"role": "developer", "content": msgs[0]["content"]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": msgs[1]["content"]}]}],
            max_output_tokens=max_out, temperature=0)
        check(r2.output_text == r.output_text and r2.usage.input_tokens == r.usage.input_tokens,
              "input items == instructions + string input")
        # Streamed: the deltas make the text; the last event carries the whole response.
        ev = stream_events(model=model, instructions=msgs[0]["content"], input=msgs[1]["content"],
                           max_output_tokens=max_out, temperature=0)
        deltas = "".join(e.delta for e in ev if e.type == "response.output_text.delta")
        check(deltas == r.output_text, "streamed deltas == non-streamed text")
        done = [e for e in ev if e.type == "response.output_text.done"]
        check(len(done) == 1 and done[0].text == r.output_text, "output_text.done text")
        check(ev[-1].response.output_text == r.output_text and ev[-1].response.status == r.status,
              "final event's response == non-streamed response")
        check(ev[-1].response.usage.output_tokens == r.usage.output_tokens, "streamed usage")

    # The client's stream helper (it checks item ids and the event order as it accumulates), on a
    # reply that completes: a stop string ends it (chat's sampling extensions pass through).
    with client.responses.stream(model=model, input="def add(a, b):", max_output_tokens=60, temperature=0,
                                 extra_body={"stop": ["\n"]}) as s:
        for _ in s:
            pass
        final = s.get_final_response()
    c = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "def add(a, b):"}],
                                       max_tokens=60, temperature=0, stop=["\n"])
    check(final.status == "completed" and final.output_text == c.choices[0].message.content,
          "responses.stream final response == chat reply")

    # JSON mode through text.format.
    j = client.responses.create(model=model, input="a config object", max_output_tokens=200, temperature=0,
                                text={"format": {"type": "json_object"}})
    if j.status == "completed":
        check(isinstance(json.loads(j.output_text), dict), "json_object: the reply is a JSON object")
    else:
        check(j.output_text.lstrip().startswith("{"), "json_object: a cut reply begins an object")

    # Stored responses (the server runs with a KV store): continued by previous_response_id as the
    # stateless request with the whole conversation answers, retrieved and deleted through the client.
    q1, q2 = "Write a function that adds two numbers.", "Now one that multiplies them."
    r1 = client.responses.create(model=model, instructions="You write Python.", input=q1, max_output_tokens=16,
                                 temperature=0)
    check(r1.store is True, "a response is stored by default")
    r2 = client.responses.create(model=model, previous_response_id=r1.id, instructions="You write Python.", input=q2,
                                 max_output_tokens=16, temperature=0)
    ref = client.responses.create(model=model, instructions="You write Python.", store=False, max_output_tokens=16,
                                  temperature=0, input=[{"role": "user", "content": q1},
                                                        {"role": "assistant", "content": r1.output_text},
                                                        {"role": "user", "content": q2}])
    check(r2.previous_response_id == r1.id, "previous_response_id echoed")
    check(r2.output_text == ref.output_text and r2.usage.input_tokens == ref.usage.input_tokens,
          f"continued == stateless with the conversation ({r2.output_text!r} vs {ref.output_text!r})")
    got = client.responses.retrieve(r1.id)
    check(got.id == r1.id and got.output_text == r1.output_text, "responses.retrieve gives the stored response")
    # r2's input items through the client's paginator (newest first; two per page, so it pages):
    # q2, r1's reply, q1, as the client's typed items.
    items = list(client.responses.input_items.list(r2.id, limit=2))
    check([i.type for i in items] == ["message"] * 3 and [i.role for i in items] == ["user", "assistant", "user"],
          f"input_items: three messages, newest first ({[(i.type, getattr(i, 'role', None)) for i in items]})")
    check(items[0].content[0].text == q2 and items[1].content[0].text == r1.output_text and
          items[2].content[0].text == q1, "input_items: the conversation's texts")
    asc = client.responses.input_items.list(r2.id, order="asc")
    check([i.content[0].text for i in asc.data] == [q1, r1.output_text, q2], "input_items: order=asc")
    client.responses.delete(r1.id)
    try:
        client.responses.retrieve(r1.id)
        check(False, "a deleted response is gone")
    except openai.NotFoundError:
        check(True, "a deleted response is gone (404)")

    # Refused, naming the field.
    for kw, param in ((dict(previous_response_id="resp_123"), "previous_response_id"),
                      (dict(tools=[{"type": "web_search"}]), "tools"),
                      (dict(text={"format": {"type": "json_schema", "name": "x", "schema": {}}}), "text.format"),
                      (dict(tool_choice="required"), "tool_choice")):
        try:
            client.responses.create(model=model, input="hi", max_output_tokens=4, **kw)
            check(False, f"{param} refused")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and e.body.get("param") == param, f"{list(kw)[0]} -> 400 param {param}")

elif mode == "tools":
    tools = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    chat_tools = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in tools]
    q = "Weather in Paris?"
    # 1. A forced call.
    r1 = client.responses.create(model=model, input=q, tools=tools, temperature=0,
                                 tool_choice={"type": "function", "name": "get_weather"})
    calls = [o for o in r1.output if o.type == "function_call"]
    check(r1.status == "completed" and len(calls) == 1 and calls[0].name == "get_weather",
          f"named tool_choice -> one function_call item ({r1.output})")
    call = calls[0]
    check(json.loads(call.arguments) == {"city": "Paris"} and call.call_id.startswith("call_"),
          f"arguments {call.arguments}")
    check(r1.output_text == "", "no text beside the call")
    c1 = client.chat.completions.create(model=model, messages=[{"role": "user", "content": q}], tools=chat_tools,
                                        temperature=0,
                                        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    check(c1.choices[0].message.tool_calls[0].function.arguments == call.arguments, "the chat reply's call")
    ev = stream_events(model=model, input=q, tools=tools, temperature=0,
                       tool_choice={"type": "function", "name": "get_weather"})
    kinds = [e.type for e in ev]
    check("response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds,
          "streamed call: arguments delta and done")
    check(texts(ev[-1].response)[2] == [("get_weather", call.arguments)], "streamed call == non-streamed call")

    # 2. The round trip: the call item as the client got it, and its output.
    history = [{"role": "user", "content": q}, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24 C"}]
    r2 = client.responses.create(model=model, input=history, tools=tools, temperature=0)
    reasoning, answer, calls2 = texts(r2)
    check(r2.status == "completed" and not calls2 and answer and reasoning,
          f"the answer after the call's output: reasoning {reasoning!r}, text {answer!r}")
    check([o.type for o in r2.output] == ["reasoning", "message"], "output: reasoning item, message item")
    check(r2.usage.output_tokens_details.reasoning_tokens > 0, "reasoning_tokens counted")
    c2 = client.chat.completions.create(model=model, tools=chat_tools, temperature=0, messages=[
        {"role": "user", "content": q},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny, 24 C"}])
    m = c2.choices[0].message
    check(answer == m.content and reasoning == getattr(m, "reasoning_content", None), "== chat's reply")
    check(r2.usage.input_tokens == c2.usage.prompt_tokens and r2.usage.output_tokens == c2.usage.completion_tokens,
          "same prompt and tokens as chat")
    # Streamed, through the helper: the same items.
    with client.responses.stream(model=model, input=history, tools=tools, temperature=0) as s:
        seen = [e.type for e in s]
        final = s.get_final_response()
    check(texts(final) == texts(r2), "responses.stream final response == non-streamed")
    check("response.reasoning_text.delta" in seen and "response.output_text.delta" in seen,
          "reasoning and text deltas streamed")
    # 3. The whole exchange sent back again (the reasoning item and message included) is taken.
    r3 = client.responses.create(model=model, temperature=0, tools=tools, max_output_tokens=4,
                                 input=history + [o.model_dump(exclude_none=True) for o in r2.output] +
                                 [{"role": "user", "content": "Thanks"}])
    check(r3.usage.input_tokens > r2.usage.input_tokens, "a replayed reasoning item and message are taken")
else:
    print(f"unknown mode {mode}")
    sys.exit(2)
print("all checks passed")
