#!/usr/bin/env python3
"""Renders every template in templates/ with every conversation in conversations/ using Python's
jinja2 configured as transformers' apply_chat_template configures it, and writes what came out to
expected/ together with the case list cases.json that tests/data/chat_template_test.cpp reads.

Per (template, conversation) pair the outcome is one of:
  expected/T__C.txt    the rendered prompt (bytes, UTF-8)
  expected/T__C.raise  the template called raise_exception(msg): the message
  expected/T__C.error  jinja2 failed some other way (an undefined value, a type error): its text

Usage: python make_golden.py   (needs jinja2; ~/.cache/loom/venv/bin/python has it)
"""
import datetime
import json
import pathlib

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = pathlib.Path(__file__).resolve().parent
# strftime_now formats this instead of the clock; the C++ test passes the same time.
FIXED_NOW = datetime.datetime(2026, 7, 26, 14, 30, 5)
# The special tokens each model's tokenizer passes as bos_token / eos_token.
TOKENS = {
    "gemma2": ("<bos>", "<eos>"),
    "llama3_1": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3_2": ("<|begin_of_text|>", "<|eot_id|>"),
    "qwen2_5": ("", "<|im_end|>"),
    "smollm2": ("<|im_start|>", "<|im_end|>"),
    "chatml": ("", "<|im_end|>"),
    "phi3": ("<s>", "<|endoftext|>"),
    "falcon_chat": ("<|endoftext|>", "<|endoftext|>"),
    "deepseek_coder": ("<｜begin▁of▁sentence｜>", "<|EOT|>"),
}
DEFAULT_TOKENS = ("<s>", "</s>")


class TemplateRaised(Exception):
    pass


def raise_exception(message):
    raise TemplateRaised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' replacement for jinja2's tojson (which would HTML-escape and sort keys).
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return FIXED_NOW.strftime(fmt)


class GenerationBlock(jinja2.ext.Extension):
    """transformers' {% generation %} marks assistant text; rendering-wise it is its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    env = make_env()
    out_dir = HERE / "expected"
    out_dir.mkdir(exist_ok=True)
    for old in out_dir.iterdir():
        old.unlink()
    cases = []
    for tpath in sorted((HERE / "templates").glob("*.jinja")):
        source = tpath.read_bytes().decode("utf-8")
        template = env.from_string(source)
        bos, eos = TOKENS.get(tpath.stem, DEFAULT_TOKENS)
        for cpath in sorted((HERE / "conversations").glob("*.json")):
            variables = json.loads(cpath.read_bytes().decode("utf-8"))
            variables.setdefault("add_generation_prompt", False)
            variables["bos_token"] = bos
            variables["eos_token"] = eos
            stem = f"{tpath.stem}__{cpath.stem}"
            try:
                result, text = "txt", template.render(**variables)
            except TemplateRaised as e:
                result, text = "raise", str(e)
            except Exception as e:  # noqa: BLE001 - any other jinja2 failure is an expected error
                result, text = "error", f"{type(e).__name__}: {e}"
            (out_dir / f"{stem}.{result}").write_bytes(text.encode("utf-8"))
            cases.append({"template": tpath.stem, "conversation": cpath.stem, "bos_token": bos,
                          "eos_token": eos, "result": result})
    with open(HERE / "cases.json", "w", encoding="utf-8") as f:
        json.dump({"now": FIXED_NOW.strftime("%Y-%m-%d %H:%M:%S"), "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    counts = {r: sum(c["result"] == r for c in cases) for r in ("txt", "raise", "error")}
    print(f"{len(cases)} cases: {counts}")


if __name__ == "__main__":
    main()
