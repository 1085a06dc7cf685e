#!/usr/bin/env bash
# `loom report` end to end: a tiny training run with metrics (validation every few steps),
# the report page, the page rendered by headless Chromium: the screenshot must not be blank and
# must show the series' colours, and every chart must carry (and draw) the expected number of
# series. Skips (exit 77) when chromium or python3 is missing.
# usage: run_report_test.sh LOOM_BINARY SOURCE_DIR
set -euo pipefail
LOOM="$1"
SRC="$2"
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
command -v python3 >/dev/null || skip "python3 is not installed"
CHROMIUM="$(command -v chromium || command -v chromium-browser || true)"
[ -n "$CHROMIUM" ] || skip "chromium is not installed (Debian: apt-get install chromium; scripts/install-deps.sh)"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
head -c 40000 "$SRC/data/tinyshakespeare/input.txt" > "$WORK/in.txt"
"$LOOM" prepare --input "$WORK/in.txt" --tokenizer byte --out "$WORK/data" > /dev/null
RUN="$WORK/run"
"$LOOM" train "$SRC/configs/shakespeare.yaml" --set data.dir="$WORK/data" --set model.preset=gpt2-tiny \
  --set model.vocab_size=256 --set data.seq_len=32 --set data.batch_size=8 --set schedule.steps=30 \
  --set schedule.warmup_steps=3 --set schedule.eval_interval=5 --set schedule.eval_batches=2 --set log.every=1 \
  --set log.progress=off --set checkpoint.dir="$RUN/ckpt" --set checkpoint.every_steps=0 \
  --metrics "$RUN/metrics.jsonl" > "$WORK/train.log" 2>&1 || { tail -20 "$WORK/train.log"; fail "training failed"; }

# Without metrics the command says what it looked for.
mkdir "$WORK/empty"
out="$("$LOOM" report "$WORK/empty" 2>&1)" && fail "report of an empty directory succeeded"
case "$out" in *"no metrics JSONL (looked for metrics.jsonl, *.jsonl); pass --metrics FILE"*) ;;
  *) fail "unexpected error for an empty directory: $out" ;; esac

out="$("$LOOM" report "$RUN")" || fail "loom report failed: $out"
echo "$out"
case "$out" in "[report] wrote $RUN/report.html: 30 steps, loss "*", val loss "*) ;;
  *) fail "unexpected summary: $out" ;; esac
[ -s "$RUN/report.html" ] || fail "no $RUN/report.html"

# The charts: what each must hold, from the run's own JSONL (memory: one series per category
# of the last step line), checked against the page's tags and the lines drawn in each <svg>.
python3 - "$RUN/report.html" "$RUN/metrics.jsonl" <<'PY' || fail "the page's charts are not as expected"
import json, sys
from html.parser import HTMLParser
html = open(sys.argv[1], encoding="utf-8").read()
steps = [json.loads(l) for l in open(sys.argv[2]) if '"loss"' in l and '"event"' not in l]
categories = len(steps[-1]["memory"])
want = {"loss": 2, "lr": 1, "grad_norm": 1, "tokens_per_s": 1, "mfu": 1, "memory": categories, "exposed_comm": 1}
class Charts(HTMLParser):
    def __init__(self):
        super().__init__()
        self.charts, self.current, self.bad = {}, None, []
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "link", "iframe", "img", "object") or "src" in a or "href" in a:
            self.bad.append(tag)
        if tag == "svg" and a.get("class") == "chart":
            self.current = a["data-chart"]
            self.charts[self.current] = [int(a["data-series"]), 0]
        elif tag == "polyline" and self.current:
            self.charts[self.current][1] += 1
    def handle_endtag(self, tag):
        if tag == "svg":
            self.current = None
p = Charts()
p.feed(html)
ok = True
for name, n in want.items():
    declared, drawn = p.charts.get(name, [None, None])
    print(f"chart {name}: {declared} series declared, {drawn} drawn, {n} expected")
    ok &= declared == n and drawn == n
if set(p.charts) != set(want):
    print("charts on the page:", sorted(p.charts), "expected:", sorted(want)); ok = False
if p.bad or "<script" in html or "url(" in html or "@import" in html:
    print("the page refers to something outside itself:", p.bad); ok = False
if categories < 3:
    print(f"only {categories} memory categories logged"); ok = False
sys.exit(0 if ok else 1)
PY

# Rendered by Chromium. It can hang on a misconfigured host: bounded.
timeout 60 "$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
  --user-data-dir="$WORK/chromium-profile" --screenshot="$WORK/shot.png" --window-size=1200,3000 \
  "file://$RUN/report.html" > "$WORK/chromium.log" 2>&1 || true
[ -s "$WORK/shot.png" ] || { tail -20 "$WORK/chromium.log"; fail "chromium wrote no screenshot"; }
python3 - "$WORK/shot.png" <<'PY' || fail "the screenshot looks blank or shows no plotted series"
# PNG decoded with the standard library: chunks, zlib, then each row's filter undone.
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat = 8, b""
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
assert depth == 8 and ctype in (2, 6), f"unexpected PNG format: depth {depth}, colour type {ctype}"
bpp = 3 if ctype == 2 else 4
raw = zlib.decompress(idat)
stride = w * bpp
prev = bytearray(stride)
colours = {}
for y in range(h):
    f = raw[y * (stride + 1)]
    row = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    if f == 1:
        for i in range(bpp, stride): row[i] = (row[i] + row[i - bpp]) & 255
    elif f == 2:
        row = bytearray((a + b) & 255 for a, b in zip(row, prev))
    elif f == 3:
        for i in range(stride): row[i] = (row[i] + ((row[i - bpp] if i >= bpp else 0) + prev[i]) // 2) & 255
    elif f == 4:
        for i in range(stride):
            a = row[i - bpp] if i >= bpp else 0
            b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    if y % 2 == 0:  # every other row is enough to count
        for x in range(0, stride, bpp):
            px = bytes(row[x:x + 3])
            colours[px] = colours.get(px, 0) + 1
    prev = row
total = sum(colours.values())
white = colours.get(b"\xff\xff\xff", 0)
# The first two series colours of svg/plot (loss: train and val) must be drawn.
series = {"#1f77b4": bytes.fromhex("1f77b4"), "#d62728": bytes.fromhex("d62728")}
print(f"screenshot {w}x{h}: {len(colours)} distinct colours, {100 * (1 - white / total):.1f}% not white; "
      + ", ".join(f"{k}: {colours.get(v, 0)} px" for k, v in series.items()))
ok = len(colours) >= 16 and white < 0.99 * total and all(colours.get(v, 0) >= 50 for v in series.values())
sys.exit(0 if ok else 1)
PY
echo "report: page written, $(grep -c '<svg class="chart"' "$RUN/report.html") charts with the expected series, screenshot not blank"
