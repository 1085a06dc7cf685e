#!/usr/bin/env python3
"""Golden files of loom's SentencePiece-style GGUF tokenizer (tokenizer.ggml.model = "llama"),
read by tests/data/gguf_spm_tokenizer_test.cpp; the reference is llama.cpp itself, through
llama-cpp-python's bindings of its C API (llama_tokenize, llama_detokenize).

  vocab.gguf  a vocabulary-only GGUF: general.architecture "llama" and the tokenizer.ggml.* keys,
              no tensors. Pieces are ../hf_tokenizers/llama2's 3000 (<unk>, <s>, </s>, the 256
              <0xNN> byte tokens, then BPE pieces in merge order) with score -((id - 259) // 3)
              for normal pieces, so every three share a score and ties are common; a few more
              normal pieces (EXTRA_NORMAL); control and user-defined tokens, retyped where the
              BPE learned them as pieces (merges can then make "<|im_start|>" from plain text)
              and appended otherwise (one, "e<|", overlaps the control "<|im_end|>" so that the
              order llama.cpp cuts special tokens out in decides ids); and one unused token.
  ids.json    per case (the corpus of ../hf_tokenizers/corpus.json, the ill-formed UTF-8 cases
              of ../tokenizer/, and the cases below):
                ids              llama_tokenize(text, add_special=true, parse_special=true)
                plain            llama_tokenize(text, add_special=false, parse_special=false)
                decoded          llama_detokenize(ids, remove_special=false, unparse_special=false)
                decoded_special  llama_detokenize(ids, remove_special=false, unparse_special=true)
                plain_decoded    llama_detokenize(plain, remove_special=false, unparse_special=false)
              text and decoded strings that are not valid UTF-8 are written as "<key>_hex";
              "variant" holds the same "ids" for vocab.gguf with add_space_prefix = false,
              add_bos_token = false and add_eos_token = true (the test writes that file itself),
              "decode_cases" id lists that encoding never makes (unused, unknown and
              user-defined tokens first, a byte token for a space first), and for all of
              data/tinyshakespeare/input.txt the count and FNV-1a 64 hash of its "plain" ids.
  cli_special_like.*  the corpus case "special_like" for `loom tokenize --tokenizer vocab.gguf`
              (tests/cli/tokenizer_cli_test.sh): .txt the text, .plain.ids its "plain" ids
              (`loom tokenize`), .ids its "ids" (`--special --add-bos`), .decoded.txt
              "decoded" (`--decode`) and .decoded_special.txt "decoded_special" (`--decode
              --special`).

Vocabulary-only files load in llama.cpp when general.architecture names an architecture it
knows ("llama"); no hyper-parameters or tensors are needed with vocab_only.

Run by hand, never in CI (the venv is the llama.cpp peer's, bench/peers/setup_llama_cpp.sh):
  build/peers/llama-venv/bin/python tests/golden/gguf_spm/make_golden.py
"""
import ctypes
import json
import os
import struct
import sys
import tempfile

try:
    import gguf
    import llama_cpp
except ImportError as e:
    sys.exit(f"[golden] missing Python package ({e.name}); run with the llama.cpp peer's venv "
             "(bench/peers/setup_llama_cpp.sh build/peers/llama-venv)")

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(GOLDEN))

CONTROL = ["<|im_start|>", "<|im_end|>", "<mask>"]
USER_DEFINED = ["<sep>", "wordtok", "e<|", "x\u2581y"]
UNUSED = ["<unused_piece>"]
# Pieces the BPE never learned: whitespace runs and doubled letters whose scores tie with
# others, and "</" so that merges reach the control token "</s>" from plain text.
EXTRA_NORMAL = [("\u2581\u2581", -5.0), ("\u2581\u2581\u2581\u2581", -5.0), ("ee", -7.0), ("oo", -7.0), ("</", -9.0)]

EXTRA_CASES = [
    ("overlapping_added", "Hi there<|im_end|> and there<|im_start|>e<|im_end|>"),
    ("ties_runs", "aaaaaaa eeeeee llllll oooooo 0000000000000 ---------- ......... !!!! ''''' zzzz"),
    ("literal_markers", "\u2581already \u2581\u2581escaped <0x41> <s> </s> <unk> x\u2581y"),
    ("leading_specials", "<s>hello<|im_start|> x<sep>y <mask>  z</s>"),
    ("only_spaces", "     "),
    ("space_then_special", " <|im_start|> "),
    ("newlines_only", "\n\n\n"),
]
CLI_CASE = "special_like"
# Ill-formed UTF-8: llama.cpp takes a character's length from its first byte alone.
EXTRA_BYTE_CASES = [
    ("lead_byte_lengths", b"\xe4AB c\xf0abcd \xc3 \x80\x80 ok\xff\xfe end\xe2\x96"),
]


def corpus():
    cases = [(c["name"], c["text"].encode("utf-8"))
             for c in json.load(open(os.path.join(GOLDEN, "hf_tokenizers", "corpus.json"), encoding="utf-8"))]
    old = os.path.join(GOLDEN, "tokenizer")
    for name in open(os.path.join(old, "CASES")).read().split():
        raw = open(os.path.join(old, name + ".txt"), "rb").read()
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            cases.append((name, raw))  # the UTF-8 ones are in corpus.json already
    cases += [(n, t.encode("utf-8")) for n, t in EXTRA_CASES] + EXTRA_BYTE_CASES
    return cases


def vocabulary():
    j = json.load(open(os.path.join(GOLDEN, "hf_tokenizers", "llama2", "tokenizer.json"), encoding="utf-8"))
    pieces = [t for t, _ in sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])]
    assert pieces[:3] == ["<unk>", "<s>", "</s>"] and pieces[3:259] == [f"<0x{b:02X}>" for b in range(256)]
    scores = [0.0] * 259 + [-float((i - 259) // 3) for i in range(259, len(pieces))]
    types = [2, 3, 3] + [6] * 256 + [1] * (len(pieces) - 259)
    for p, score in EXTRA_NORMAL:
        assert p not in pieces, p
        pieces.append(p)
        scores.append(score)
        types.append(1)
    # A special piece the BPE learned keeps its id and score, so merges can still reach it.
    for group, kind in ((CONTROL, 3), (USER_DEFINED, 4), (UNUSED, 5)):
        for p in group:
            if p in pieces:
                types[pieces.index(p)] = kind
            else:
                pieces.append(p)
                scores.append(0.0)
                types.append(kind)
    return pieces, scores, types


def write_vocab(path, add_space_prefix=True, add_bos=True, add_eos=False):
    pieces, scores, types = vocabulary()
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_name("loom spm golden")
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(add_bos)
    w.add_add_eos_token(add_eos)
    w.add_add_space_prefix(add_space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return pieces, types


class Vocab:
    def __init__(self, path):
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            sys.exit(f"[golden] llama.cpp could not load {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)

    def tokenize(self, text, add_special, parse_special):
        cap = len(text) + 8
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self.vocab, text, len(text), buf, cap, add_special, parse_special)
        assert n >= 0, n
        return list(buf[:n])

    def detokenize(self, ids, remove_special, unparse_special):
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        cap = 64 + 64 * len(ids)
        out = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), out, cap, remove_special, unparse_special)
        assert n >= 0, n
        return out.raw[:n]


def fnv1a64(ids):
    """FNV-1a 64 over the ids as little-endian int32, as loom's shard_format.h computes it."""
    h = 0xCBF29CE484222325
    for b in struct.pack(f"<{len(ids)}i", *ids):
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def put_bytes(d, key, raw):
    try:
        d[key] = raw.decode("utf-8")
    except UnicodeDecodeError:
        d[key + "_hex"] = raw.hex()


def main():
    vocab_path = os.path.join(HERE, "vocab.gguf")
    pieces, types = write_vocab(vocab_path)
    v = Vocab(vocab_path)
    with tempfile.TemporaryDirectory() as tmp:
        variant_path = os.path.join(tmp, "variant.gguf")
        write_vocab(variant_path, add_space_prefix=False, add_bos=False, add_eos=True)
        variant = Vocab(variant_path)

        out = {"cases": [], "decode_cases": []}
        for name, text in corpus():
            ids = v.tokenize(text, True, True)
            plain = v.tokenize(text, False, False)
            # loom's encode adds no BOS: the caller prepends bos_id() when add_bos() says so.
            assert ids[:1] == [1] and ids[1:] == v.tokenize(text, False, True), name
            case = {"name": name}
            put_bytes(case, "text", text)
            case["ids"] = ids
            case["plain"] = plain
            put_bytes(case, "decoded", v.detokenize(ids, False, False))
            put_bytes(case, "decoded_special", v.detokenize(ids, False, True))
            put_bytes(case, "plain_decoded", v.detokenize(plain, False, False))
            case["variant"] = variant.tokenize(text, True, True)
            out["cases"].append(case)

    def ident(piece):
        return pieces.index(piece)
    space_byte, a_byte = ident("<0x20>"), ident("<0x41>")
    hello = v.tokenize(b"hello there", False, False)
    for ids in ([ident("<unused_piece>")] + hello, [ident("x\u2581y")] + hello, [0] + hello,
                [space_byte, space_byte, a_byte], [ident("<|im_start|>")] + hello, [1, 1] + hello + [2],
                hello + [ident("<sep>"), ident("<unused_piece>"), 0] + hello, [ident("<0xE4>"), ident("<0xB8>")]):
        case = {"ids": ids}
        put_bytes(case, "decoded", v.detokenize(ids, False, False))
        put_bytes(case, "decoded_special", v.detokenize(ids, False, True))
        out["decode_cases"].append(case)

    # All of Tiny Shakespeare, too long to keep as ids: their count and FNV-1a 64 hash.
    whole = v.tokenize(open(os.path.join(ROOT, "data", "tinyshakespeare", "input.txt"), "rb").read(), False, False)
    out["tinyshakespeare"] = {"plain_tokens": len(whole), "plain_fnv1a64": f"{fnv1a64(whole):016x}"}

    with open(os.path.join(HERE, "ids.json"), "w", encoding="utf-8") as f:  # one case a line
        f.write("{\n")
        for key in ("cases", "decode_cases"):
            rows = ",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in out[key])
            f.write(f'"{key}": [\n{rows}\n],\n')
        f.write(f'"tinyshakespeare": {json.dumps(out["tinyshakespeare"])}\n}}\n')
    cli = next(c for c in out["cases"] if c["name"] == CLI_CASE)
    prefix = os.path.join(HERE, f"cli_{CLI_CASE}")
    with open(prefix + ".txt", "w", encoding="utf-8") as f:
        f.write(cli["text"])
    for ext, key in ((".plain.ids", "plain"), (".ids", "ids")):
        with open(prefix + ext, "w") as f:
            f.write(" ".join(map(str, cli[key])) + "\n")
    for ext, key in ((".decoded.txt", "decoded"), (".decoded_special.txt", "decoded_special")):
        with open(prefix + ext, "w", encoding="utf-8") as f:
            f.write(cli[key])
    n_types = {t: types.count(t) for t in sorted(set(types))}
    print(f"vocab.gguf: {len(pieces)} pieces, types {n_types}; ids.json: {len(out['cases'])} cases, "
          f"{len(out['decode_cases'])} decode cases")


if __name__ == "__main__":
    main()
