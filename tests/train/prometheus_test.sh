#!/usr/bin/env bash
# A real Prometheus scrapes `loom serve` and `loom train --metrics-port` (1 s interval, loopback
# only): its HTTP API must return the training series (step, loss, validation loss, memory by
# category, tokens counter, exposed communication) and a serving series. A second trainer
# asking for the port in use is refused with a message naming it. Everything started is stopped
# on the way out, failure or not. Skips (exit 77) when prometheus or python3 is missing.
# usage: prometheus_test.sh LOOM_BINARY SOURCE_DIR
set -uo pipefail
LOOM="$1"
SRC="$2"
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAIL: $*"; for f in "$WORK"/*.log; do echo "== $f"; tail -15 "$f"; done; exit 1; }
command -v python3 >/dev/null || skip "python3 is not installed"
PROMETHEUS="$(command -v prometheus || true)"
[ -n "$PROMETHEUS" ] || skip "prometheus is not installed (Debian: apt-get install prometheus; scripts/install-deps.sh)"

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# port_in LOG PATTERN PID: the port a process printed (sed pattern with one group), waiting up to 30 s.
port_in() {
  local port=""
  for _ in $(seq 300); do
    port="$(sed -n "s/$2/\1/p" "$1" | head -1)"
    [ -n "$port" ] && { echo "$port"; return 0; }
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

head -c 40000 "$SRC/data/tinyshakespeare/input.txt" > "$WORK/in.txt"
"$LOOM" prepare --input "$WORK/in.txt" --tokenizer byte --out "$WORK/data" > /dev/null || fail "prepare"

"$LOOM" serve --model gpt2-shakespeare --seed 1 --port 0 --kv-cache-mb 16 --threads 1 > "$WORK/serve.log" 2>&1 &
PIDS+=($!)
SERVE_PORT="$(port_in "$WORK/serve.log" '.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*' "${PIDS[0]}")" ||
  fail "loom serve did not report its port"

# Long enough to be scraped many times; it is killed once the checks are done.
TRAIN=(train "$SRC/configs/shakespeare.yaml" --set data.dir="$WORK/data" --set model.preset=gpt2-tiny
       --set model.vocab_size=256 --set data.seq_len=32 --set data.batch_size=4 --set schedule.steps=1000000
       --set schedule.eval_interval=10 --set schedule.eval_batches=1 --set log.every=1 --set log.progress=off
       --set checkpoint.dir="$WORK/ckpt" --set checkpoint.every_steps=0 --set threads=1)
"$LOOM" "${TRAIN[@]}" --metrics-port 0 > "$WORK/train.log" 2>&1 &
PIDS+=($!)
TRAIN_PORT="$(port_in "$WORK/train.log" '^\[train\] Prometheus metrics on http:\/\/127\.0\.0\.1:\([0-9]*\)\/metrics$' "${PIDS[1]}")" ||
  fail "loom train did not report its metrics port"
echo "loom serve on $SERVE_PORT, loom train metrics on $TRAIN_PORT"

# The port in use is refused, naming it and the way out.
out="$(timeout 20 "$LOOM" "${TRAIN[@]}" --metrics-port "$TRAIN_PORT" 2>&1)" && fail "a second trainer took port $TRAIN_PORT"
case "$out" in *"[train] --metrics-port $TRAIN_PORT is not available"*"pick another --metrics-port, or 0 for a free one"*) ;;
  *) fail "unexpected refusal of a port in use: $out" ;; esac

PROM_PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
cat > "$WORK/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: loom_serve
    static_configs:
      - targets: ['127.0.0.1:$SERVE_PORT']
  - job_name: loom_train
    static_configs:
      - targets: ['127.0.0.1:$TRAIN_PORT']
YAML
"$PROMETHEUS" --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
  --web.listen-address="127.0.0.1:$PROM_PORT" > "$WORK/prometheus.log" 2>&1 &
PIDS+=($!)

# Each query must return a series (with the labels given) within 30 s of Prometheus starting.
python3 - "$PROM_PORT" <<'PY' || fail "Prometheus did not return every series"
import json, sys, time, urllib.parse, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}/api/v1/query?query="
queries = {
    'loom_train_step{job="loom_train"} > 0': None,
    'loom_train_loss{job="loom_train"}': None,
    'loom_train_val_loss{job="loom_train"}': None,
    'loom_train_learning_rate{job="loom_train"}': None,
    'loom_train_tokens_total{job="loom_train"} > 0': None,
    'loom_train_memory_bytes{job="loom_train",category="params"} > 0': None,
    'loom_train_exposed_comm_seconds{job="loom_train"}': None,
    'loom_train_mfu{job="loom_train"}': None,
    'loom_num_requests_running{job="loom_serve"}': None,
    'up{job="loom_serve"} == 1': None,
}
deadline = time.time() + 30
while time.time() < deadline and any(v is None for v in queries.values()):
    for q in [q for q, v in queries.items() if v is None]:
        try:
            with urllib.request.urlopen(base + urllib.parse.quote(q), timeout=2) as r:
                res = json.load(r)["data"]["result"]
            if res:
                queries[q] = res[0]["value"][1]
        except Exception:
            pass  # Prometheus still starting
    time.sleep(0.5)
for q, v in queries.items():
    print(f"{q}: {'MISSING' if v is None else v}")
sys.exit(0 if all(v is not None for v in queries.values()) else 1)
PY
echo "prometheus: scraped loom train and loom serve"
