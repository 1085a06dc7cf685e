#!/usr/bin/env python3
"""Golden files of the `loom tokenize --tokenizer PATH` CLI tests (tests/CMakeLists.txt,
cli_tokenize_llama3_*), made with Hugging Face `tokenizers` from llama3/tokenizer.json on the
corpus case "special_like" (chat markers, "<|begin_of_text|>" written in the text):

  llama3/cli_special_like.txt           the text, raw bytes
  llama3/cli_special_like.plain.ids     special-token texts read as text, no post-processor
                                        (`loom tokenize`)
  llama3/cli_special_like.ids           encode(text, add_special_tokens=True): specials as ids,
                                        BOS first (`loom tokenize --special --add-bos`)
  llama3/cli_special_like.decoded.txt   decode(ids, skip_special_tokens=True) (`--decode`)

  ~/.cache/loom/venv/bin/python tests/golden/hf_tokenizers/make_cli_golden.py
"""
import json
from pathlib import Path

from tokenizers import Tokenizer

HERE = Path(__file__).resolve().parent
CASE = "special_like"
text = next(c["text"] for c in json.loads((HERE / "corpus.json").read_text(encoding="utf-8")) if c["name"] == CASE)
tok = Tokenizer.from_file(str(HERE / "llama3" / "tokenizer.json"))
ids = tok.encode(text, add_special_tokens=True).ids
tok.encode_special_tokens = True
plain = tok.encode(text, add_special_tokens=False).ids
tok.encode_special_tokens = False
out = HERE / "llama3"
(out / f"cli_{CASE}.txt").write_bytes(text.encode("utf-8"))
(out / f"cli_{CASE}.plain.ids").write_text(" ".join(map(str, plain)) + "\n")
(out / f"cli_{CASE}.ids").write_text(" ".join(map(str, ids)) + "\n")
(out / f"cli_{CASE}.decoded.txt").write_bytes(tok.decode(ids, skip_special_tokens=True).encode("utf-8"))
