#!/usr/bin/env python3
# Writes the golden files of tests/data/hf_tokenizer_test.cpp and gguf_tokenizer_test.cpp:
#   corpus.json                  the text cases (name, text), all valid UTF-8
#   <style>/tokenizer.json       small tokenizers in the layout of Llama 3, Qwen2, Llama 2 and
#                                SmolLM2, trained here with the `tokenizers` BpeTrainer
#   <style>/ids.json             per case: "ids" = encode(text, add_special_tokens=True),
#                                "plain" = the same with special tokens read as text and no
#                                post-processor, "decoded" = decode(ids, skip_special_tokens=True)
#   smollm2_gguf/ids.json        the same for SmolLM2-135M-Instruct's real tokenizer, rebuilt
#                                from the GGUF's vocabulary and merges (the GGUF is not committed)
# Run by hand, never by CI (see README.md):
#   ~/.cache/loom/venv/bin/python tests/golden/hf_tokenizers/make_golden.py [path/to/SmolLM2.gguf]
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = LLAMA3_RE.replace(r"\p{N}{1,3}", r"\p{N}")
GGUF_DEFAULT = os.path.expanduser("~/.cache/loom/models/SmolLM2-135M-Instruct.Q4_1.gguf")


def corpus():
    cases = []
    old = os.path.join(ROOT, "tests", "golden", "tokenizer")
    for name in open(os.path.join(old, "CASES")).read().split():
        raw = open(os.path.join(old, name + ".txt"), "rb").read()
        try:
            cases.append((name, raw.decode("utf-8")))
        except UnicodeDecodeError:
            pass  # ill-formed UTF-8 cannot reach `tokenizers`
    cases += [
        ("code_python", "def f(x):\n\tif x >= 10_000:\n\t\treturn x**2  # square\n    return {'a': [1, 2.5e-3]}\r\n"),
        ("long_numbers", "3.14159265358979 12345678901234567890 0x1F2E 1,000,000 -42 ٣٤٥ ५६७ ²³ Ⅻ"),
        ("cjk_mixed", "東京は2024年に人口1400万人。北京欢迎你！한국어 텍스트도 있습니다。"),
        ("emoji_zwj", "👩‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👍🏽 thumbs, 🇫🇷🇯🇵, ❤️‍🔥 and 🧑🏿‍💻 coder"),
        ("control_bytes", "a\x00b\x01c\x07d\x1be\x7ff\x1f end\x0b\x0c"),
        ("crlf_runs", "line1\r\nline2\r\n\r\n\tindented\n\n\n   \n  spaced\r\r\n \n"),
        ("upper_contractions", "I'M HERE. YOU'LL SEE, IT'S WE'VE THEY'RE I'D DON'T 'S 'ſ Ain'T we'Re"),
        ("special_like", "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<|begin_of_text|><s>x</s>"),
        ("special_near", "a<|im_start|>b <|im_end|> <|endoftext|>c<|im_start|><|im_end|>"),
        ("added_options", "x <mask> y <sep>   z wordtok wordtoks awordtok (wordtok) <mask><sep>"),
        ("accents_decomposed", "Cafe\u0301 re\u0301sume\u0301 A\u030a n\u0303 o\u0308\u0301 \u1e9b\u0323 \u0958 \uac00\u11a8 e\u0323\u0302"),
        ("arabic_hindi", "مرحبا بالعالم، كيف حالك؟ नमस्ते दुनिया, आप कैसे हैं? १२३"),
        ("whitespace_runs", "a  b   c    d\t\t e \u00a0\u3000 f" + " " * 40 + "g\n" + "\t" * 9 + "end   "),
        ("apostrophes", "rock'n'roll o'clock ''s '' 'hello' don’t it’s"),
        ("punct_runs", "Wait...what?!?! (yes) -- [no] {{maybe}} ~~~ @@ ##tag $$100 %%"),
        ("empty", ""),
        ("single_space", " "),
        ("leading_space_word", " Hello"),
        ("mixed_scripts", "Ελληνικά русский язык עברית ქართული ᏣᎳᎩ ไทย"),
    ]
    rng = random.Random(20240607)
    palette = list("aZé 9\n\r\t'sSlLtT.,!?-_") + ["ſ", "東", "😀", "\u0301", "٣", "\u00a0", "  ", "\r\n", "'RE", "123"]
    for i in range(4):
        cases.append((f"random_palette_{i}", "".join(rng.choice(palette) for _ in range(200))))
    return cases


def training_text(cases):
    text = open(os.path.join(ROOT, "data", "tinyshakespeare", "input.txt"), encoding="utf-8").read()[:400_000]
    return [t for _, t in cases] * 20 + text.split("\n")


def save(tok, name, cases, extra_files=None):
    d = os.path.join(HERE, name)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
    for fname, content in (extra_files or {}).items():
        with open(os.path.join(d, fname), "w") as f:
            json.dump(content, f, indent=1)
    write_ids(Tokenizer.from_file(os.path.join(d, "tokenizer.json")), os.path.join(d, "ids.json"), cases)


def write_ids(tok, path, cases):
    out = {}
    for name, text in cases:
        tok.encode_special_tokens = False
        ids = tok.encode(text, add_special_tokens=True).ids
        tok.encode_special_tokens = True
        plain = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        out[name] = {"ids": ids, "plain": plain, "decoded": tok.decode(ids, skip_special_tokens=True)}
    with open(path, "w") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


def with_json(tok, edit):
    j = json.loads(tok.to_str())
    edit(j)
    return Tokenizer.from_str(json.dumps(j))


def llama3(cases, train):
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.train_from_iterator(train, trainers.BpeTrainer(vocab_size=4000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    tok.add_special_tokens(specials)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])])

    def edit(j):
        m = j["model"]
        m["ignore_merges"] = True
        # Whole words with no merge path: only ignore_merges makes them one token.
        for w in ["ĠHamlet", "Ġunbelievable", "Ġkingdom", "ĠĠĠ", "ĠKING", "Ġzyzzyva"]:
            if w not in m["vocab"]:
                new_id = len(m["vocab"])
                for a in j["added_tokens"]:
                    a["id"] += 1
                m["vocab"][w] = new_id
        ids = {a["content"]: a["id"] for a in j["added_tokens"]}
        for item in j["post_processor"]["processors"]:
            if item["type"] == "TemplateProcessing":
                for k, v in item["special_tokens"].items():
                    v["ids"] = [ids[k]]
    save(with_json(tok, edit), "llama3", cases)


def qwen2(cases, train):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.train_from_iterator(train, trainers.BpeTrainer(vocab_size=3000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    config = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False}
    save(tok, "qwen2", cases, {"tokenizer_config.json": config})


def llama2(cases, train):
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=["<unk>", "<s>", "</s>"] + bytes_, limit_alphabet=120,
                                  show_progress=False)
    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    t.train_from_iterator(train, trainer)
    trained = json.loads(t.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(trained["vocab"], merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ["<unk>", "<s>", "</s>"]])
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1, right=0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    save(tok, "llama2", cases)


def smollm2_style(cases, train):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.train_from_iterator(train, trainers.BpeTrainer(vocab_size=3000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                                       show_progress=False))
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True, normalized=False),
                            AddedToken("<sep>", rstrip=True, special=True, normalized=False)])
    tok.add_tokens([AddedToken("wordtok", single_word=True, special=False, normalized=True)])
    tok.decoder = decoders.ByteLevel()

    def edit(j):  # digit merges, so that individual_digits decides the ids
        m = j["model"]
        for a, b in [("1", "2"), ("12", "3"), ("Ġ", "1")]:
            if a + b not in m["vocab"]:
                new_id = len(m["vocab"])
                for t in j["added_tokens"]:
                    if t["id"] >= new_id:
                        t["id"] += 1
                m["vocab"][a + b] = new_id
            m["merges"].insert(0, [a, b])
    save(with_json(tok, edit), "smollm2_style", cases)


def smollm2_gguf(cases, path):
    import gguf
    r = gguf.GGUFReader(path)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in r.fields["tokenizer.ggml.merges"].contents()]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                                                          use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
    d = os.path.join(HERE, "smollm2_gguf")
    os.makedirs(d, exist_ok=True)
    write_ids(tok, os.path.join(d, "ids.json"), cases)


def main():
    cases = corpus()
    with open(os.path.join(HERE, "corpus.json"), "w") as f:
        json.dump([{"name": n, "text": t} for n, t in cases], f, ensure_ascii=False, indent=0)
        f.write("\n")
    train = training_text(cases)
    llama3(cases, train)
    qwen2(cases, train)
    llama2(cases, train)
    smollm2_style(cases, train)
    gguf_path = sys.argv[1] if len(sys.argv) > 1 else GGUF_DEFAULT
    if os.path.exists(gguf_path):
        smollm2_gguf(cases, gguf_path)
    else:
        print(f"{gguf_path} not found: smollm2_gguf/ids.json left as it is", file=sys.stderr)


if __name__ == "__main__":
    main()
