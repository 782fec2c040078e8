#!/usr/bin/env python3
"""Summarize an `ncu --metrics ...` log of decode kernels (scripts/cuda_check.sh issue): per kernel
name, the launches, mean time, DRAM bytes, warp instructions, issue-slot use and the two floors:
  issue floor = warp instructions / (SMs * 4 schedulers * SM clock)  (one instruction per scheduler per cycle)
  DRAM floor  = bytes read / COPY_GBS (the device copy bandwidth anvil bench measures: 4,260 GB/s on the H200)
With SORT=1 in the environment the kernels are listed by their total time (launches x mean), largest
first, with that total as a column; else in the order they first ran.
Usage: ncu_issue_summary.py LOG [SMS=132] [COPY_GBS=4260]"""
import os
import re
import sys
from collections import defaultdict

UNITS = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3,
         "second": 1, "ns": 1e-9, "us": 1e-6, "ms": 1e-3, "hz": 1, "Khz": 1e3, "Mhz": 1e6, "Ghz": 1e9,
         "cycle/nsecond": 1e9, "cycle/usecond": 1e6, "cycle/second": 1, "inst": 1, "Kinst": 1e3, "Minst": 1e6,
         "warp": 1, "%": 1, "": 1}


def main():
    path = sys.argv[1]
    sms = int(sys.argv[2]) if len(sys.argv) > 2 else 132
    copy = float(sys.argv[3]) if len(sys.argv) > 3 else 4260.0
    text = open(path, errors="replace").read()
    # A kernel's block: a header line "  name(args) (grid)x(block), Context 1, Stream .., Device 0, CC 9.0"
    # followed by "    metric  unit  value" lines.
    kernels = []
    cur = None
    for line in text.splitlines():
        h = re.match(r"^  (\S.*?)\s+\((\d+, \d+, \d+)\)x\((\d+), \d+, \d+\), Context", line)
        if h:
            name = re.sub(r"\(anonymous namespace\)::|<?unnamed>::", "", h.group(1))
            name = re.sub(r"^void ", "", name)
            name = re.split(r"[<(]", name)[0].split("::")[-1]
            grid = h.group(2).replace(", 1, 1", "").replace(" ", "")
            cur = {"name": f"{name} [{grid}]x{h.group(3)}"}
            kernels.append(cur)
            continue
        mm = re.match(r"^\s+([a-z_]+__[\w.]+)\s+(\S+)?\s+([\d.,]+)\s*$", line)
        if mm and cur is not None:
            unit = mm.group(2) or ""
            val = float(mm.group(3).replace(",", ""))
            cur[mm.group(1)] = val * UNITS.get(unit, 1)
    if not kernels:
        print("no kernels found in", path)
        return
    agg = defaultdict(lambda: defaultdict(float))
    order = []
    for k in kernels:
        k["name"] += f" {k.get('dram__bytes_read.sum', 0) / 1e6:.0f}MB"
        a = agg[k["name"]]
        if k["name"] not in order:
            order.append(k["name"])
        a["n"] += 1
        for key, v in k.items():
            if key != "name":
                a[key] += v
    if os.environ.get("SORT") == "1":
        order.sort(key=lambda nm: -agg[nm].get("gpu__time_duration.sum", 0))
    print(f"{'kernel':44} {'n':>3} {'total us':>9} {'time us':>8} {'MB':>7} {'TB/s':>5} {'Kinst':>7} {'issue%':>6} {'warps':>5} "
          f"{'issue floor us':>14} {'DRAM floor us':>13}")
    tot_t = tot_i = tot_d = 0.0
    for name in order:
        a = agg[name]
        n = a["n"]
        t = a.get("gpu__time_duration.sum", 0) / n
        b = a.get("dram__bytes_read.sum", 0) / n
        inst = a.get("smsp__inst_executed.sum", 0) / n
        clk = a.get("sm__cycles_elapsed.avg.per_second", 0) / n or 1.98e9
        issue = a.get("smsp__issue_active.avg.pct_of_peak_sustained_active", 0) / n
        warps = a.get("smsp__warps_active.avg.per_cycle_active", 0) / n
        fi = inst / (sms * 4 * clk) * 1e6
        fd = b / (copy * 1e9) * 1e6
        tot_t += t * n
        tot_i += fi * n
        tot_d += fd * n
        print(f"{name[:44]:44} {int(n):3d} {t*n*1e6:9.1f} {t*1e6:8.2f} {b/1e6:7.2f} {b/t/1e12 if t else 0:5.2f} {inst/1e3:7.1f} "
              f"{issue:6.1f} {warps:5.2f} {fi:14.2f} {fd:13.2f}")
    print(f"{'all':44} {len(kernels):3d} {tot_t*1e6:9.1f} {'':8} {'':7} {'':5} {'':7} {'':6} {'':5} {tot_i:14.1f} {tot_d:13.1f}")


if __name__ == "__main__":
    main()
