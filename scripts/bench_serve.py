#!/usr/bin/env python3
"""Load test for `anvil serve` (BENCH.md's server protocol), loopback only, bounded.

N concurrent streams, each one /v1/completions request with a PROMPT-token synthetic prompt
(deterministic ids, seed = stream index) and MAX generated tokens, greedy, EOS ignored. Prints, per
N: aggregate decode tok/s (tokens after each stream's first / time from the first first-token to the
last token), steady-state decode tok/s (only while every stream is decoding), time to first token
p50/p99, inter-token latency p50/p99, and its p99 in the steady-state window (without the ramp, where
every running stream waits through the late starters' prompt chunks). With --prefix, also the
repeated-system-prompt case: TTFT of a PREFIX-token prompt, then of a request sharing it. Where
the server reports its step counters in /metrics, each level also prints the server's mean step, its
forward pass, the host's part (the rest) and the forward's own preparation (prep) over that level's steps.

The client must not be what it measures: a stream's thread only stamps the arrival time of each
server-sent event and keeps its bytes (the JSON is parsed after the stream ends), and the streams are
spread over worker processes (--procs; by default up to 8, about 4 streams each), so that no single
interpreter lock serializes 32 or 64 readers. Arrival times come from time.perf_counter()
(CLOCK_MONOTONIC on Linux: one clock for every process).

Stdlib only. Every request has a timeout; the whole run stops after --deadline seconds.
  python3 scripts/bench_serve.py --port 8080 --streams 1,8,32 --prompt 256 --max 128 [--no-logprobs]
"""
import argparse
import http.client
import json
import multiprocessing
import os
import random
import statistics
import sys
import threading
import time


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


LOGPROBS = True  # main() sets it from --no-logprobs


def stream_one(host, port, key, prompt_ids, max_tokens, timeout, out, usage=None):
    """One streamed completion; appends (t_submit, [token arrival times], error) to out, and the
    final chunk's usage to `usage` when given. While streaming, only the arrival time and the bytes
    of each event are kept; they are parsed after the stream ends."""
    req = {"prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    if usage is not None:
        req["stream_options"] = {"include_usage": True}
    if LOGPROBS:
        req["logprobs"] = 0  # one chunk per token, even an empty-text one
    body = json.dumps(req)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    t0 = time.perf_counter()
    events, err = [], None  # (arrival time, event bytes)
    try:
        c = http.client.HTTPConnection(host, port, timeout=timeout)
        c.request("POST", "/v1/completions", body, headers)
        r = c.getresponse()
        if r.status != 200:
            err = f"HTTP {r.status}: {r.read()[:200]!r}"
        else:
            buf = b""
            while True:
                chunk = r.read1(65536)
                if not chunk:
                    break
                now = time.perf_counter()
                buf += chunk
                while b"\n\n" in buf:
                    line, buf = buf.split(b"\n\n", 1)
                    events.append((now, line))
        c.close()
    except Exception as e:  # a failed stream is reported, not fatal
        err = repr(e)
    times = []
    for now, line in events:
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        try:
            j = json.loads(line[6:])
        except ValueError as e:
            err = err or f"bad event {line[:80]!r}: {e}"
            continue
        if "error" in j:
            err = j["error"]["message"]
            continue
        if usage is not None and j.get("usage"):
            usage.append(j["usage"])
        if not j.get("choices"):
            continue
        ch = j["choices"][0]
        if ch.get("logprobs") and ch["logprobs"]["tokens"]:
            times.extend([now] * len(ch["logprobs"]["tokens"]))
        elif not LOGPROBS and ch.get("text"):
            times.append(now)  # a text chunk (a token, or a few held back)
    out.append((t0, times, err))


def prompt_ids(i, n, vocab):
    rng = random.Random(i)
    return [rng.randrange(1000, vocab) for _ in range(n)]


def worker(job):
    """One process's share of the streams, one thread each, released together at `start_at`. The
    processes are forked after main() set LOGPROBS, so they inherit it."""
    host, port, key, indices, n_prompt, max_tokens, timeout, vocab, start_at = job
    results, threads = [], []
    for i in indices:
        threads.append(threading.Thread(target=stream_one, args=(host, port, key, prompt_ids(i, n_prompt, vocab),
                                                                 max_tokens, timeout, results)))
    time.sleep(max(0.0, start_at - time.perf_counter()))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    return list(results)


def metric_values(args, names):
    """The named counters from the server's /metrics ({} where it cannot be read)."""
    try:
        c = http.client.HTTPConnection(args.host, args.port, timeout=30)
        c.request("GET", "/metrics", headers={"Authorization": "Bearer " + args.api_key} if args.api_key else {})
        text = c.getresponse().read().decode()
    except (OSError, http.client.HTTPException):
        return {}
    vals = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in names:
            vals[parts[0]] = float(parts[1])
    return vals


PREFIX_COUNTERS = ("anvil_steps_total", "anvil_step_seconds_total", "anvil_step_forward_seconds_total",
                   "anvil_kv_store_restore_seconds_total")


def step_counters(args):
    """The server's step counters from /metrics (steps, their seconds, their forward passes' seconds);
    None where the server does not report them."""
    try:
        c = http.client.HTTPConnection(args.host, args.port, timeout=30)
        c.request("GET", "/metrics", headers={"Authorization": "Bearer " + args.api_key} if args.api_key else {})
        text = c.getresponse().read().decode()
    except (OSError, http.client.HTTPException):
        return None
    vals = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in ("anvil_steps_total", "anvil_step_seconds_total",
                                            "anvil_step_forward_seconds_total", "anvil_step_prep_seconds_total"):
            vals[parts[0]] = float(parts[1])
    if not all(k in vals for k in ("anvil_steps_total", "anvil_step_seconds_total", "anvil_step_forward_seconds_total")):
        return None
    return (vals["anvil_steps_total"], vals["anvil_step_seconds_total"], vals["anvil_step_forward_seconds_total"],
            vals.get("anvil_step_prep_seconds_total"))  # prep: None from a server before session 24


def run_level(args, n, vocab):
    before = step_counters(args)
    procs = args.procs if args.procs > 0 else max(1, min(8, (n + 3) // 4, os.cpu_count() or 1))
    procs = min(procs, n)
    shares = [list(range(k, n, procs)) for k in range(procs)]
    start_at = time.perf_counter() + 0.5  # every process has its threads made by then
    jobs = [(args.host, args.port, args.api_key, sh, args.prompt, args.max, args.timeout, vocab, start_at)
            for sh in shares]
    results = []
    if procs == 1:
        results = worker(jobs[0])
    else:
        with multiprocessing.get_context("fork").Pool(procs) as pool:
            for part in pool.map(worker, jobs):
                results.extend(part)
    errors = [e for _, _, e in results if e]
    ok = [(t0, ts) for t0, ts, e in results if not e and ts]
    ttft = [ts[0] - t0 for t0, ts in ok]
    itl = [b - a for _, ts in ok for a, b in zip(ts, ts[1:])]
    first = min(ts[0] for _, ts in ok) if ok else 0
    last = max(ts[-1] for _, ts in ok) if ok else 0
    decoded = sum(len(ts) - 1 for _, ts in ok)
    agg = decoded / (last - first) if last > first else float("nan")
    # Steady state: the window in which every stream is past its first token and none has finished,
    # so prefill steps of late starters do not count as decode time.
    lo, hi = (max(ts[0] for _, ts in ok), min(ts[-1] for _, ts in ok)) if ok else (0, 0)
    inside = sum(sum(1 for t in ts if lo < t <= hi) for _, ts in ok)
    steady = inside / (hi - lo) if hi > lo else float("nan")
    # Inter-token latency inside that window too: the ramp's prefill steps (every running stream
    # waits through each chunk of the late starters' prompts) excluded.
    itl_steady = [b - a for _, ts in ok for a, b in zip(ts, ts[1:]) if lo <= a and b <= hi]
    print(f"streams={n:3d} ok={len(ok):3d} errors={len(errors)} aggregate_decode_tok_s={agg:9.1f} "
          f"steady_decode_tok_s={steady:9.1f} "
          f"ttft_p50={pct(ttft, 50) * 1e3:8.1f}ms ttft_p99={pct(ttft, 99) * 1e3:8.1f}ms "
          f"itl_p50={pct(itl, 50) * 1e3:7.1f}ms itl_p99={pct(itl, 99) * 1e3:7.1f}ms "
          f"steady_itl_p99={pct(itl_steady, 99) * 1e3:7.1f}ms", flush=True)
    after = step_counters(args) if before else None
    if before and after and after[0] > before[0]:
        # The server's own figures over this level's steps (ramp included): the whole step, its forward
        # pass, and the rest, the host's part that the device waits through; with prep, the forward's
        # own host part before its kernels are issued (building and uploading the batch), which a GPU
        # waits through too.
        k = after[0] - before[0]
        step, fwd = (after[1] - before[1]) / k, (after[2] - before[2]) / k
        prep = f" prep={(after[3] - before[3]) / k * 1e3:.3f}ms" if after[3] is not None and before[3] is not None else ""
        print(f"  server: steps={k:.0f} step={step * 1e3:.3f}ms forward={fwd * 1e3:.3f}ms host={(step - fwd) * 1e3:.3f}ms{prep}",
              flush=True)
    for e in errors[:3]:
        print("  error:", e)
    return errors


def prefix_case(args, vocab):
    rng = random.Random(1234)
    shared = [rng.randrange(1000, vocab) for _ in range(args.prefix)]
    out, cached, parts = [], [], []
    for k in range(2):
        res, usage = [], []
        before = metric_values(args, PREFIX_COUNTERS)
        stream_one(args.host, args.port, args.api_key, shared + [rng.randrange(1000, vocab) for _ in range(16)], 1,
                   args.timeout, res, usage)
        t0, ts, err = res[0]
        if err or not ts:
            print("prefix case failed:", err)
            return
        out.append(ts[0] - t0)
        # Where the request's time went, from the server's counters (one token: its prefill step only):
        # the steps, their forward passes, and the store's restores (only with a store attached).
        after = metric_values(args, PREFIX_COUNTERS)
        d = {k: after[k] - before[k] for k in PREFIX_COUNTERS if k in before and k in after}
        if "anvil_steps_total" in d:
            parts.append(f"request {k + 1}: steps={d['anvil_steps_total']:.0f} "
                         f"step={d.get('anvil_step_seconds_total', 0) * 1e3:.1f}ms "
                         f"forward={d.get('anvil_step_forward_seconds_total', 0) * 1e3:.1f}ms"
                         + (f" restore={d['anvil_kv_store_restore_seconds_total'] * 1e3:.1f}ms"
                            if "anvil_kv_store_restore_seconds_total" in d else ""))
        details = (usage[-1].get("prompt_tokens_details") or {}) if usage else {}
        cached.append(details.get("cached_tokens", "?"))
    print(f"prefix={args.prefix} ttft_first={out[0] * 1e3:.1f}ms ttft_repeat={out[1] * 1e3:.1f}ms "
          f"ratio={out[1] / out[0]:.3f} cached_tokens={cached[0]}/{cached[1]}", flush=True)
    for line in parts:
        print("  " + line, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--api-key", default="")
    ap.add_argument("--streams", default="1,8,32")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--max", type=int, default=128)
    ap.add_argument("--prefix", type=int, default=0, help="also time a repeated PREFIX-token prompt (0: skip)")
    ap.add_argument("--vocab", type=int, default=0, help="ids are drawn below this (default: from /tokenize)")
    ap.add_argument("--timeout", type=float, default=300, help="per request, seconds")
    ap.add_argument("--procs", type=int, default=0,
                    help="worker processes the streams are spread over (0: up to 8, about 4 streams each)")
    ap.add_argument("--deadline", type=float, default=1800, help="whole run, seconds")
    ap.add_argument("--no-logprobs", action="store_true",
                    help="do not ask for logprobs (the server may then sample on the device); tokens are then "
                         "counted as text chunks, which can merge a token whose text is held back")
    args = ap.parse_args()
    global LOGPROBS
    LOGPROBS = not args.no_logprobs
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("bench_serve.py talks to loopback servers only")
    vocab = args.vocab
    if not vocab:
        c = http.client.HTTPConnection(args.host, args.port, timeout=30)
        h = {"Authorization": "Bearer " + args.api_key} if args.api_key else {}
        c.request("GET", "/v1/models", headers=h)
        m = json.loads(c.getresponse().read())
        print("model:", m["data"][0]["id"], "context:", m["data"][0].get("max_model_len"))
        vocab = 8000  # ids 1000..7999 exist in every vocabulary anvil loads
    start = time.time()
    failed = False
    for n in [int(x) for x in args.streams.split(",") if x]:
        if time.time() - start > args.deadline:
            print("deadline reached; stopping")
            break
        failed |= bool(run_level(args, n, vocab))
    if args.prefix and time.time() - start < args.deadline:
        prefix_case(args, vocab)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
