#!/usr/bin/env python3
"""POST /tokenize with "with_pieces": true against a running `anvil serve` (loopback), judged by Hugging
Face tokenizers on the same tokenizer.json.

Usage: tokenize_pieces_check.py BASE_URL API_KEY(- for none) TOKENIZER_JSON
For several texts (ASCII, a leading space, CJK and emoji that split into byte tokens), with and without
"add_special": the ids are tokenizers' encode ids (with "add_special", between the added tokens at the
ends), and each piece is the token's own text as
llama-server gives it: the vocabulary entry's bytes (ByteLevel: the GPT-2 byte alphabet undone;
SentencePiece: "▁" a space, "<0xNN>" the byte NN; an added token its content), a string where those
bytes are UTF-8, else the list of the bytes. The pieces joined are the text, but for the one leading
space a SentencePiece decoder cuts. Exit 0: every check passed; 77: tokenizers is missing; else failed.
"""
import json
import re
import sys
import urllib.request

try:
    from tokenizers import Tokenizer
except ImportError as e:
    print(f"SKIP: the tokenizers package is not installed ({e})")
    sys.exit(77)

base, key, path = sys.argv[1], sys.argv[2], sys.argv[3]
tok = Tokenizer.from_file(path)
with open(path, encoding="utf-8") as f:
    spec = json.load(f)
byte_level = "ByteLevel" in json.dumps(spec.get("decoder"))
added = {a["id"]: a["content"] for a in spec.get("added_tokens", [])}
failures = 0


def fail(what):
    global failures
    failures += 1
    print("FAIL: " + what)


def gpt2_byte_alphabet():
    """GPT-2's map from bytes to printable characters, undone: character -> byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


alphabet = gpt2_byte_alphabet()


def reference_bytes(token_id):
    if token_id in added:
        return added[token_id].encode("utf-8")
    s = tok.id_to_token(token_id)
    if byte_level:
        return bytes(alphabet[c] for c in s)
    m = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", s)
    if m:
        return bytes([int(m.group(1), 16)])
    return s.replace("\u2581", " ").encode("utf-8")


def post(body):
    req = urllib.request.Request(base + "/tokenize", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    if key != "-":
        req.add_header("Authorization", "Bearer " + key)
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


texts = ["Hello world", "\u00e1", "This is a test string with unicode \u5abd and emoji \U0001f917", " leading space",
         "\U0001d518\U0001d52b\U0001d526 def f(x):\n\treturn x  # \u00e9t\u00e9"]
lists = 0
for text in texts:
    for add_special in (False, True):
        # add_special adds what tokenizer_config.json asks for too (add_bos_token), which tokenizers does
        # not read: the ids between the added tokens at either end are the text's own.
        want_ids = tok.encode(text, add_special_tokens=False).ids
        got = post({"content": text, "with_pieces": True, "add_special": add_special})
        ids = [t["id"] for t in got["tokens"]]
        inner = list(ids)
        while add_special and inner and inner[0] in added:
            inner.pop(0)
        while add_special and inner and inner[-1] in added:
            inner.pop()
        if inner != want_ids:
            fail(f"{text!r} add_special={add_special}: ids {ids}, tokenizers {want_ids}")
            continue
        joined = b""
        for t in got["tokens"]:
            ref = reference_bytes(t["id"])
            try:
                want = ref.decode("utf-8")
            except UnicodeDecodeError:
                want = list(ref)
                lists += 1
            if t["piece"] != want:
                fail(f"{text!r}: token {t['id']} ({tok.id_to_token(t['id'])!r}) piece {t['piece']!r}, want {want!r}")
            joined += t["piece"].encode("utf-8") if isinstance(t["piece"], str) else bytes(t["piece"])
        if not add_special:
            rebuilt = joined[1:] if not byte_level and joined.startswith(b" ") else joined
            if rebuilt != text.encode("utf-8"):
                fail(f"{text!r}: the pieces joined are {joined!r}")
        print(f"{text!r} add_special={add_special}: {len(ids)} tokens")
if lists == 0:
    fail("no piece was a byte list: the texts should split a character across tokens")
print(f"{lists} byte-list pieces; {failures} failures")
sys.exit(1 if failures else 0)
