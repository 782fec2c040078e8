#!/usr/bin/env python3
"""A session turn the server's KV store cannot save, through the official `openai` client, against a
running `anvil serve` (loopback) whose store fails every commit (the caller injects it).

Usage: session_fault_check.py BASE_URL SESSION
SESSION is a chat session holding one turn. The client keeps its default retries (2): the server's
507 says x-should-retry: false, so the turn is sent once (the caller counts the server's 507s).
Exit 0: every check passed; 77: the openai package is missing (the caller skips); else: failed.
"""
import sys

try:
    import openai
except ImportError as e:  # the GoogleTest wrapper turns 77 into a visible skip
    print(f"SKIP: the openai package is not installed ({e})")
    sys.exit(77)

base, session = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key="none", timeout=60)
msgs = [{"role": "user", "content": "Tell me more."}]
extra = {"session": session}


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}")
        sys.exit(1)
    print(f"ok: {what}")


# Not streamed: an exception, not a reply taken for saved; the reply is in the error's body.
try:
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0, extra_body=extra)
    check(False, f"a turn that was not saved returned {r}")
except openai.InternalServerError as e:
    check(e.status_code == 507, f"status {e.status_code}")
    check(e.code == "session_not_saved" and e.param == "session", f"code {e.code}, param {e.param}")
    check(f"session '{session}' was not saved" in e.message, f"message: {e.message}")
    reply = e.body.get("response") if isinstance(e.body, dict) else None
    check(isinstance(reply, dict) and reply["choices"][0]["message"]["role"] == "assistant",
          f"the reply in the error's body: {reply}")
    text = reply["choices"][0]["message"]["content"] or ""

# Streamed: the iterator yields the deltas, then raises at the error event.
parts, finish = [], None
try:
    stream = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0, stream=True,
                                            extra_body=extra)
    for chunk in stream:
        for ch in chunk.choices:
            parts.append(ch.delta.content or "")
            finish = finish or ch.finish_reason
    check(False, "a streamed turn that was not saved ended without an error")
except openai.APIError as e:
    check(not isinstance(e, openai.APIStatusError), f"raised by the stream, not its status: {type(e).__name__}")
    check(e.code == "session_not_saved" and e.param == "session", f"stream error code {e.code}, param {e.param}")
    check(f"session '{session}' was not saved" in e.message, f"stream message: {e.message}")
check(finish is None, f"no finish_reason before the error (got {finish})")
check("".join(parts) == text, f"the streamed deltas are the reply: {''.join(parts)!r} vs {text!r}")
print("summary: ok")
