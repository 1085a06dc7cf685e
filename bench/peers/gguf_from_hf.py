#!/usr/bin/env python3
"""Writes a GPT-2 model saved by loom in Hugging Face layout (config.json + model.safetensors,
as `loom bench infer --peer llama.cpp` exports it) as a GGUF file for llama.cpp.

  gguf_from_hf.py --hf DIR --out FILE.gguf --type F32|BF16|Q8_0|Q4_0 [--head-type F32|BF16|Q8_0|Q4_0]
                  [--vocab DIR_WITH_ENCODER_JSON_AND_VOCAB_BPE]

Tensor names and layouts follow llama.cpp's GPT-2 conventions (its model loader is the
specification): Conv1D weights [in, out] become [out, in] matrices; the tied head is written
as `output.weight` so its type can be chosen apart from the blocks'. --type applies to the
four block matrices and the token table (as llama-quantize does for Q8_0/Q4_0);
norms and biases stay F32. The quantization itself is the `gguf` package's (bit-exact with
llama.cpp's reference quantizers). The vocabulary is GPT-2's when the model has its 50,257
tokens and --vocab points at it, otherwise placeholder tokens: the benchmark feeds token ids,
so the tokenizer is only metadata.
Needs the PyPI packages gguf and numpy (bench/peers/setup_llama_cpp.sh installs them).
"""
import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as QT
except ImportError:
    sys.exit("[gguf_from_hf] the PyPI package 'gguf' is missing; run bench/peers/setup_llama_cpp.sh VENV "
             "and use VENV/bin/python")

TYPES = {"F32": QT.F32, "BF16": QT.BF16, "Q8_0": QT.Q8_0, "Q4_0": QT.Q4_0}
FILE_TYPES = {"F32": gguf.LlamaFileType.ALL_F32, "BF16": gguf.LlamaFileType.MOSTLY_BF16,
              "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}


def read_safetensors(path):
    """name -> float32 array; only the dtypes loom writes (F32, F16, BF16, F64)."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        buf = raw[base + a:base + b]
        dt = info["dtype"]
        if dt == "F32":
            arr = np.frombuffer(buf, dtype="<f4")
        elif dt == "F16":
            arr = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        elif dt == "F64":
            arr = np.frombuffer(buf, dtype="<f8").astype(np.float32)
        elif dt == "BF16":
            arr = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            sys.exit(f"[gguf_from_hf] {path}: tensor {name} has dtype {dt}; expected F32, F16, BF16 or F64")
        out[name] = arr.reshape(info["shape"]).astype(np.float32, copy=False)
    return out


def vocabulary(cfg, vocab_dir):
    n = cfg["vocab_size"]
    if vocab_dir and n == 50257:
        enc = json.loads((Path(vocab_dir) / "encoder.json").read_text(encoding="utf-8"))
        tokens = [None] * n
        for s, i in enc.items():
            tokens[i] = s
        merges = [line for line in (Path(vocab_dir) / "vocab.bpe").read_text(encoding="utf-8").splitlines()
                  if line and not line.startswith("#version")]
        if all(t is not None for t in tokens):
            return tokens, merges, "gpt-2"
    # llama.cpp's GPT-2 vocabulary needs a merges list; one placeholder merge satisfies it.
    return [f"<t{i}>" for i in range(n)], ["<t0> <t1>"], "default"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hf", required=True, help="directory with config.json and model.safetensors")
    p.add_argument("--out", required=True)
    p.add_argument("--type", required=True, choices=sorted(TYPES))
    p.add_argument("--head-type", choices=sorted(TYPES), help="type of output.weight (default: --type)")
    p.add_argument("--vocab", help="directory holding GPT-2's encoder.json and vocab.bpe")
    a = p.parse_args()

    cfg = json.loads((Path(a.hf) / "config.json").read_text())
    if cfg.get("model_type") != "gpt2":
        sys.exit(f"[gguf_from_hf] {a.hf}/config.json: model_type {cfg.get('model_type')!r}; only GPT-2 "
                 "models are written (the llama.cpp peer runs GPT-2-family checkpoints)")
    w = read_safetensors(Path(a.hf) / "model.safetensors")
    w = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in w.items()}
    C, L = cfg["n_embd"], cfg["n_layer"]
    qt, head_qt = TYPES[a.type], TYPES[a.head_type or a.type]

    writer = gguf.GGUFWriter(a.out, "gpt2")
    writer.add_name("loom-export")
    writer.add_context_length(cfg["n_positions"])
    writer.add_embedding_length(C)
    writer.add_feed_forward_length(cfg.get("n_inner") or 4 * C)
    writer.add_block_count(L)
    writer.add_head_count(cfg["n_head"])
    writer.add_layer_norm_eps(cfg.get("layer_norm_epsilon", 1e-5))
    writer.add_file_type(FILE_TYPES[a.type])
    tokens, merges, pre = vocabulary(cfg, a.vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(cfg.get("bos_token_id", len(tokens) - 1))
    writer.add_eos_token_id(cfg.get("eos_token_id", len(tokens) - 1))

    def put(name, arr, qtype=QT.F32):
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if qtype != QT.F32 and (arr.ndim != 2 or arr.shape[1] % 32 != 0):
            qtype = QT.F32  # a row that is not whole blocks of 32 stays F32, as llama-quantize does
        if qtype == QT.F32:
            writer.add_tensor(name, arr)
        else:
            writer.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)

    put("token_embd.weight", w["wte.weight"], qt)
    put("position_embd.weight", w["wpe.weight"])  # positions: a lookup, kept F32
    # GGUF name, Hugging Face name, and whether it is a Conv1D matrix ([in, out], written [out, in]
    # in the blocks' --type); norms and biases stay F32.
    block = [("attn_norm", "ln_1", False), ("attn_qkv", "attn.c_attn", True), ("attn_output", "attn.c_proj", True),
             ("ffn_norm", "ln_2", False), ("ffn_up", "mlp.c_fc", True), ("ffn_down", "mlp.c_proj", True)]
    for i in range(L):
        for gguf_name, hf_name, matrix in block:
            weight = w[f"h.{i}.{hf_name}.weight"]
            put(f"blk.{i}.{gguf_name}.weight", weight.T if matrix else weight, qt if matrix else QT.F32)
            put(f"blk.{i}.{gguf_name}.bias", w[f"h.{i}.{hf_name}.bias"])
    put("output_norm.weight", w["ln_f.weight"])
    put("output_norm.bias", w["ln_f.bias"])
    put("output.weight", w["lm_head.weight"] if "lm_head.weight" in w else w["wte.weight"], head_qt)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"[gguf_from_hf] wrote {a.out} ({a.type}, head {a.head_type or a.type})", file=sys.stderr)


if __name__ == "__main__":
    main()
