#!/usr/bin/env python3
"""Token ids of the SmolLM2 reference checks (docs/MODELS.md), made with Hugging Face
`tokenizers` from the vocabulary and merges inside the GGUF, so that the logits check
(llama_gguf_reference.py) does not depend on loom's tokenizer:

  chat_prompt.ids   "What is the capital of France?" through SmolLM2's chat template with the
                    generation prompt (37 tokens)
  text_256.ids      the first 256 tokens of data/tinyshakespeare/input.txt

  make_ids.py MODEL.gguf SOURCE_DIR      (needs the PyPI packages gguf and tokenizers)
"""
import sys
from pathlib import Path

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

path, src = sys.argv[1], Path(sys.argv[2])
r = gguf.GGUFReader(path)
f = r.fields


def strings(key):
    return [bytes(f[key].parts[i]).decode() for i in f[key].data]


tokens = strings("tokenizer.ggml.tokens")
merges = strings("tokenizer.ggml.merges")
types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ", 1)) for m in merges]))
# SmolLM2's tokenizer.json: digits split one by one, then GPT-2's byte-level pre-tokenizer.
tk.pre_tokenizer = pre_tokenizers.Sequence(
    [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
tk.decoder = decoders.ByteLevel()
tk.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == 3])

chat = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
out = Path(__file__).parent
(out / "chat_prompt.ids").write_text(" ".join(map(str, tk.encode(chat).ids)) + "\n")
text = (src / "data/tinyshakespeare/input.txt").read_text()[:4000]
(out / "text_256.ids").write_text(" ".join(map(str, tk.encode(text).ids[:256])) + "\n")
