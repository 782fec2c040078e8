#!/usr/bin/env python3
"""Freeze chat-template reference renderings for anvil's C++ template tests.

For every conversation in tests/data/templates/conversations.json and every template it names
(qwen3, llama3), renders the prompt with transformers' own chat-template code path:
  - the Qwen3 case goes through AutoTokenizer(...).apply_chat_template(tokenize=False) on the real
    tokenizer in /work/shared/fixtures/qwen3-tokenizer (its tokenizer_config.json is copied into
    tests/data/templates/qwen3/), and is cross-checked against the render_jinja_template path;
  - the Llama-3.1-style template (tests/data/templates/llama3/tokenizer_config.json, written for these
    tests) has no tokenizer.json, so it uses transformers.utils.chat_template_utils.render_jinja_template
    with the same inputs apply_chat_template builds (None-valued message keys dropped, special tokens).
Writes tests/data/templates/expected_<template>.json: {name: {"text": ...} or {"error": ...}}.

Also freezes:
  - expected_snippets.json: the engine snippets of snippets.json (Python str/list/dict methods,
    dict keys of every hashable type, None vs undefined, raise_exception, %-formatting, raw /
    filter / call blocks), rendered by transformers' own compiled jinja2 environment;
  - expected_real.json: the real-world templates of tests/data/templates/real/ (where each came
    from is in real/sources.json) x conversations_real.json, through render_jinja_template, with
    enable_thinking passed only when a case sets it.
A conversation the reference refuses is frozen as {"error": message}; anvil must refuse it too.
Re-run: python3 scripts/make_template_fixtures.py
"""
import json
import os
import sys

from transformers.utils import chat_template_utils as ctu

# Templates that date their prompt (strftime_now: SmolLM3, Mistral Small, Llama 3.x, LFM2) render
# the day they are frozen on; pin it to the instant the C++ test pins anvil's strftime_now to
# (ANVIL_TEMPLATE_NOW in tests/tokenizer/template_conformance_test.cpp), in UTC.
FIXTURE_NOW = 1796558400  # 2026-12-06 12:00:00 UTC
os.environ["TZ"] = "UTC"
import time as _time  # noqa: E402
_time.tzset()
import datetime as _dt  # noqa: E402


class _PinnedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return _dt.datetime.fromtimestamp(FIXTURE_NOW, tz)


if hasattr(ctu, "datetime"):
    ctu.datetime = _PinnedDatetime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "templates")
SHARED_QWEN = os.environ.get("ANVIL_QWEN3_TOKENIZER", "/work/shared/fixtures/qwen3-tokenizer")


def token_str(v):
    if isinstance(v, dict):
        return v.get("content")
    return v


def render_with_transformers_utils(cfg, case):
    """render_jinja_template with the inputs PreTrainedTokenizerBase.apply_chat_template builds."""
    special = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        tok = token_str(cfg.get(key))
        if tok is not None:
            special[key] = tok
    messages = [{k: v for k, v in m.items() if v is not None} for m in case["messages"]]
    kwargs = dict(special)
    kwargs["enable_thinking"] = case["enable_thinking"]
    kwargs.update(case.get("extra_context", {}))
    rendered, _ = ctu.render_jinja_template(
        conversations=[messages],
        tools=case.get("tools"),
        chat_template=cfg["chat_template"],
        add_generation_prompt=case["add_generation_prompt"],
        **kwargs,
    )
    return rendered[0]


def main():
    cases = json.load(open(os.path.join(DATA, "conversations.json"), encoding="utf-8"))
    qwen_tok = None
    try:
        from transformers import AutoTokenizer

        qwen_tok = AutoTokenizer.from_pretrained(SHARED_QWEN)
    except Exception as e:  # the full-tokenizer cross-check is optional
        print(f"note: no AutoTokenizer cross-check ({e})", file=sys.stderr)
    for name in ("qwen3", "llama3"):
        cfg = json.load(open(os.path.join(DATA, name, "tokenizer_config.json"), encoding="utf-8"))
        out = {}
        for case in cases:
            if name not in case["templates"]:
                continue
            try:
                text = render_with_transformers_utils(cfg, case)
                if name == "qwen3" and qwen_tok is not None:
                    assert qwen_tok.chat_template == cfg["chat_template"], "qwen3 template copy differs"
                    ref = qwen_tok.apply_chat_template(
                        case["messages"], tools=case.get("tools"), tokenize=False,
                        add_generation_prompt=case["add_generation_prompt"],
                        enable_thinking=case["enable_thinking"], **case.get("extra_context", {}))
                    assert ref == text, f"{case['name']}: apply_chat_template differs from render_jinja_template"
                out[case["name"]] = {"text": text}
            except AssertionError:
                raise
            except Exception as e:  # jinja2 TemplateError from raise_exception, etc.
                out[case["name"]] = {"error": str(e)}
        path = os.path.join(DATA, f"expected_{name}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1, ensure_ascii=False)
            f.write("\n")
        print(f"{path}: {len(out)} renderings ({sum('error' in v for v in out.values())} errors)")


def make_real():
    """Every template in tests/data/templates/real/ (sources.json) x every conversation in
    conversations_real.json, rendered by transformers' render_jinja_template with the inputs
    apply_chat_template builds. enable_thinking is passed only when the case sets it, so the
    templates' own defaults are exercised. Errors (raise_exception, TypeError, ...) are frozen
    as {"error": message}: anvil must refuse those conversations too."""
    real = os.path.join(DATA, "real")
    spec = json.load(open(os.path.join(real, "sources.json"), encoding="utf-8"))
    cases = json.load(open(os.path.join(DATA, "conversations_real.json"), encoding="utf-8"))
    out = {}
    for name, info in spec["templates"].items():
        source = open(os.path.join(real, name + ".jinja"), encoding="utf-8").read()
        per = {}
        for case in cases:
            kwargs = {k: info[k] for k in ("bos_token", "eos_token") if info.get(k) is not None}
            kwargs.update(spec.get("extra_context", {}))
            if case.get("enable_thinking") is not None:
                kwargs["enable_thinking"] = case["enable_thinking"]
            messages = [{k: v for k, v in m.items() if v is not None} for m in case["messages"]]
            try:
                rendered, _ = ctu.render_jinja_template(
                    conversations=[messages], tools=case.get("tools"), chat_template=source,
                    add_generation_prompt=case["add_generation_prompt"], **kwargs)
                per[case["name"]] = {"text": rendered[0]}
            except Exception as e:
                per[case["name"]] = {"error": str(e), "error_type": type(e).__name__}
        out[name] = per
    path = os.path.join(DATA, "expected_real.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    n = sum(len(v) for v in out.values())
    errors = sum("error" in r for v in out.values() for r in v.values())
    print(f"{path}: {len(out)} templates, {n} renderings ({errors} errors)")


def make_snippets():
    """Small templates exercising engine semantics, rendered by transformers' jinja2 environment."""
    spec = json.load(open(os.path.join(DATA, "snippets.json"), encoding="utf-8"))
    out = {}
    for s in spec["snippets"]:
        try:
            out[s["name"]] = {"text": ctu._compile_jinja_template(s["template"]).render(**spec["context"])}
        except Exception as e:
            out[s["name"]] = {"error": str(e)}
    path = os.path.join(DATA, "expected_snippets.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{path}: {len(out)} renderings ({sum('error' in v for v in out.values())} errors)")


if __name__ == "__main__":
    main()
    make_snippets()
    make_real()
