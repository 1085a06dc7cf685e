#!/usr/bin/env bash
# LoRA training end to end on llama-tiny (byte-level Tiny Shakespeare; about 10 s on 2 cores):
#  - the frozen model comes from model.init_from (a loom checkpoint trained here first), the
#    adapters (rank 8 on q, k, v, o, gate, up, down) learn: the loss falls;
#  - a checkpoint holds the adapters alone (PEFT's names and adapter_config.json) and the base's
#    identity, and is a small fraction of a whole model's;
#  - a resumed run (dropout 0.1 on the adapters' input) ends bitwise equal to an uninterrupted
#    one (weights and moments): its masks are keyed by step;
#  - dp=2 (ZeRO 0 and 3), tp=2 and pp=2 train the one-process losses (float rounding); a bf16
#    frozen model trains within 1% of the f32 one;
#  - inference from the checkpoint merges the adapters into the recorded base (lower validation
#    loss than the base), as --model BASE --lora DIR does, and `loom export --merge-lora` writes
#    that model (the same loss); --lora on another model or without adapters is refused;
#  - refusals: another base on resume, other adapter settings on resume, LoRA resuming a whole
#    model's checkpoint and the reverse, LoRA keys without a rank, a GPT-2 model.
#   lora_test.sh <loom> <source dir>
set -u
loom=$1
src=$2
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive OMPI_MCA_mpi_yield_when_idle=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
. "$src/tests/train/elastic_helpers.sh"

head -c 200000 "$src/data/tinyshakespeare/input.txt" > "$work/in.txt"
"$loom" prepare --input "$work/in.txt" --tokenizer byte --out "$work/data" >/dev/null || fail "loom prepare failed"
cat > "$work/run.yaml" <<EOF
data: {dir: $work/data, seq_len: 64, batch_size: 8}
schedule: {steps: 150, eval_interval: 0, warmup_steps: 5}
optim: {lr: 3.0e-3}
log: {every: 1, progress: off}
EOF
common=(train "$work/run.yaml")
# Tied embeddings (as SmolLM2's): under pp the token table is on the first and last stage.
base=("${common[@]}" --set model.preset=llama-tiny --set model.vocab_size=256 --set model.tied_embeddings=true)
# The model to adapt: llama-tiny trained 150 steps (step 100 kept: another base).
"$loom" "${base[@]}" --set schedule.steps=150 --set checkpoint.dir="$work/pre" --set checkpoint.every_steps=50 \
  --set checkpoint.keep_last=3 > "$work/pre.out" 2>&1 \
  || { tail -5 "$work/pre.out"; fail "pre-training"; }
adapt=(--set model.lora.rank=8 --set "model.lora.targets=[q,k,v,o,gate,up,down]")
lora=("${common[@]}" --set model.init_from="$work/pre" "${adapt[@]}")

# Train 60 steps with a checkpoint at 30; the same run resumed from 30.
"$loom" "${lora[@]}" --set model.lora.dropout=0.1 --set schedule.steps=60 --set checkpoint.every_steps=30 --set checkpoint.dir="$work/a" \
  --set log.metrics_path="$work/a.jsonl" > "$work/a.out" 2>&1 || { tail -5 "$work/a.out"; fail "LoRA run"; }
grep -q "\[train\] LoRA rank 8, alpha 16 on q, k, v, o, gate, up, down, dropout 0.1: .* trainable parameters" "$work/a.out" \
  || fail "no LoRA start-up line: $(grep '^\[train\]' "$work/a.out")"
grep -q "\[train\] frozen weights from model.init_from=$work/pre" "$work/a.out" || fail "the base was not loaded"
python3 - "$work/a.jsonl" "$work/a/step_000060" "$work/pre" "$work/pre.out" "$work/a.out" <<'EOF' \
  || fail "LoRA checkpoint or learning"
import json, os, struct, sys
jsonl, ck, pre, pre_out, lora_out = sys.argv[1:]
losses = [json.loads(l)["loss"] for l in open(jsonl) if '"loss"' in l and '"step"' in l]
first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
val = lambda out: json.loads([l for l in open(out) if l.startswith("SUMMARY ")][-1][8:])["final_val_loss"]
print(f"LoRA loss: first five steps {first:.4f}, last five {last:.4f}; validation {val(pre_out):.4f} -> {val(lora_out):.4f}")
assert last < first - 0.005, "the adapters did not learn"
assert val(lora_out) < val(pre_out) - 0.01, "the adapted model is no better than the model on validation data"
def names(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return [k for k in json.loads(f.read(n)) if k != "__metadata__"]
w = names(os.path.join(ck, "model.safetensors"))
assert w and all(".lora_A.weight" in k or ".lora_B.weight" in k for k in w), w[:4]
assert "model.layers.0.self_attn.q_proj.lora_A.weight" in w and "model.layers.1.mlp.down_proj.lora_B.weight" in w
size = os.path.getsize(os.path.join(ck, "model.safetensors"))
whole = os.path.getsize(os.path.join(pre, sorted(d for d in os.listdir(pre) if d.startswith("step_"))[-1],
                                     "model.safetensors"))
print(f"adapters {size} bytes, the whole model {whole}")
assert size < whole / 2
a = json.load(open(os.path.join(ck, "adapter_config.json")))
assert a["peft_type"] == "LORA" and a["r"] == 8 and a["lora_alpha"] == 16 and "gate_proj" in a["target_modules"], a
state = json.load(open(os.path.join(ck, "trainer_state.json")))["lora"]
# A run directory as model.init_from: the checkpoint it resolved to (its newest) is the base.
assert state["base"] == a["base_model_name_or_path"] and os.path.samefile(state["base"], os.path.join(pre, "step_000150")), state
assert len(state["base_sha256"]) == 64, state
EOF
cp -r "$work/a" "$work/b"
rm -rf "$work/b/step_000060"
echo step_000030 > "$work/b/latest"
"$loom" "${lora[@]}" --set model.lora.dropout=0.1 --set schedule.steps=60 --set checkpoint.every_steps=30 --set checkpoint.dir="$work/b" \
  --resume auto > "$work/b.out" 2>&1 || { tail -5 "$work/b.out"; fail "resumed LoRA run"; }
grep -q "resumed run .* at step 30" "$work/b.out" || fail "did not resume at step 30"
for f in model.safetensors optimizer.exp_avg.safetensors optimizer.exp_avg_sq.safetensors; do
  cmp -s "$work/a/step_000060/$f" "$work/b/step_000060/$f" || fail "resumed $f differs from the uninterrupted run's"
done

# Layouts against one process (20 steps, no checkpoints).
short=("${lora[@]}" --set schedule.steps=20 --set checkpoint.dir= --set checkpoint.every_steps=0)
"$loom" "${short[@]}" --set log.metrics_path="$work/one.jsonl" > "$work/one.out" 2>&1 || fail "one-process run"
for layout in "dp 0" "dp 3" "tp 0" "pp 0"; do
  set -- $layout
  "$loom" launch --nproc 2 -- "${short[@]}" --set parallel.$1=2 --set parallel.zero_stage=$2 \
    --set parallel.micro_batches=2 --set log.metrics_path="$work/$1$2.jsonl" > "$work/$1$2.out" 2>&1 \
    || { tail -5 "$work/$1$2.out"; fail "LoRA with parallel.$1=2 zero_stage=$2"; }
  losses_match "$work/one.jsonl" "$work/$1$2.jsonl" || fail "LoRA with parallel.$1=2 zero_stage=$2 left one process's losses"
done

# A bf16 frozen model: the blocks at half the bytes, the losses of the f32 one within 1%.
"$loom" "${short[@]}" --set model.lora.base_dtype=bf16 --set log.metrics_path="$work/bf16.jsonl" > "$work/bf16.out" 2>&1 \
  || { tail -5 "$work/bf16.out"; fail "bf16 base"; }
grep -q "rank 8, alpha 16 on q, k, v, o, gate, up, down, bf16 base: .*frozen (.* per rank, bf16 blocks" "$work/bf16.out" \
  || fail "no bf16 base line: $(grep '^\[train\] LoRA' "$work/bf16.out")"
python3 - "$work/one.jsonl" "$work/bf16.jsonl" <<'EOF' || fail "the bf16 base's losses"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p) if '"loss"' in l and '"step"' in l] for p in sys.argv[1:])
worst = max(abs(x - y) / x for x, y in zip(a, b))
print(f"bf16 base: losses within {worst:.2e} of the f32 base's over {len(a)} steps")
assert len(a) == len(b) == 20 and 0 < worst < 0.01
EOF

# Inference and export: a LoRA checkpoint runs as its base with the adapters merged (better than
# the base on validation tokens), and --merge-lora writes that merged model (the same loss).
nll() {
  "$loom" eval --checkpoint "$@" --data "$work/data" --seq-len 64 2>"$work/eval.err" | grep '^SUMMARY ' \
    | python3 -c 'import json,sys; print(json.loads(sys.stdin.read()[8:])["loss"])' \
    || { cat "$work/eval.err"; fail "loom eval --checkpoint $*"; }
}
lora_nll=$(nll "$work/a")
grep -q "LoRA adapters of .*step_000060 merged (rank 8, alpha 16 on q, k, v, o, gate, up, down: 14 matrices)" \
  "$work/eval.err" || fail "the merge was not reported: $(cat "$work/eval.err")"
base_nll=$(nll "$work/pre")
[ "$(nll "$work/pre" --lora "$work/a")" = "$lora_nll" ] || fail "--model BASE --lora DIR is not the LoRA checkpoint's model"
err=$("$loom" eval --checkpoint "$work/pre/step_000100" --lora "$work/a" --data "$work/data" 2>&1) \
  && fail "--lora merged into another model"
case "$err" in *"adapters were trained on $work/pre"*"it is another model"*) ;; *) fail "unclear: $err" ;; esac
err=$("$loom" eval --checkpoint "$work/pre" --lora "$work/pre" --data "$work/data" 2>&1) && fail "--lora took a model"
case "$err" in *"holds no LoRA adapters"*) ;; *) fail "unclear: $err" ;; esac
"$loom" export --checkpoint "$work/a" --format hf --out "$work/hf" --merge-lora > "$work/export.out" 2>&1 \
  || { tail -5 "$work/export.out"; fail "export --merge-lora"; }
hf_nll=$(nll "$work/hf")
python3 - "$lora_nll" "$base_nll" "$hf_nll" <<'EOF' || fail "merged LoRA model"
import sys
lora, base, hf = map(float, sys.argv[1:])
print(f"validation nll: base {base:.5f}, LoRA checkpoint {lora:.5f}, exported merged model {hf:.5f}")
assert lora < base - 0.01 and abs(hf - lora) <= 1e-5 * lora
EOF
err=$("$loom" export --checkpoint "$work/a" --format hf --out "$work/hf2" 2>&1) && fail "exported adapters as a model"
case "$err" in *"holds LoRA adapters, not a whole model; add --merge-lora"*) ;; *) fail "unclear: $err" ;; esac
err=$("$loom" export --checkpoint "$work/pre" --format hf --out "$work/hf2" --merge-lora 2>&1) \
  && fail "--merge-lora accepted a whole model"
case "$err" in *"--merge-lora: "*"holds no LoRA adapters"*) ;; *) fail "unclear: $err" ;; esac
[ ! -e "$work/hf2" ] || fail "a refused export left $work/hf2"

# Refusals.
err=$("$loom" "${common[@]}" --set model.init_from="$work/pre/step_000100" "${adapt[@]}" --set schedule.steps=60 \
  --set checkpoint.dir="$work/b" --resume auto 2>&1) && fail "a LoRA run resumed on another base"
case "$err" in *"adapters were trained on $work/pre"*"set model.init_from to the model they were trained on"*) ;;
  *) fail "unclear refusal of another base: $err" ;; esac
cp -r "$work/pre" "$work/whole"
err=$("$loom" "${lora[@]}" --set schedule.steps=200 --set checkpoint.dir="$work/whole" --resume auto 2>&1) \
  && fail "LoRA resumed a whole model's checkpoint"
case "$err" in *"holds a whole model, not LoRA adapters"*) ;; *) fail "unclear refusal of a whole model: $err" ;; esac
err=$("$loom" "${common[@]}" --set model.preset=gpt2-tiny --set model.vocab_size=256 --set model.lora.rank=4 --set schedule.steps=1 2>&1) \
  && fail "LoRA on GPT-2 was accepted"
case "$err" in *"model.lora needs a LLaMA-family model"*) ;; *) fail "unclear GPT-2 refusal: $err" ;; esac
err=$("$loom" "${common[@]}" --set model.init_from="$work/pre" --set model.lora.alpha=32 --set schedule.steps=1 2>&1) \
  && fail "LoRA keys without a rank were accepted"
case "$err" in *"model.lora.alpha is set but model.lora.rank is 0"*) ;; *) fail "unclear rank-0 refusal: $err" ;; esac
err=$("$loom" "${lora[@]}" --set model.lora.alpha=32 --set schedule.steps=60 --set checkpoint.dir="$work/b" \
  --resume auto 2>&1) && fail "a LoRA run resumed at another alpha"
case "$err" in *"holds adapters of rank 8, alpha 16"*"resume with the model.lora settings it was trained with"*) ;;
  *) fail "unclear refusal of another alpha: $err" ;; esac
err=$("$loom" "${common[@]}" --set model.init_from="$work/pre" --set schedule.steps=60 --set checkpoint.dir="$work/b" \
  --resume auto 2>&1) && fail "full training resumed a LoRA checkpoint"
case "$err" in *"holds LoRA adapters, not a whole model"*) ;; *) fail "unclear refusal of adapters: $err" ;; esac
echo "ok: LoRA learns from a loaded base, checkpoints its adapters, resumes bitwise, equals one process on dp/tp/pp"
