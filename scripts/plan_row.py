"""One line of scripts/plan-paper.sh: a `loom plan` SUMMARY (stdin) as the figures that decide.

hw is the hardware FLOP rate Megatron-LM reports: model FLOPs plus the recomputed forward
(4/3 of the model FLOPs) when activations are checkpointed."""
import json
import sys

label = sys.argv[1]
s = json.load(sys.stdin)
p = s["top"][0]
t = p["terms_ms"]
step = p["step_ms"]
hw = p["mfu"] * (4 / 3 if "ckpt" in p["layout"] else 1)


def share(k):
    return 100 * t[k] / step


print(f"{label:40s} {p['layout']:32s} step {step / 1e3:7.2f} s  MFU {100 * p['mfu']:5.1f}%  "
      f"hw {hw * 312:5.1f} TFLOP/s/A100  mem {p['memory_bytes'] / 2**30:5.1f} GiB  "
      f"tp {share('tp_comm'):4.1f}%  bubble {share('bubble'):4.1f}%  dp exposed {share('dp_exposed'):4.1f}% "
      f"of {t['dp_comm'] / 1e3:.2f} s{'' if p['fits'] else '  DOES NOT FIT'}")
