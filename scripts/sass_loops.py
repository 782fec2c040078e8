#!/usr/bin/env python3
"""The loops of CUDA kernels in SASS (cuobjdump --dump-sass output), by instruction class: for each
function matching PATTERN, each backward branch whose body holds an HMMA/IMMA or IDP (dp4a) (a main loop)
is listed with its instruction count per opcode. For reading where a mat-vec step's instructions
go without device time (docs/architecture.md, "Where the time goes").
Usage: sass_loops.py FILE.sass [PATTERN]"""
import re
import sys
from collections import Counter


def functions(text):
    cur, lines = None, []
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            if cur:
                yield cur, lines
            cur, lines = m.group(1), []
        elif cur:
            lines.append(line)
    if cur:
        yield cur, lines


def parse(lines):
    ins = []  # (addr, opcode, text)
    for line in lines:
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(3), m.group(3) + m.group(4)))
    return ins


def main():
    text = open(sys.argv[1]).read()
    pat = sys.argv[2] if len(sys.argv) > 2 else "."
    for name, lines in functions(text):
        if not re.search(pat, name):
            continue
        ins = parse(lines)
        addr_index = {a: i for i, (a, _, _) in enumerate(ins)}
        print(f"== {name}  ({len(ins)} instructions)")
        for i, (a, op, t) in enumerate(ins):
            if not op.startswith("BRA"):
                continue
            m = re.search(r"0x([0-9a-f]+)", t)
            if not m:
                continue
            target = int(m.group(1), 16)
            if target >= a or target not in addr_index:
                continue
            body = ins[addr_index[target]:i + 1]
            ops = Counter(o.split(".")[0] for _, o, _ in body)
            if not (ops["HMMA"] or ops["IMMA"] or ops["IDP"]):
                continue
            top = ", ".join(f"{k} {v}" for k, v in ops.most_common(14))
            print(f"  loop 0x{target:x}..0x{a:x}: {len(body)} instructions, HMMA {ops['HMMA']}, IDP {ops['IDP']}: {top}")


if __name__ == "__main__":
    main()
