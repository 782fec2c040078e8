#!/usr/bin/env python3
"""Summarize a graph timeline written by a trace build (src/backend/cuda/trace.h).

    python3 scripts/trace_summary.py TRACE.txt [--layer N]

Each kernel instance of the replayed decode step (one %gridid) gets: its blocks, when its first
block started, when its blocks were released from the PDL wait (the previous kernel complete),
the phases it marks (the streamed mat-vec: 2 x staged, 3 loop done, 9 end) and its end. The step is
then split into, per kernel family:
  body     release of the kernel -> its last block's end (or the next kernel's release where the
           kernel marks no end),
  handoff  its last block's end -> the next kernel's release (PDL: completion, flush, wake-up),
and the mat-vecs' bodies further into staging, loop and epilogue (medians and maxima over blocks).
One middle layer is printed kernel by kernel. All times in microseconds.
"""
import argparse
import collections
import re
import shutil
import statistics
import subprocess
import sys


def demangle(names):
    if not names or not shutil.which("c++filt"):
        return names
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    return out[: len(names)] if len(out) >= len(names) else names


def family(name):
    n = name
    if "qgemv4_async_kernel" in n:
        return "matvec gate/up+swiglu" if re.search(r"qgemv4_async_kernel<true", n) else "matvec"
    for key, fam in (("rmsnorm", "norm"), ("rope_attn", "rope+attention"), ("qk_rope", "rope_kv"),
                     ("attn_tc", "attention"), ("attn_split", "attention"), ("attn_combine", "attention merge"),
                     ("argmax", "argmax"), ("embed", "embed"), ("add_kernel", "add"), ("route", "moe route"),
                     ("gate_up_stream", "moe gate/up"), ("down_stream", "moe down"), ("qgemm_batch", "batch matvec"),
                     ("gather", "gather"), ("sample", "sample")):
        if key in n:
            return fam
    return re.sub(r"\(.*", "", n)[:40]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--layer", type=int, default=-1, help="the layer printed in detail (default: the middle)")
    a = ap.parse_args()
    names, recs, header = [], [], ""
    with open(a.trace) as f:
        for line in f:
            if line.startswith("#"):
                header = line.strip()
            elif line.startswith("K "):
                names.append(line[2:].strip())
            elif line.startswith("R "):
                t, g, clk, blk, sm, ph = (int(x) for x in line.split()[1:])
                recs.append((t, g, clk, blk, sm, ph))
    print(header)
    if not recs:
        print("no records")
        return 1
    names = demangle(names)
    by_grid = collections.defaultdict(list)
    for r in recs:
        by_grid[r[1]].append(r)
    t0 = min(r[0] for r in recs)
    inst = []
    for g, rs in by_grid.items():
        blocks = collections.defaultdict(dict)
        for t, _, clk, blk, sm, ph in rs:
            blocks[blk][ph] = (t - t0) / 1000.0
        starts = [b[0] for b in blocks.values() if 0 in b]
        rel = [b[1] for b in blocks.values() if 1 in b]
        inst.append({"grid": g, "blocks": blocks, "start": min(starts) if starts else min(rel),
                     "last_start": max(starts) if starts else None,
                     "rel": min(rel) if rel else None, "rel_max": max(rel) if rel else None,
                     "end": max(b[9] for b in blocks.values() if 9 in b) if any(9 in b for b in blocks.values()) else None})
    # In launch order: a graph's launches have consecutive grid ids (with PDL a kernel's first block
    # may start before the previous kernel's first block does, so start times do not order them).
    inst.sort(key=lambda i: i["grid"])
    if len(names) != len(inst):
        print(f"note: {len(names)} kernel launches captured, {len(inst)} kernel instances traced; names by order")
    for i, k in enumerate(inst):
        k["name"] = names[i] if i < len(names) else "?"
        k["fam"] = family(k["name"])
    step_end = max(max(ph.get(9, ph.get(1, ph.get(0, 0))) for ph in k["blocks"].values()) for k in inst)
    print(f"step: {len(inst)} kernels, {step_end - inst[0]['start']:.1f} us from the first block's start to the last record")

    fam_body = collections.defaultdict(float)
    fam_hand = collections.defaultdict(float)
    fam_n = collections.Counter()
    for i, k in enumerate(inst):
        nxt = inst[i + 1]["rel"] if i + 1 < len(inst) and inst[i + 1]["rel"] is not None else None
        rel = k["rel"] if k["rel"] is not None else k["start"]
        end = k["end"] if k["end"] is not None else nxt
        if end is None:
            end = rel
        k["body"] = end - rel
        k["handoff"] = (nxt - k["end"]) if (nxt is not None and k["end"] is not None) else 0.0
        fam_body[k["fam"]] += k["body"]
        fam_hand[k["fam"]] += k["handoff"]
        fam_n[k["fam"]] += 1
    total = sum(fam_body.values()) + sum(fam_hand.values())
    print(f"\n{'family':28s} {'n':>4s} {'body':>9s} {'per':>7s} {'handoff':>9s} {'per':>6s} {'share':>6s}")
    for fam in sorted(fam_body, key=lambda f: -(fam_body[f] + fam_hand[f])):
        n = fam_n[fam]
        print(f"{fam:28s} {n:4d} {fam_body[fam]:9.1f} {fam_body[fam] / n:7.2f} {fam_hand[fam]:9.1f} "
              f"{fam_hand[fam] / n:6.2f} {100 * (fam_body[fam] + fam_hand[fam]) / total:5.1f}%")
    print(f"{'total':28s} {len(inst):4d} {sum(fam_body.values()):9.1f} {'':7s} {sum(fam_hand.values()):9.1f}")

    # The mat-vecs' phases, per launch shape (family, blocks).
    shape = collections.defaultdict(lambda: collections.defaultdict(list))
    for k in inst:
        if not k["fam"].startswith("matvec") and not k["fam"].startswith("moe"):
            continue
        key = (k["fam"], len(k["blocks"]))
        d = shape[key]
        rel = k["rel"]
        for b in k["blocks"].values():
            if 1 in b and 2 in b:
                d["wait->staged"].append(b[2] - b[1])
            if 2 in b and 3 in b:
                d["staged->loop end"].append(b[3] - b[2])
            if 3 in b and 9 in b:
                d["loop end->end"].append(b[9] - b[3])
            if 0 in b and rel is not None:
                d["start-release"].append(b[0] - rel)
            if 9 in b and rel is not None:
                d["release->block end"].append(b[9] - rel)
        d["body"].append(k["body"])
        d["handoff"].append(k["handoff"])
    if shape:
        print("\nmat-vec launches by shape (median / max over blocks; body and handoff: median over launches)")
        for key, d in sorted(shape.items()):
            parts = []
            for m in ("start-release", "wait->staged", "staged->loop end", "loop end->end", "release->block end"):
                v = d.get(m)
                if v:
                    parts.append(f"{m} {statistics.median(v):.2f}/{max(v):.2f}")
            print(f"  {key[0]} x {key[1]} blocks ({len(d['body'])} launches): body {statistics.median(d['body']):.2f}, "
                  f"handoff {statistics.median(d['handoff']):.2f}; " + "; ".join(parts))

    # Decode attention's phases (attention_decode_tc.cu: 2 every warp's positions done, 3 the warps'
    # states in shared memory, 4 the block's state merged, 5 past the first cluster barrier, 9 end).
    att = collections.defaultdict(list)
    for k in inst:
        if k["fam"] != "attention":
            continue
        for b in k["blocks"].values():
            prev = 1
            for ph, label in ((2, "wait->positions"), (3, "->warps stored"), (4, "->block merged"),
                              (5, "->cluster barrier"), (9, "->end")):
                if ph in b and prev in b:
                    att[label].append(b[ph] - b[prev])
                    prev = ph
    if att:
        print("\nattention phases (median / max over blocks and launches, us): " + "; ".join(
            f"{m} {statistics.median(v):.2f}/{max(v):.2f}" for m, v in att.items()))

    # One layer in detail: the kernels between two norms in the middle of the step.
    norms = [i for i, k in enumerate(inst) if k["fam"] == "norm"]
    if len(norms) >= 4:
        layer = a.layer if a.layer >= 0 else len(norms) // 4
        lo = norms[min(2 * layer, len(norms) - 3)]
        hi = norms[min(2 * layer + 2, len(norms) - 1)]
        print(f"\nlayer {layer}: kernels {lo}..{hi - 1}")
        print(f"{'kernel':28s} {'blocks':>6s} {'start':>8s} {'release':>8s} {'rel max':>8s} {'end':>8s} {'body':>7s} {'handoff':>7s}")
        for k in inst[lo:hi]:
            end = f"{k['end']:8.2f}" if k["end"] is not None else f"{'-':>8s}"
            rel = f"{k['rel']:8.2f}" if k["rel"] is not None else f"{'-':>8s}"
            relm = f"{k['rel_max']:8.2f}" if k["rel_max"] is not None else f"{'-':>8s}"
            print(f"{k['fam'][:28]:28s} {len(k['blocks']):6d} {k['start']:8.2f} {rel} {relm} {end} {k['body']:7.2f} {k['handoff']:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
