#!/usr/bin/env python3
"""JSON mode (response_format json_object) through the official `openai` client, against a running
`anvil serve` (loopback), judged by Python's json module.

Usage: json_mode_check.py BASE_URL API_KEY MODEL_ID CHAT(0/1) MAX_TOKENS
Every reply (greedy and seeded at several temperatures, streamed and not, chat when CHAT is 1 and
completions) whose finish_reason is "stop" must be a JSON object for json.loads; one cut by
max_tokens ("length") must still be the beginning of one (json.loads fails only for want of more
text: closing what is open makes it parse). The streamed text equals the non-streamed one.
Prints one line per reply and a summary; exit 0: every check passed; 77: openai is missing; else failed.
"""
import json
import sys

try:
    import openai
except ImportError as e:
    print(f"SKIP: the openai package is not installed ({e})")
    sys.exit(77)

base, key, model, chat, max_tokens = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", int(sys.argv[5])
client = openai.OpenAI(base_url=base + "/v1", api_key=key, timeout=120, max_retries=0)
fmt = {"type": "json_object"}
prompt = "# A JSON object describing a user:\nuser = "
msgs = [{"role": "user", "content": "Reply with a JSON object describing a user."}]
failures = 0


def fail(what):
    global failures
    failures += 1
    print("FAIL: " + what)


def closes(text):
    """Whether text is a viable JSON beginning: some closing of what is open makes json.loads accept it."""
    stack, in_str, esc = [], False, False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            stack.pop()
    closers = "".join(reversed(stack))
    # What may be open at the end: a string (maybe in an escape), a number, a literal, a key.
    for mid in ["", "0", "e", "l", "ue", "se", "ll", "rue", "alse", "ull"]:
        for end in ["", '"', '\\""', '0"', '00"', '000"', '0000"']:
            for colon in ["", ":0", '":0', "0:0"]:
                cand = text + mid + end + colon + closers
                try:
                    json.loads(cand)
                    return True
                except ValueError:
                    pass
                for pre in ['"', ","]:  # after '{' or ',': a key is due
                    try:
                        json.loads(text + pre + ('"k":0' if pre == "," else 'k":0') + closers)
                        return True
                    except ValueError:
                        pass
    return False


def ask(kind, temperature, seed, stream):
    kw = dict(model=model, max_tokens=max_tokens, temperature=temperature, seed=seed, response_format=fmt)
    if kind == "chat":
        if not stream:
            r = client.chat.completions.create(messages=msgs, **kw)
            return r.choices[0].message.content or "", r.choices[0].finish_reason
        parts, finish = [], None
        for chunk in client.chat.completions.create(messages=msgs, stream=True, **kw):
            for ch in chunk.choices:
                if ch.delta.content:
                    parts.append(ch.delta.content)
                if ch.finish_reason:
                    finish = ch.finish_reason
        return "".join(parts), finish
    # response_format is not in the SDK's completions signature: sent as an extra body field.
    kw.pop("response_format")
    if not stream:
        r = client.completions.create(prompt=prompt, extra_body={"response_format": fmt}, **kw)
        return r.choices[0].text, r.choices[0].finish_reason
    parts, finish = [], None
    for chunk in client.completions.create(prompt=prompt, stream=True, extra_body={"response_format": fmt}, **kw):
        for ch in chunk.choices:
            parts.append(ch.text or "")
            if ch.finish_reason:
                finish = ch.finish_reason
    return "".join(parts), finish


stops = lengths = 0
for kind in (["chat"] if chat else []) + ["completions"]:
    for temperature, seed in [(0, 1), (0.7, 1), (0.7, 2), (1.0, 3), (1.0, 4), (1.3, 5), (1.3, 6), (2.0, 7)]:
        texts = {}
        for stream in (False, True):
            text, finish = ask(kind, temperature, seed, stream)
            texts[stream] = text
            print(f"{kind} t={temperature} seed={seed} stream={stream} {finish}: {text[:200]!r}")
            if finish == "stop":
                stops += 1
                try:
                    v = json.loads(text)
                    if not isinstance(v, dict):
                        fail(f"not an object: {text!r}")
                except ValueError as e:
                    fail(f"finish_reason stop but json.loads fails ({e}): {text!r}")
            elif finish == "length":
                lengths += 1
                if not closes(text):
                    fail(f"cut by max_tokens but not the beginning of a JSON object: {text!r}")
            else:
                fail(f"finish_reason {finish}")
        if texts[False] != texts[True]:
            fail(f"streamed text differs: {texts[True]!r} vs {texts[False]!r}")
print(f"summary: {stops} stop, {lengths} length")
if stops == 0:
    fail("no reply closed its object")
sys.exit(1 if failures else 0)
