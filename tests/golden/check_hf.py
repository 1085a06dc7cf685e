#!/usr/bin/env python3
"""Cross-checks the golden reference (make_golden.py's own torch model) against Hugging Face
transformers' GPT2LMHeadModel / LlamaForCausalLM, and checks that checkpoints loom exports
load with from_pretrained. Optional and never run by CI (needs transformers + safetensors).

  python check_hf.py                 # golden logits, loss and gradients vs transformers
  python check_hf.py EXPORT_DIR      # also from_pretrained(EXPORT_DIR/<family>) vs golden logits
where EXPORT_DIR comes from:  LOOM_GOLDEN_HF_EXPORT=EXPORT_DIR build/bin/test_model \\
                                  --gtest_filter='GoldenHfExport.*'
Tolerance: the policy of tests/model/golden_test.cpp (1e-4 relative, floor 1e-6 of the
tensor's largest value); transformers computes RoPE tables and RMSNorm in float32 even for a
float64 model, so a tighter bound would test that, not the model.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "model")


def hf_model(family, cfg):
    import transformers as tf
    if family == "gpt2":
        c = tf.GPT2Config(vocab_size=cfg["vocab_size"], n_positions=cfg["n_ctx"],
                          n_embd=cfg["d_model"], n_layer=cfg["n_layer"], n_head=cfg["n_head"],
                          n_inner=cfg["d_ff"], activation_function="gelu_new",
                          layer_norm_epsilon=cfg["norm_eps"],
                          tie_word_embeddings=cfg["tied_embeddings"])
        m = tf.GPT2LMHeadModel._from_config(c, attn_implementation="eager")
    else:
        c = tf.LlamaConfig(vocab_size=cfg["vocab_size"], hidden_size=cfg["d_model"],
                           intermediate_size=cfg["d_ff"], num_hidden_layers=cfg["n_layer"],
                           num_attention_heads=cfg["n_head"], num_key_value_heads=cfg["n_kv_head"],
                           max_position_embeddings=cfg["n_ctx"], rms_norm_eps=cfg["norm_eps"],
                           rope_theta=cfg["rope_theta"],
                           tie_word_embeddings=cfg["tied_embeddings"])
        m = tf.LlamaForCausalLM._from_config(c, attn_implementation="eager")
    return m.double().eval()


CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def to_hf(family, name, t):
    """Golden files use loom's [out, in] layout; GPT-2's Conv1D wants [in, out]."""
    return t.t() if family == "gpt2" and name.endswith(CONV1D) else t


def close(what, a, b):
    a, b = a.double().flatten(), b.double().flatten()
    floor = 1e-2 * b.abs().max()
    ratio = ((a - b).abs() / (1e-4 * torch.maximum(b.abs(), floor))).max().item()
    print(f"  {what}: worst error/tolerance {ratio:.3g}")
    return ratio <= 1.0


def check_family(family, export_dir):
    init = load_file(os.path.join(GOLDEN, f"{family}_init.safetensors"))
    ref = load_file(os.path.join(GOLDEN, f"{family}_grads.safetensors"))
    with open(os.path.join(GOLDEN, f"{family}_init.safetensors"), "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    cfg = json.loads(header["__metadata__"]["config"])
    tokens, targets = init.pop("tokens").long(), init.pop("targets").long()
    print(f"{family}:")
    m = hf_model(family, cfg)
    sd = {n: to_hf(family, n, t).double() for n, t in init.items()}
    missing, unexpected = m.load_state_dict(sd, strict=False)
    missing = [n for n in missing if not (n == "lm_head.weight" and cfg["tied_embeddings"])]
    assert not missing and not unexpected, (missing, unexpected)
    logits = m(input_ids=tokens).logits
    loss = F.cross_entropy(logits.reshape(-1, cfg["vocab_size"]), targets.reshape(-1))
    loss.backward()
    ok = close("logits", logits.detach(), ref["logits"])
    ok &= close("loss", loss.detach().reshape(1), ref["loss"].reshape(1))
    params = dict(m.named_parameters())
    worst = all(close("grad " + n, to_hf(family, n, params[n].grad), ref[n]) for n in init)
    ok &= worst
    if export_dir:
        import transformers as tf
        path = os.path.join(export_dir, family)
        hf = tf.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float64,
                                                     attn_implementation="eager").eval()
        with torch.no_grad():
            ok &= close(f"from_pretrained({path}) logits", hf(input_ids=tokens).logits,
                        ref["logits"])
    return ok


def main():
    export_dir = sys.argv[1] if len(sys.argv) > 1 else None
    ok = all([check_family(f, export_dir) for f in ("gpt2", "llama")])
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
