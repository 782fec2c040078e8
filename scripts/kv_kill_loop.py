#!/usr/bin/env python3
"""kill -9 loop for the durable KV store (issue 10; CI runs 3 iterations in tests/cli/kv_store_test.cpp).

Each iteration starts `anvil generate --session kN` on one store, kills it with SIGKILL at a random
point, runs `anvil kv verify` (must exit 0), and resumes the session: every recorded and resumed
token must equal the uninterrupted greedy run. Usage: scripts/kv_kill_loop.py [ITERATIONS] [--seed S]
"""
import argparse, json, os, random, shutil, signal, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser()
ap.add_argument("iterations", type=int, nargs="?", default=50)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--bin", default=os.path.join(ROOT, "build", "anvil"))
ap.add_argument("--model", default=os.path.join(ROOT, "models", "anvil-tiny-code-q4"))
ap.add_argument("-n", type=int, default=1500)
args = ap.parse_args()
rng = random.Random(args.seed)
prompt = "def fibonacci(n):\n"
store = tempfile.mkdtemp(prefix="anvil-kill-")
base = [args.bin, "generate", "-m", args.model, "--temp", "0", "--json", "--ignore-eos"]

def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stdout

code, out = run(base + ["--no-kv-store", "-p", prompt, "-n", str(args.n + 40)])
gen = json.loads(out.strip().splitlines()[-1])["ids"]
code, out = run([args.bin, "tokenize", "-m", args.model, "-p", prompt, "--json"])
ref = json.loads(out)["ids"] + gen

failures, resumed, empty = 0, 0, 0
t0 = time.time()
for it in range(args.iterations):
    name = "k%d" % it
    p = subprocess.Popen(base + ["--kv-store", store, "-p", prompt, "-n", str(args.n), "--session", name,
                                 "--kv-flush-ms", "10"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(rng.uniform(0.1, 1.0))
    p.send_signal(signal.SIGKILL)
    p.wait()
    code, out = run([args.bin, "kv", "verify", "--kv-store", store])
    if code != 0:
        failures += 1
        print("iteration %d: verify failed:\n%s" % (it, out))
        continue
    code, out = run([args.bin, "kv", "show", name, "--kv-store", store, "--json"])
    if code != 0:
        empty += 1  # killed before the first flush
        continue
    recorded = json.loads(out)["ids"]
    code, out = run(base + ["--kv-store", store, "--session", name, "--resume", "-n", "20"])
    allids = json.loads(out.strip().splitlines()[-1])["session_ids"] if code == 0 else None
    if recorded != ref[:len(recorded)] or allids is None or allids != ref[:len(allids)]:
        failures += 1
        print("iteration %d: resumed tokens differ from the uninterrupted run (recorded %d)" % (it, len(recorded)))
    else:
        resumed += 1
        print("iteration %d: killed at %d tokens, verify ok, resume exact" % (it, len(recorded)))
shutil.rmtree(store)
print("%d iterations in %.0f s: %d resumed exactly, %d killed before the first flush, %d failures"
      % (args.iterations, time.time() - t0, resumed, empty, failures))
sys.exit(1 if failures else 0)
