#!/usr/bin/env python3
"""Hugging Face `tokenizers` as the peer of `loom bench tokenize`, driven line by line over
stdin/stdout (bench/loom/peer_process.h) so that its runs alternate with loom's:

  encode        a fresh tokenizer (loading untimed), then encode(text) twice, one thread:
                answers "TIMES <first s> <second s> <tokens>"
  batch         encode_batch of the text's lines (line ends kept), one thread: "BATCH <s> <tokens>"
  ids PATH      writes the last encode's ids to PATH as int32 little-endian: "WROTE <count>"

Encoding reads special-token texts as plain text and adds no BOS (encode_special_tokens=True,
add_special_tokens=False), as loom's Tokenizer::encode does. The tokenizer: a tokenizer.json,
a folder holding one, a GGUF (rebuilt from its vocabulary and merges as
tests/golden/hf_tokenizers/make_golden.py does), or "gpt2:DIR" (encoder.json + vocab.bpe).

  VENV/bin/python hf_tokenizers_peer.py --tokenizer SPEC --input FILE
(VENV from bench/peers/setup_tokenizers.sh)
"""
import argparse
import json
import os
import sys
import time

# One thread: rayon reads this when its pool starts, so before the first encode.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

try:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
except ImportError as e:
    sys.exit(f"[peer tokenizers] {e}; run bench/peers/setup_tokenizers.sh VENV and use VENV/bin/python")

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = LLAMA3_RE.replace(r"\p{N}{1,3}", r"\p{N}")


def from_gguf(path):
    import gguf
    fields = gguf.GGUFReader(path).fields
    kind = fields["tokenizer.ggml.model"].contents()
    if kind != "gpt2":
        sys.exit(f"[peer tokenizers] {path}: tokenizer.ggml.model '{kind}' is not rebuilt here (only gpt2-style BPE)")
    pre = fields["tokenizer.ggml.pre"].contents() if "tokenizer.ggml.pre" in fields else "default"
    tokens = fields["tokenizer.ggml.tokens"].contents()
    types = fields["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"].contents()]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)
    if pre == "smollm":
        steps = [pre_tokenizers.Digits(individual_digits=True),
                 pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)]
    elif pre in ("llama-bpe", "llama3"):
        steps = [pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False), byte_level]
    elif pre == "qwen2":
        steps = [pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated", invert=False), byte_level]
    elif pre in ("default", "gpt-2", "gpt2"):
        steps = [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)]
    else:
        sys.exit(f"[peer tokenizers] {path}: tokenizer.ggml.pre '{pre}' is not rebuilt here")
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    if pre in ("llama-bpe", "llama3"):  # llama.cpp's llama-bpe takes whole vocabulary words first
        j = json.loads(tok.to_str())
        j["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(j))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
    return tok.to_str()  # what load() rebuilds a fresh tokenizer from


def load_source(spec):
    if spec.startswith("gpt2:"):
        d = spec[len("gpt2:"):]
        tok = Tokenizer(models.BPE.from_file(os.path.join(d, "encoder.json"), os.path.join(d, "vocab.bpe")))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        return tok.to_str()
    if os.path.isdir(spec):
        spec = os.path.join(spec, "tokenizer.json")
    with open(spec, "rb") as f:
        if f.read(4) == b"GGUF":
            return from_gguf(spec)
    with open(spec, encoding="utf-8") as f:
        return f.read()


def load(source):
    tok = Tokenizer.from_str(source)
    tok.encode_special_tokens = True
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--input", required=True)
    a = ap.parse_args()
    source = load_source(a.tokenizer)
    text = open(a.input, encoding="utf-8").read()
    lines = text.splitlines(keepends=True)
    ids = []
    print("READY", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "encode":
            tok = load(source)
            t0 = time.perf_counter()
            ids = tok.encode(text, add_special_tokens=False).ids
            t1 = time.perf_counter()
            tok.encode(text, add_special_tokens=False)
            t2 = time.perf_counter()
            print(f"TIMES {t1 - t0:.6f} {t2 - t1:.6f} {len(ids)}", flush=True)
        elif cmd[0] == "batch":
            tok = load(source)
            t0 = time.perf_counter()
            out = tok.encode_batch(lines, add_special_tokens=False)
            t1 = time.perf_counter()
            print(f"BATCH {t1 - t0:.6f} {sum(len(e.ids) for e in out)}", flush=True)
        elif cmd[0] == "ids":
            import array
            arr = array.array("i", ids)
            if sys.byteorder != "little":
                arr.byteswap()
            with open(cmd[1], "wb") as f:
                arr.tofile(f)
            print(f"WROTE {len(ids)}", flush=True)
        else:
            sys.exit(f"[peer tokenizers] unknown command {cmd[0]!r}")


if __name__ == "__main__":
    main()
