#!/usr/bin/env python3
"""Golden renderings for `loom chat-template --model SmolLM2.gguf` (tests/CMakeLists.txt,
cli_chat_template_*): each chat_*.json here rendered by Python's jinja2 with the chat template
read out of the GGUF, in the environment transformers' apply_chat_template uses (the one
tests/golden/chat_templates/make_golden.py builds), with the GGUF's BOS/EOS texts.

  chat_capital.json -> chat_capital.txt   one user message, generation prompt on (the
                                          conversation of chat_prompt.ids)
  chat_turns.json   -> chat_turns.txt     system + two turns, rendered as with
                                          --no-generation-prompt (add_generation_prompt false)

  ~/.cache/loom/venv/bin/python tests/golden/smollm2/make_chat_golden.py [MODEL.gguf]
(needs the PyPI packages gguf and jinja2; the GGUF is not committed: scripts/fetch-test-model.sh)
"""
import json
import os
import sys
from pathlib import Path

import gguf

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "chat_templates"))
from make_golden import make_env  # noqa: E402  (same jinja2 set-up as the template corpus)

path = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/loom/models/SmolLM2-135M-Instruct.Q4_1.gguf")
fields = gguf.GGUFReader(path).fields
tokens = fields["tokenizer.ggml.tokens"].contents()
source = fields["tokenizer.chat_template"].contents()
bos = tokens[fields["tokenizer.ggml.bos_token_id"].contents()]
eos = tokens[fields["tokenizer.ggml.eos_token_id"].contents()]
template = make_env().from_string(source)

for name, generation_prompt in (("chat_capital", True), ("chat_turns", False)):
    loaded = json.loads((HERE / f"{name}.json").read_text(encoding="utf-8"))
    variables = {"messages": loaded} if isinstance(loaded, list) else dict(loaded)
    # What `loom chat-template` does: the tokenizer's tokens, then the file's variables over them.
    variables = {"bos_token": bos, "eos_token": eos, **variables, "add_generation_prompt": generation_prompt}
    (HERE / f"{name}.txt").write_bytes(template.render(**variables).encode("utf-8"))
    print(f"{name}.txt written")
