#!/usr/bin/env python3
"""The chat page at / in headless Chromium, driven over the DevTools protocol (--remote-debugging-pipe,
so no extra packages): it sends a message, the streamed reply must equal what the API returns for
the same request, the model name and tokens/s must show; then the stop button must cancel a long
reply on the server (anvil_cancelled_total grows).

Usage: chat_page_check.py BASE_URL API_KEY
Exit 0: passed; 77: no chromium (the caller skips); else failed. Bounded: 60 s per wait.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

base, key = sys.argv[1], sys.argv[2]
chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
if not chromium:
    print("SKIP: no chromium on PATH (Debian package 'chromium')")
    sys.exit(77)


def api(path, body=None):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read().decode()


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


MESSAGE, N = "Hello from the browser", 12
expected = json.loads(api("/v1/chat/completions", {"messages": [{"role": "user", "content": MESSAGE}],
                                                   "max_tokens": N}))["choices"][0]["message"]["content"]
model = json.loads(api("/v1/models"))["data"][0]["id"]

# Chromium reads DevTools commands from fd 3 and writes replies to fd 4, NUL-separated JSON.
to_chrome_r, to_chrome_w = os.pipe()
from_chrome_r, from_chrome_w = os.pipe()
hi_r, hi_w = os.dup(to_chrome_r), os.dup(from_chrome_w)  # out of the way of 3 and 4


def child_fds():
    os.dup2(hi_r, 3)
    os.dup2(hi_w, 4)


profile = tempfile.mkdtemp(prefix="anvil-chromium-")
proc = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--remote-debugging-pipe", "--user-data-dir=" + profile, "about:blank"],
                        preexec_fn=child_fds, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for fd in (to_chrome_r, from_chrome_w, hi_r, hi_w):
    os.close(fd)
buf, next_id = b"", 0


def cdp(method, params=None, session=None):
    global buf, next_id
    next_id += 1
    msg = {"id": next_id, "method": method, "params": params or {}}
    if session:
        msg["sessionId"] = session
    os.write(to_chrome_w, json.dumps(msg).encode() + b"\0")
    deadline = time.time() + 60
    while time.time() < deadline:
        while b"\0" in buf:
            raw, buf = buf.split(b"\0", 1)
            m = json.loads(raw)
            if m.get("id") == next_id:
                if "error" in m:
                    fail(f"{method}: {m['error']}")
                return m["result"]
        chunk = os.read(from_chrome_r, 1 << 16)
        if not chunk:
            fail("chromium closed the DevTools pipe")
        buf += chunk
    fail(f"{method}: no reply")


def evaluate(session, expr):
    r = cdp("Runtime.evaluate", {"expression": expr, "returnByValue": True}, session)
    return r["result"].get("value")


def wait_for(session, expr, what):
    deadline = time.time() + 60
    while time.time() < deadline:
        v = evaluate(session, expr)
        if v:
            return v
        time.sleep(0.1)
    fail("timed out waiting for " + what)


def metric(name):
    for line in api("/metrics").splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return -1.0


try:
    cdp("Target.setDiscoverTargets", {"discover": False})
    url = base + "/#" + urllib.parse.urlencode({"send": MESSAGE, "max_tokens": N, "key": key})
    target = cdp("Target.createTarget", {"url": url})["targetId"]
    session = cdp("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    state = wait_for(session, """(() => { const b = document.querySelectorAll('.assistant');
        const last = b[b.length - 1];
        return last && last.dataset.done ? {content: last.querySelector('.content').textContent,
          error: (last.querySelector('.error') || {}).textContent || '',
          model: document.getElementById('model').textContent,
          stats: document.getElementById('stats').textContent} : null; })()""", "the reply")
    if state["error"]:
        fail("the page shows an error: " + state["error"])
    if state["content"] != expected:
        fail(f"page reply {state['content']!r} != API reply {expected!r}")
    print("ok: streamed reply on the page equals the API's")
    if state["model"] != model:
        fail(f"model shown {state['model']!r}, served {model!r}")
    if "tok/s" not in state["stats"] or not state["stats"].startswith(str(N) + " tokens"):
        fail(f"stats line {state['stats']!r}")
    print("ok: model name and tokens/s shown:", state["stats"])

    # The stop button: a long reply, stopped once it streams, is cancelled on the server.
    before = metric("anvil_cancelled_total")
    evaluate(session, "document.getElementById('input').value = 'Write a long story';"
                      "opts.max_tokens = 400; opts.ignore_eos = true;"
                      "document.getElementById('form').requestSubmit(); true")
    wait_for(session, """(() => { const b = document.querySelectorAll('.assistant');
        return b.length == 2 && b[1].querySelector('.content').textContent.length > 0; })()""", "the second reply")
    evaluate(session, "document.getElementById('stop').click(); true")
    wait_for(session, "document.querySelectorAll('.assistant')[1].dataset.done == '1'", "the stopped reply")
    deadline = time.time() + 30
    while metric("anvil_cancelled_total") < before + 1 and time.time() < deadline:
        time.sleep(0.1)
    if metric("anvil_cancelled_total") < before + 1:
        fail("stop did not cancel the request on the server")
    print("ok: the stop button cancels the sequence on the server")
finally:
    proc.kill()
    proc.wait()
    shutil.rmtree(profile, ignore_errors=True)
print("chat page checks passed")
