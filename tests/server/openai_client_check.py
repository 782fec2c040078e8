#!/usr/bin/env python3
"""The official `openai` Python client against a running `anvil serve` (loopback).

Usage: openai_client_check.py BASE_URL API_KEY MODEL_ID
Exit 0: every check passed; 77: the openai package is missing (the caller skips); else: failed.
Bounded: every call has a 60 s timeout and at most 16 generated tokens.
"""
import sys

try:
    import openai
except ImportError as e:  # the GoogleTest wrapper turns 77 into a visible skip
    print(f"SKIP: the openai package is not installed ({e})")
    sys.exit(77)

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, timeout=60, max_retries=0)
msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}")
        sys.exit(1)
    print(f"ok: {what}")


# Models.
ids = [m.id for m in client.models.list().data]
check(ids == [model], f"models.list -> {ids}")

# Chat, not streamed (greedy).
r = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0, seed=1)
c = r.choices[0]
check(r.object == "chat.completion" and c.message.role == "assistant", "chat completion object")
check(c.finish_reason in ("stop", "length"), f"finish_reason {c.finish_reason}")
check(r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 8, f"usage {r.usage}")
check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "total_tokens")
check(r.usage.prompt_tokens_details is not None and r.usage.prompt_tokens_details.cached_tokens >= 0, "cached_tokens")
text = c.message.content or ""

# The same request streamed: the deltas concatenate to the same text; usage arrives last.
stream = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0, seed=1,
                                        stream=True, stream_options={"include_usage": True})
parts, usage, finish = [], None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for ch in chunk.choices:
        if ch.delta.content:
            parts.append(ch.delta.content)
        if ch.finish_reason:
            finish = ch.finish_reason
check("".join(parts) == text, "streamed text == non-streamed text")
check(finish == c.finish_reason, "streamed finish_reason")
check(usage is not None and usage.completion_tokens == r.usage.completion_tokens, "stream usage")
# The repeated prompt is served from the prefix cache: all its full 16-token pages but the last token's.
check(usage.prompt_tokens_details.cached_tokens == (usage.prompt_tokens - 1) // 16 * 16,
      f"repeated prompt cached_tokens {usage.prompt_tokens_details.cached_tokens} of {usage.prompt_tokens}")

# Logprobs.
r = client.chat.completions.create(model=model, messages=msgs, max_tokens=3, temperature=0, logprobs=True,
                                   top_logprobs=2)
lp = r.choices[0].logprobs.content
check(len(lp) == r.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in lp), "chat logprobs")
check(all(t.logprob <= 0 and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob for t in lp), "logprob order")

# Tools are accepted and reach the template (the prompt grows by the tool schema).
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
r2 = client.chat.completions.create(model=model, messages=msgs, max_tokens=4, temperature=0, tools=tools,
                                    tool_choice="auto")
check(r2.usage.prompt_tokens > r.usage.prompt_tokens + 20, "tools reach the chat template")
check(r2.choices[0].finish_reason in ("stop", "length", "tool_calls"), "tools request finishes")

# tool_choice naming a function (the answer is prefilled with the call's opening; 3 tokens cut it short).
r3 = client.chat.completions.create(model=model, messages=msgs, max_tokens=3, temperature=0, tools=tools,
                                    tool_choice={"type": "function", "function": {"name": "get_weather"}})
check(r3.usage.prompt_tokens > r2.usage.prompt_tokens and r3.choices[0].finish_reason == "length",
      "named tool_choice starts the answer inside a call")
try:
    client.chat.completions.create(model=model, messages=msgs, tools=tools,
                                   tool_choice={"type": "function", "function": {"name": "nope"}})
    check(False, "tool_choice naming an unknown function rejected")
except openai.BadRequestError as e:
    check(e.param == "tool_choice", "unknown tool_choice function -> param tool_choice")

# What agent frameworks send: parallel_tool_calls (LangChain's structured output sets it false),
# text parts, an assistant turn with tool_calls and null content, a tool result, user/metadata/store.
hist = [{"role": "developer", "content": [{"type": "text", "text": "Be terse."}]},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"}], "name": "bob"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"}]
r4 = client.chat.completions.create(model=model, messages=hist, max_completion_tokens=3, temperature=0, tools=tools,
                                    parallel_tool_calls=False, user="u1", metadata={"k": "v"}, store=False)
check(r4.usage.completion_tokens <= 3 and r4.choices[0].finish_reason in ("stop", "length", "tool_calls"),
      "tool history, parallel_tool_calls=False, max_completion_tokens")
# Responses-API text parts ("input_text") and a replayed assistant turn with null content and no
# tool_calls are taken (as vLLM takes them).
r5 = client.chat.completions.create(model=model, max_tokens=2, temperature=0, messages=[
    {"role": "user", "content": [{"type": "input_text", "text": "Hi."}]}, {"role": "assistant", "content": None},
    {"role": "user", "content": [{"type": "text", "text": "Again."}]}])
check(r5.choices[0].finish_reason in ("stop", "length"), "input_text parts, an assistant turn with null content")
# Media parts and the deprecated function_call in a history are refused, naming what was sent.
for bad_msgs, says in [([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}],
                        "'image_url' is not supported"),
                       ([{"role": "user", "content": "q"},
                         {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}}],
                        "function_call")]:
    try:
        client.chat.completions.create(model=model, messages=bad_msgs, max_tokens=2)
        check(False, f"{says} refused")
    except openai.BadRequestError as e:
        check(e.param == "messages" and says in e.message, f"refused: {e.message}")
# What anvil cannot honour is refused with the parameter named, not ignored.
for kwargs, param in [({"n": 65}, "n"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                      ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
                       "response_format"),
                      ({"logit_bias": {"x": 1}}, "logit_bias"), ({"logit_bias": {"5": 101}}, "logit_bias"),
                      ({"logit_bias": {"5": "a"}}, "logit_bias"), ({"logit_bias": {"99999999": 1}}, "logit_bias"),
                      ({"logit_bias": {str(i): 1 for i in range(1025)}}, "logit_bias"),
                      ({"stop": [str(i) for i in range(17)]}, "stop"),
                      ({"functions": [{"name": "f", "parameters": {"type": "object"}}]}, "functions"),
                      ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}, "modalities"),
                      ({"stream_options": {"include_usage": True}}, "stream_options")]:
    try:
        client.chat.completions.create(model=model, messages=msgs, max_tokens=2, **kwargs)
        check(False, f"{param} refused")
    except openai.BadRequestError as e:
        check(e.param == param, f"{param} refused: {e.message}")
try:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "word " * 600}], max_tokens=2)
    check(False, "prompt beyond the context rejected")
except openai.BadRequestError as e:
    check(e.code == "context_length_exceeded" and "512" in e.message, f"context_length_exceeded: {e.message}")
try:
    client.models.retrieve("no-such-model")
    check(False, "models.retrieve of an unknown id")
except openai.NotFoundError as e:
    check(e.code == "model_not_found", "models.retrieve unknown -> NotFoundError")
check(client.models.retrieve(model).id == model, "models.retrieve")

# A session through extra_body: the second turn sends only its message and continues the first.
import json, os, time, urllib.request
name = f"openai-check-{os.getpid()}-{int(time.time())}"
t1 = client.chat.completions.create(model=model, max_tokens=4, temperature=0, extra_body={"session": name},
                                    messages=[{"role": "user", "content": "Remember the number 7."}])
t2 = client.chat.completions.create(model=model, max_tokens=4, temperature=0, extra_body={"session": name},
                                    messages=[{"role": "user", "content": "Which number?"}])
check(t2.usage.prompt_tokens > t1.usage.prompt_tokens + t1.usage.completion_tokens, "session: turn 2 holds turn 1")
check(t2.usage.prompt_tokens_details.cached_tokens > 0, "session: turn 1's KV is reused")
def http(method, path):
    req = urllib.request.Request(base + path, method=method, headers={"Authorization": "Bearer " + key})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.status, json.loads(resp.read())


listed = [x for x in http("GET", "/v1/sessions")[1]["data"] if x["id"] == name]
check(len(listed) == 1 and listed[0]["messages"] == 4, f"session listed with 4 messages: {listed}")
check(http("DELETE", "/v1/sessions/" + name)[0] == 200, "session deleted")
try:
    client.chat.completions.create(model=model, messages=msgs, extra_body={"session": "no spaces"})
    check(False, "bad session name rejected")
except openai.BadRequestError as e:
    check(e.param == "session", "bad session name -> param session")

# n: several choices, each a sequence of its own; choice j samples with seed + j, so it is the
# single request with that seed; streamed, the chunks carry their choice's index.
rn = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=1.0, seed=11, n=3)
one = [client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=1.0, seed=11 + j)
       for j in range(3)]
check([c.index for c in rn.choices] == [0, 1, 2], f"n=3: three choices {[c.index for c in rn.choices]}")
check([c.message.content for c in rn.choices] == [o.choices[0].message.content for o in one],
      "n=3: choice j is the request with seed + j")
check(rn.usage.prompt_tokens == one[0].usage.prompt_tokens
      and rn.usage.completion_tokens == sum(o.usage.completion_tokens for o in one), f"n=3 usage {rn.usage}")
parts, finishes, su = {}, {}, None
for ch in client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=1.0, seed=11, n=3,
                                         stream=True, stream_options={"include_usage": True}):
    for c in ch.choices:
        parts[c.index] = parts.get(c.index, "") + (c.delta.content or "")
        if c.finish_reason:
            finishes[c.index] = c.finish_reason
    if ch.usage:
        su = ch.usage
check([parts.get(i) for i in range(3)] == [c.message.content for c in rn.choices], f"n=3 streamed {parts}")
check(sorted(finishes) == [0, 1, 2] and su is not None and su.completion_tokens == rn.usage.completion_tokens,
      f"n=3 streamed finishes {finishes}, usage {su}")

# Completions.
r = client.completions.create(model=model, prompt="def add(a, b):", max_tokens=6, temperature=0, logprobs=1)
check(r.object == "text_completion" and r.usage.completion_tokens <= 6, "completion object")
check(len(r.choices[0].logprobs.tokens) == r.usage.completion_tokens, "completion logprobs")
r0 = client.completions.create(model=model, prompt="def add(a, b):", max_tokens=4, temperature=0, logprobs=0)
l0 = r0.choices[0].logprobs
check(all(top == {tok: lp} for top, tok, lp in zip(l0.top_logprobs, l0.tokens, l0.token_logprobs))
      and len(l0.top_logprobs) == r0.usage.completion_tokens, f"logprobs=0: the sampled token alone {l0.top_logprobs}")
# echo: the prompt's text first; with logprobs its tokens scored too, the first with none (null).
re_ = client.completions.create(model=model, prompt="def add(a, b):", max_tokens=4, temperature=0, logprobs=1, echo=True)
le = re_.choices[0].logprobs
check(re_.choices[0].text == "def add(a, b):" + r0.choices[0].text, f"echo: prompt + completion {re_.choices[0].text!r}")
check(len(le.tokens) == re_.usage.prompt_tokens + re_.usage.completion_tokens
      and le.token_logprobs[0] is None and le.top_logprobs[0] is None
      and all(x <= 0 for x in le.token_logprobs[1:]) and le.text_offset[0] == 0
      and all(abs(a - b) < 1e-4 for a, b in zip(le.token_logprobs[-4:], l0.token_logprobs)), f"echo logprobs: {le}")
# Several prompts: a choice each, in order, each what the prompt gets alone.
texts = ["def add(a, b):", "class A:", "import os"]
rp = client.completions.create(model=model, prompt=texts, max_tokens=5, temperature=0)
alone = [client.completions.create(model=model, prompt=t, max_tokens=5, temperature=0) for t in texts]
check([c.text for c in rp.choices] == [a.choices[0].text for a in alone] and [c.index for c in rp.choices] == [0, 1, 2],
      f"several prompts: {[c.text for c in rp.choices]}")
check(rp.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone), f"several prompts' usage {rp.usage}")
pieces = [ch.choices[0].text for ch in client.completions.create(model=model, prompt="def add(a, b):", max_tokens=6,
                                                                   temperature=0, stream=True)]
check("".join(pieces) == r.choices[0].text, "streamed completion == non-streamed")

# logit_bias (OpenAI's: token id strings -> a bias added to the logits). +100 forces a token on both
# endpoints, greedy and sampled, streamed too; -100 on the greedy token hands the pick to the
# runner-up (the reply's logprobs are the model's raw ones, so the runner-up is the second of them).
def post(path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def token_id(text):  # the one token whose text this is, or None
    ids = post("/tokenize", {"content": text})["tokens"]
    return ids[0] if len(ids) == 1 and post("/detokenize", {"tokens": ids})["content"] == text else None


forced = token_id("hello")
check(forced is not None, "'hello' is one token")
for temp in (0, 1.0):
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=4, temperature=temp, seed=5,
                                       logit_bias={str(forced): 100})
    check(r.choices[0].message.content == "hello" * 4, f"chat, T={temp}: +100 forces the token: {r.choices[0].message.content!r}")
    r = client.completions.create(model=model, prompt="def f(x):", max_tokens=4, temperature=temp, seed=5,
                                  logit_bias={str(forced): 100})
    check(r.choices[0].text == "hello" * 4, f"completion, T={temp}: +100 forces the token: {r.choices[0].text!r}")
parts = [ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
    model=model, messages=msgs, max_tokens=4, temperature=0.8, seed=9, stream=True, logit_bias={str(forced): 100})
    if ch.choices]
check("".join(parts) == "hello" * 4, f"streamed chat with logit_bias: {parts}")
moved = 0
for prompt in ["def add(a, b):", "import os\n", "class A:", "x = [1, 2", "for i in range(", "# a comment"]:
    r = client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    top = sorted(lp.top_logprobs[0].items(), key=lambda kv: -kv[1])
    first = token_id(lp.tokens[0])
    if first is None or len(top) < 2 or token_id(top[1][0]) is None or top[0][1] == top[1][1]:
        continue  # a token whose text does not name it alone (a byte piece), or a tie
    b = client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0, logprobs=2,
                                  logit_bias={str(first): -100})
    check(b.choices[0].logprobs.tokens[0] == top[1][0],
          f"{prompt!r}: -100 on {lp.tokens[0]!r} picks the runner-up {top[1][0]!r}: {b.choices[0].logprobs.tokens[0]!r}")
    moved += 1
check(moved >= 2, f"-100 checked on {moved} prompts")

# Errors map to the client's exception types, naming the parameter.
try:
    client.chat.completions.create(model=model, messages=msgs, temperature=5)
    check(False, "temperature=5 rejected")
except openai.BadRequestError as e:
    check(e.status_code == 400 and e.param == "temperature", f"BadRequestError param={e.param}")
try:
    client.chat.completions.create(model="no-such-model", messages=msgs)
    check(False, "unknown model rejected")
except openai.NotFoundError as e:
    check(e.code == "model_not_found", "NotFoundError model_not_found")
try:
    client.chat.completions.create(model=model, messages=msgs, max_tokens=10**9)
    check(False, "huge max_tokens rejected")
except openai.BadRequestError as e:
    check(e.param == "max_tokens", "huge max_tokens -> param max_tokens")
# The key under a lowercase scheme, or as X-Api-Key (the client still sends its own Bearer header).
for headers in [{"Authorization": "bearer " + key}, {"X-Api-Key": key}]:
    other = openai.OpenAI(base_url=base + "/v1", api_key="placeholder", max_retries=0, default_headers=headers)
    check([m.id for m in other.models.list().data] == [model], f"key sent as {list(headers)[0]}")
try:
    openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list()
    check(False, "wrong key rejected")
except openai.AuthenticationError as e:
    check(e.status_code == 401, "AuthenticationError")
print("all openai client checks passed")
