#!/usr/bin/env python3
"""kill -9 probe of the durable KV store's session paths (scripts/kv_kill_loop.py covers a plain
recording; this one the paths where the writer rewrites a session's row in the commit of each of its
pages: kvstore.h, invariants 7 and 8).

Scenarios (--scenario, repeatable; default all), each ITERATIONS times, a store of its own each time
and XDG_CACHE_HOME in a scratch directory:
  prefill  anvil generate --session on a new session with a long prompt, killed mid-prefill or decode
  resume   generate --session --resume with an appended prompt, killed mid-turn
  fork     generate --session --fork NEW, killed mid-turn (the source must stay as it was)
  drop     anvil run turns on a session past --ctx (its oldest tokens/turns dropped, so the recorded
           tokens change), killed mid-turn; completion mode on --model, chat on --synthetic tiny
  gc       a recording under --kv-store-max with `kv gc --max` looping beside it (two processes)
  cap      a recording under a tight --kv-store-max with anonymous generate traffic beside it
  serve    anvil serve with a request naming a session (and an anonymous one), killed mid-turn;
           /v1/completions on --model, /v1/chat/completions on --synthetic tiny
After each kill: `kv verify` is clean; `kv show` has the session with tokens that are a prefix of
the uninterrupted run's (or, killed before the turn's first commit, the tokens it had); resuming it
on a copy of the store (generate --resume; for a session generate does not continue, anvil run's or
a chat, its tokens as --ids without a session, which restores the same pages and tail), greedy,
continues exactly as a run without the store does from those tokens (or as the uninterrupted run);
the resume restores from the store at least the durable tokens it listed (store_prompt_tokens);
verify is clean again. Kills land at a random fraction of the uninterrupted
turn's own wall time. Usage: scripts/kv_crash_probe.py [ITERATIONS] [--scenario S] [--seed N]
"""
import argparse, json, os, random, shutil, signal, socket, subprocess, sys, tempfile, threading, time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser()
ap.add_argument("iterations", type=int, nargs="?", default=10)
ap.add_argument("--scenario", action="append", choices=["prefill", "resume", "fork", "drop", "gc", "cap", "serve"])
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--bin", default=os.path.join(ROOT, "build", "anvil"))
ap.add_argument("--model", default="/work/shared/fixtures/anvil-tiny-code")
args = ap.parse_args()
rng = random.Random(args.seed)
scratch = tempfile.mkdtemp(prefix="anvil-crash-probe-")
ENV = dict(os.environ, XDG_CACHE_HOME=scratch)
MODEL = ["-m", args.model]
CHAT_MODEL = ["--synthetic", "tiny"]
TEXT = "\n".join("def f_%d(a, b):\n    return a * %d + b\n" % (i, (i * 37) % 97 + 1) for i in range(120))


def run(cmd, check=False):
    r = subprocess.run([args.bin] + cmd, capture_output=True, text=True, env=ENV, timeout=900)
    if check and r.returncode != 0:
        sys.exit("failed: anvil %s\n%s" % (" ".join(cmd)[:300], r.stderr[-2000:]))
    return r


def last_json(s):
    lines = [l for l in s.strip().splitlines() if l.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def gen(a, model=MODEL, check=True):
    r = run(["generate"] + model + ["--temp", "0", "--json", "--ignore-eos"] + a, check)
    return r, (last_json(r.stdout) if r.returncode == 0 else None)


def show(store, name):
    r = run(["kv", "show", name, "--kv-store", store, "--json"])
    return last_json(r.stdout) if r.returncode == 0 else None


def verify(store):
    r = run(["kv", "verify", "--kv-store", store, "--json"])
    j = last_json(r.stdout)
    return None if r.returncode == 0 and j is not None and not j["problems"] else (r.returncode, j)


def killed(cmd, delay):
    p = subprocess.Popen([args.bin] + cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    time.sleep(delay)
    p.send_signal(signal.SIGKILL)
    p.wait()


def copy(store, to):
    shutil.rmtree(to, ignore_errors=True)
    shutil.copytree(store, to)
    return to


class Probe:
    def __init__(self, name):
        self.name, self.n, self.failures, self.outcomes = name, 0, [], {}

    def bad(self, msg):
        self.failures.append("iteration %d: %s" % (self.n, msg))
        print("  FAIL %s %s" % (self.name, self.failures[-1]), flush=True)

    def check(self, store, name, ref=None, gen_from=0, before=None, model=MODEL, by_ids=False):
        """The checks after a kill; ref: the uninterrupted run's tokens (model output from gen_from on).
        by_ids: a session generate may not continue (anvil run's, a chat): its tokens are sent as a
        prompt without a session instead, which restores the same pages and tail from the store."""
        v = verify(store)
        if v:
            return self.bad("verify: %s" % (v,))
        s = show(store, name)
        if s is None:
            self.outcomes["no row yet"] = self.outcomes.get("no row yet", 0) + 1
            return
        T, D = s["ids"], s["durable_tokens"]
        if ref is not None and T != ref[:len(T)] and T != before:
            self.bad("session tokens (%d) are neither a prefix of the uninterrupted run's (%d) nor what it had" %
                     (len(T), len(ref)))
        # Resumed on a copy, so that the session (and its conversation) stays as the kill left it.
        cp = copy(store, store + ".resumed")
        how = ["--ids", ",".join(map(str, T))] if by_ids else ["--session", name, "--resume"]
        r, j = gen(["--kv-store", cp, "-n", "6"] + how, model, check=False)
        if j is None:
            return self.bad("resume failed: %s" % r.stderr[-300:])
        if ref is not None and len(T) >= gen_from and len(T) + 6 <= len(ref) and T == ref[:len(T)]:
            want = ref[len(T):len(T) + 6]
        else:
            want = gen(["--no-kv-store", "--ids", ",".join(map(str, T)), "-n", "6"], model)[1]["ids"]
        if j["ids"] != want:
            self.bad("resumed from %d tokens (%d durable): %s, a run without the store: %s" % (len(T), D, j["ids"], want))
        if j["store_prompt_tokens"] < min(D, len(T) - 1):
            self.bad("the resume restored %d tokens from the store; %d were listed durable" % (j["store_prompt_tokens"], D))
        v = verify(cp)
        if v:
            self.bad("verify after the resume: %s" % (v,))
        shutil.rmtree(cp, ignore_errors=True)
        key = "mid-turn" if T != before else "before the turn's first commit"
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
        print("  %s %d: %d tokens, %d durable, %d restored" % (self.name, self.n, len(T), D, j["store_prompt_tokens"]),
              flush=True)


def timed(f):
    t0 = time.time()
    out = f()
    return out, time.time() - t0


def new_store():
    return tempfile.mkdtemp(prefix="st", dir=scratch)


def base_session(store):
    gen(["--kv-store", store, "-p", TEXT[:1500], "-n", "40", "--session", "base"])
    return show(store, "base")["ids"]


def flush_flags():
    return ["--kv-flush-ms", rng.choice(["10", "100"]), "--kv-flush-pages", rng.choice(["1", "8", "64"])]


def prefill(p):
    store = new_store()
    a = ["-p", TEXT, "-n", "120", "--session", "s"]
    (_, j), dur = timed(lambda: gen(["--kv-store", copy(store, store + ".ref")] + a))
    killed(["generate"] + MODEL + ["--temp", "0", "--ignore-eos", "--kv-store", store] + a + flush_flags(),
           rng.uniform(0.05, 1.0) * dur)
    p.check(store, "s", j["session_ids"], len(j["session_ids"]) - len(j["ids"]))


def resume_or_fork(p, fork):
    store = new_store()
    before = base_session(store)
    a = ["--session", "base"] + (["--fork", "f"] if fork else ["--resume"]) + \
        ["-p", TEXT[1500:1500 + rng.randint(100, 2500)], "-n", "150"]
    (_, j), dur = timed(lambda: gen(["--kv-store", copy(store, store + ".ref")] + a))
    killed(["generate"] + MODEL + ["--temp", "0", "--ignore-eos", "--kv-store", store] + a + flush_flags(),
           rng.uniform(0.05, 1.0) * dur)
    p.check(store, "f" if fork else "base", j["session_ids"], len(j["session_ids"]) - len(j["ids"]), before)
    if fork and show(store, "base")["ids"] != before:
        p.bad("the fork's source changed")


def drop(p, chat):
    model = CHAT_MODEL if chat else MODEL
    store = new_store()

    def turn(st, line, resume, n):
        return ["run"] + model + ["--temp", "0", "--kv-store", st, "--session", "s", "-p", line, "-n", str(n),
                                  "--ctx", "320"] + (["--resume"] if resume else [])
    turns = rng.randint(3, 6)
    for k in range(turns):
        run(turn(store, "def add_%d(a, b):\n    return a + b" % k, k > 0, 60), check=True)
    before = show(store, "s")["ids"]
    line = "def sub_%d(a, b):\n    return a - b" % turns
    ref_store = copy(store, store + ".ref")
    r, dur = timed(lambda: run(turn(ref_store, line, True, 80), check=True))
    # Most of a run's time is loading the model: the kill lands in the turn's last part.
    killed(turn(store, line, True, 80), max(0.05, dur - rng.uniform(0.0, 0.6)))
    p.check(store, "s", show(ref_store, "s")["ids"], 10**9, before, model, by_ids=True)
    if run(turn(store, "x = 1", True, 8)).returncode != 0:
        p.bad("the next turn failed after the kill")
    v = verify(store)
    if v:
        p.bad("verify after the next turn: %s" % (v,))


def beside(p, what):
    store = new_store()
    for k in range(3):
        gen(["--kv-store", store, "-p", TEXT[k * 900:(k + 1) * 900], "-n", "10", "--kv-store-max", "2M"])
    cap = rng.choice(["1", "2M", "4M"])
    a = ["-p", TEXT, "-n", "150", "--session", "s", "--kv-store-max", cap]
    (_, j), dur = timed(lambda: gen(["--kv-store", copy(store, store + ".ref")] + a))
    stop, errors = threading.Event(), []

    def side():
        i = 0
        while not stop.is_set():
            if what == "gc":
                r = run(["kv", "gc", "--max", rng.choice(["0", "1", "1M"]), "--kv-store", store])
            else:
                r = run(["generate"] + MODEL + ["--kv-store", store, "-p", TEXT[(i * 613) % 3000:][:1200], "-n", "5",
                                                "--kv-store-max", cap, "--kv-flush-ms", "10"])
            if r.returncode != 0:
                errors.append(r.stderr[-300:])
            i += 1
    th = threading.Thread(target=side)
    th.start()
    killed(["generate"] + MODEL + ["--temp", "0", "--ignore-eos", "--kv-store", store] + a + flush_flags(),
           rng.uniform(0.05, 1.0) * dur)
    stop.set()
    th.join()
    for e in errors:
        p.bad("%s beside the recording failed: %s" % (what, e))
    p.check(store, "s", j["session_ids"], len(j["session_ids"]) - len(j["ids"]))


def serve(p, chat):
    model = CHAT_MODEL if chat else MODEL

    def start(store):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        proc = subprocess.Popen([args.bin, "serve"] + model + ["--kv-store", store, "--port", str(port), "--no-warmup",
                                                              "--parallel", "2", "--alias", "m"] + flush_flags()[:2],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
        for _ in range(600):
            try:
                urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=1).read()
                return proc, port
            except Exception:
                time.sleep(0.1)
        sys.exit("anvil serve did not start")

    def post(port, text, n, session="s"):
        b = {"model": "m", "max_tokens": n, "temperature": 0, "ignore_eos": True}
        if session:
            b["session"] = session
        if chat:
            b["messages"] = [{"role": "user", "content": text}]
        else:
            b["prompt"] = text
        req = urllib.request.Request("http://127.0.0.1:%d/v1/%s" % (port, "chat/completions" if chat else "completions"),
                                     data=json.dumps(b).encode(), headers={"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req, timeout=300).read())

    def stop(proc):
        proc.send_signal(signal.SIGTERM)
        proc.wait()
    store = new_store()
    proc, port = start(store)
    post(port, TEXT[:rng.randint(300, 1500)], 30)
    stop(proc)
    before = show(store, "s")["ids"]
    ref_store = copy(store, store + ".ref")
    text = TEXT[1500:1500 + rng.randint(200, 2500)]
    proc, port = start(ref_store)
    _, dur = timed(lambda: post(port, text, 200))
    stop(proc)
    proc, port = start(store)
    def quiet(f):
        try:
            f()
        except Exception:
            pass  # the kill cuts the requests off
    threads = [threading.Thread(target=quiet, args=(f,)) for f in (lambda: post(port, text, 200),
                                                                  lambda: post(port, TEXT[2000:3000], 50, None))]
    for t in threads:
        t.start()
    time.sleep(rng.uniform(0.05, 1.0) * dur)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for t in threads:
        t.join()
    p.check(store, "s", show(ref_store, "s")["ids"], 10**9, before, model, by_ids=True)
    proc, port = start(store)
    try:
        post(port, "x = 1", 5)
    except Exception as e:
        p.bad("the server could not continue the session after the kill: %s" % e)
    stop(proc)
    v = verify(store)
    if v:
        p.bad("verify after the next request: %s" % (v,))


SCENARIOS = {
    "prefill": [("prefill", prefill)],
    "resume": [("resume", lambda p: resume_or_fork(p, False))],
    "fork": [("fork", lambda p: resume_or_fork(p, True))],
    "drop": [("drop (completion)", lambda p: drop(p, False)), ("drop (chat)", lambda p: drop(p, True))],
    "gc": [("gc beside", lambda p: beside(p, "gc"))],
    "cap": [("tight cap", lambda p: beside(p, "cap"))],
    "serve": [("serve (completions)", lambda p: serve(p, False)), ("serve (chat)", lambda p: serve(p, True))],
}
probes = []
t0 = time.time()  # (after the scratch directory and the flags: the scenarios' time)
for s in args.scenario or list(SCENARIOS):
    for name, f in SCENARIOS[s]:
        p = Probe(name)
        probes.append(p)
        for p.n in range(args.iterations):
            f(p)
            for d in os.listdir(scratch):
                if d.startswith("st"):
                    shutil.rmtree(os.path.join(scratch, d), ignore_errors=True)
shutil.rmtree(scratch, ignore_errors=True)
print("%.0f s" % (time.time() - t0))
for p in probes:
    print("%-20s %d iterations, %d failures; killed: %s" % (p.name, args.iterations, len(p.failures), p.outcomes))
sys.exit(1 if any(p.failures for p in probes) else 0)
