#!/usr/bin/env python3
"""Independent reference for JSON mode's automaton (src/runtime/json_constraint.h), built on
Python's json module and its strict UTF-8 codec.

  json_mode_reference.py corpus SEED N   prints N generated texts (valid and invalid), one a line:
                                         hex(text) TAB verdict(1/0) TAB known-viable prefix length
  json_mode_reference.py check FILE      reads hex texts, one a line, prints the verdict of each

The verdict is anvil's definition of an accepted text, written with Python's parsers:
  - the bytes decode as strict UTF-8 (no overlong forms, no encoded surrogates, nothing above U+10FFFF);
  - json.loads accepts the text, NaN/Infinity refused, and the value is an object;
  - no lone UTF-16 surrogate from a \\u escape (the decoded strings encode as strict UTF-8 again);
  - containers nest at most 64 deep;
  - at most 20 consecutive whitespace bytes outside strings, at most 2 before the object, none after it.
"""
import json
import random
import sys

MAX_DEPTH = 64
MAX_WS = 20
MAX_LEADING_WS = 2


def _no_constant(name):
    raise ValueError("constant " + name)


def _depth(v):
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    return 0


def _whitespace_ok(text):
    run, in_str, esc = 0, False, False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch in " \t\n\r":
            run += 1
            if run > MAX_WS:
                return False
            continue
        run = 0
        if ch == '"':
            in_str = True
    return text == text.rstrip(" \t\n\r") and len(text) - len(text.lstrip(" \t\n\r")) <= MAX_LEADING_WS


def accepted(data):
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    try:
        v = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return False
    if not isinstance(v, dict):
        return False
    try:
        json.dumps(v, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return _depth(v) <= MAX_DEPTH and _whitespace_ok(text)


# ---- the generator: texts written by hand (not json.dumps) so that every form of the grammar
# occurs: any number form, escapes of every kind, raw multi-byte UTF-8, whitespace runs.

CHARS = (
    [chr(c) for c in range(0x20, 0x7F)]
    + ["\x00", "\x01", "\x1f", "\x7f", "\t", "\n"]
    + ["\u00e9", "\u07ff", "\u0800", "\u4e2d", "\ud7ff", "\ue000", "\uffff", "\U00010000", "\U0001f600", "\U0010ffff"]
)


def gen_string(rng):
    out = ['"']
    for _ in range(rng.randint(0, 8)):
        c = rng.choice(CHARS)
        r = rng.random()
        if c == '"' or c == "\\" or ord(c) < 0x20:
            out.append({'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t"}.get(c, "\\u%04x" % ord(c)))
        elif r < 0.15:  # a \u escape (surrogate pairs for astral characters), upper or lower case hex
            units = c.encode("utf-16-be")
            for i in range(0, len(units), 2):
                h = "%04x" % int.from_bytes(units[i:i + 2], "big")
                out.append("\\u" + (h.upper() if rng.random() < 0.5 else h))
        elif r < 0.2:
            out.append(rng.choice(["\\/", "\\b", "\\f", "\\r", "\\n", "\\t"]))
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def gen_number(rng):
    s = "-" if rng.random() < 0.3 else ""
    s += "0" if rng.random() < 0.3 else str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 4)))
    if rng.random() < 0.4:
        s += "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 4)))
    if rng.random() < 0.3:
        s += rng.choice("eE") + rng.choice(["", "+", "-"]) + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 3)))
    return s


def ws(rng):
    r = rng.random()
    if r < 0.6:
        return ""
    if r < 0.97:
        return "".join(rng.choice(" \t\n\r") for _ in range(rng.randint(1, 6)))
    return " " * rng.randint(18, 23)  # around the limit


def gen_value(rng, depth, max_depth):
    r = rng.random()
    if depth < max_depth and r < 0.25:
        return gen_object(rng, depth + 1, max_depth)
    if depth < max_depth and r < 0.45:
        items = [gen_value(rng, depth + 1, max_depth) for _ in range(rng.randint(0, 4))]
        return "[" + ws(rng) + ("," .join(ws(rng) + x + ws(rng) for x in items) if items else "") + "]"
    if r < 0.65:
        return gen_string(rng)
    if r < 0.85:
        return gen_number(rng)
    return rng.choice(["true", "false", "null"])


def gen_object(rng, depth, max_depth):
    members = [ws(rng) + gen_string(rng) + ws(rng) + ":" + ws(rng) + gen_value(rng, depth, max_depth) + ws(rng)
               for _ in range(rng.randint(0, 4))]
    return "{" + ("," .join(members) if members else ws(rng)) + "}"


MUTANT_BYTES = [ord(c) for c in '{}[]:,"\\/ \t\n-+.0123456789eEtrufalsnxuUdD'] + [0x00, 0x1F, 0x7F, 0x80, 0xBF, 0xC0,
                                                                                   0xC1, 0xC2, 0xE0, 0xED, 0xEF, 0xF0,
                                                                                   0xF4, 0xF5, 0xFF]


def corpus(seed, n):
    rng = random.Random(seed)
    fixed = [
        '{}', ' {}', '{"a":1}', '{"a":[1,2.5,-0,1e5,1E+5,1.0e-5,true,false,null,"x",{}]}',
        '{"\\ud83d\\ude00":"\\uD83D\\uDE00"}', '{"a":"\\ud800"}', '{"a":"\\udc00"}', '{"a":"\\ud800\\u0041"}',
        '{"a":"\\ud800x"}', '{"a":01}', '{"a":1.}', '{"a":.5}', '{"a":+1}', '{"a":1e}', '{"a":-}', '{"a":1,}',
        "{'a':1}", '{"a":NaN}', '{"a":Infinity}', '{"a":tru}', '{"a":True}', '[]', '"a"', '1', '{} {}', '{}\n',
        '{"a":"\\x"}', '{"a":"\\u12"}', '{"a":"\\u12G4"}', '{a:1}', '{"a" 1}', '{"a":1 "b":2}', '{"a":[1 2]}',
        '{"a":[}', '{"a":{]}', '{,}', '{"a":1}}', '',
        '{"a":' + '[' * 63 + '1' + ']' * 63 + '}', '{"a":' + '[' * 64 + '1' + ']' * 64 + '}',
        '{' + '"a":{' * 63 + '}' * 64, '{' + '"a":{' * 64 + '}' * 65,
        '{' + ' ' * 20 + '}', '{' + ' ' * 21 + '}', ' ' * 20 + '{}', ' ' * 21 + '{}', '\n\n{}', ' \n\t{}',
    ]
    out = [(t.encode("utf-8"), 0) for t in fixed]
    raw_fixed = [b'{"a":"\xc3\xa9"}', b'{"a":"\xc3"}', b'{"a":"\xc0\x80"}', b'{"a":"\xed\xa0\x80"}',
                 b'{"a":"\xf4\x90\x80\x80"}', b'{"a":"\xf0\x9f\x98\x80"}', b'{"a":"\xe0\x80\x80"}', b'{"a":"\x80"}',
                 b'{"a":"\xf5\x80\x80\x80"}', b'{"a":"\xef\xbf\xbf"}', b'{"\x01":1}', b'{"a\tb":1}']
    out += [(t, 0) for t in raw_fixed]
    while len(out) < n:
        text = gen_object(rng, 1, rng.choice([2, 4, 8]))
        data = (ws(rng)[:rng.choice([0, 0, 1, 2, 3])] + text).encode("utf-8")
        out.append((data, len(data) if accepted(data) else 0))
        if not accepted(data):
            continue
        for _ in range(3):  # mutants of a valid text: its bytes before the change are a viable prefix
            i = rng.randrange(len(data) + 1)
            kind = rng.random()
            if kind < 0.3 and i < len(data):
                m = data[:i] + data[i + 1:]
            elif kind < 0.6:
                m = data[:i] + bytes([rng.choice(MUTANT_BYTES)]) + data[i:]
            elif kind < 0.9 and i < len(data):
                m = data[:i] + bytes([rng.choice(MUTANT_BYTES)]) + data[i + 1:]
            else:
                m = data[:i]
            out.append((m, i))
    for data, safe in out[:n]:
        print("%s\t%d\t%d" % (data.hex(), 1 if accepted(data) else 0, safe))


def check(path):
    with open(path) as f:
        for line in f:
            line = line.strip()
            print(1 if accepted(bytes.fromhex(line)) else 0)


if __name__ == "__main__":
    if sys.argv[1] == "corpus":
        corpus(int(sys.argv[2]), int(sys.argv[3]))
    else:
        check(sys.argv[2])
