#!/usr/bin/env python3
# Writes the GPT-2 tokenizer golden files under tests/golden/tokenizer/: each case is a raw
# corpus file <name>.txt (arbitrary bytes) and <name>.ids (space-separated ids, one line).
# The ids come from the reference algorithm of OpenAI's GPT-2 encoder.py (regex
# pre-tokenisation with the PyPI `regex` module, then rank-ordered BPE merges), re-written here
# and run on the repo's data/gpt2/encoder.json and vocab.bpe. Run by hand, never by CI:
#   python3 -m venv .venv-golden && .venv-golden/bin/pip install regex==2026.11.19
#   .venv-golden/bin/python tests/golden/make_tokenizer_golden.py
#
# Ill-formed UTF-8: the reference works on Python str, so bytes are decoded with
# 'surrogateescape'. Each byte that is not part of a well-formed sequence becomes a lone
# surrogate, which the regex sees as neither letter, number nor space: the same rule loom's
# C++ pre-tokeniser applies to ill-formed bytes. Pieces are turned back into their exact
# bytes with the same error handler, so round-trip holds for any input.
import json
import os
import random

import regex

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "golden", "tokenizer")
PAT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def byte_alphabet():
    """GPT-2's byte -> printable character map (visible Latin-1 to itself, the rest to 256+)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class ReferenceGpt2:
    def __init__(self, folder):
        with open(os.path.join(folder, "encoder.json"), encoding="utf-8") as f:
            self.encoder = json.load(f)
        self.decoder = {v: k for k, v in self.encoder.items()}
        with open(os.path.join(folder, "vocab.bpe"), encoding="utf-8") as f:
            lines = f.read().split("\n")
        pairs = [tuple(l.split()) for l in lines[1:] if l.strip()]
        self.ranks = {p: i for i, p in enumerate(pairs)}
        self.to_char = byte_alphabet()
        self.to_byte = {c: b for b, c in self.to_char.items()}
        self.cache = {}

    def bpe(self, word):
        """Merge the lowest-ranked adjacent pair, all occurrences left to right, until none."""
        if word in self.cache:
            return self.cache[word]
        parts = list(word)
        while len(parts) > 1:
            pairs = {(parts[i], parts[i + 1]) for i in range(len(parts) - 1)}
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        self.cache[word] = parts
        return parts

    def pieces(self, data):
        text = data.decode("utf-8", "surrogateescape")
        return [p.encode("utf-8", "surrogateescape") for p in PAT.findall(text)]

    def encode(self, data):
        ids = []
        for piece in self.pieces(data):
            word = "".join(self.to_char[b] for b in piece)
            ids += [self.encoder[t] for t in self.bpe(word)]
        return ids

    def decode(self, ids):
        return bytes(self.to_byte[c] for i in ids for c in self.decoder[i])


def cases():
    rng = random.Random(1234)
    shakespeare = open(os.path.join(ROOT, "data", "tinyshakespeare", "input.txt"), "rb").read()
    yield "english", (b"The quick brown fox jumps over the lazy dog. It was the best of times, it was "
                      b"the worst of times; \"Hello,\" she said -- and left!\n")
    yield "code", (b"def f(x):\n    return {'a': x[0] + 1, \"b\": [i**2 for i in range(10)]}\n\n"
                   b"int main(int argc, char** argv) {\n\tif (argc > 1) return -1;\n\treturn 0; // done\n}\n")
    yield "whitespace", b"a  b   c\t\td \n\ne\r\n\r\nf \t \n g    \n\n\n   h\t\n \x0b\x0c end   \n\t  "
    yield "whitespace_only", b"   \n\t  \n\n  "
    yield "contractions", (b"I'm you're we've they'll she'd it's don't I'M YOU'RE WE'VE THEY'LL SHE'D "
                           b"IT'S DON'T 's 't 're 've 'm 'll 'd 'S 'T 'x '' ''s  's\n")
    yield "numbers", b"0 1 12 123 1234 12345 3.14159 -42 1e10 2024-01-01 \xc2\xbd \xd9\xa3\xd9\xa4 x2 2x\n"
    yield "emoji", "Hi \U0001F600\U0001F680 ok \U0001F469\u200d\U0001F4BB! \u2764\ufe0f \U0001F1EF\U0001F1F5\n".encode()
    yield "cjk", "\u4f60\u597d\uff0c\u4e16\u754c\u3002 \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \ud55c\uad6d\uc5b4\u3000\u5168\u89d2\n".encode()
    yield "accents", "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c5ngstr\u00f6m cafe\u0301 Stra\u00dfe \u0130stanbul \u03b1\u03b2\u03b3 \u0416\u0438\u0437\u043d\u044c\n".encode()
    yield "unicode_spaces", "a\u00a0b\u2003c\u3000d\u2028e\u0085f \u00a0 g\u1680h\u202f\n".encode()
    yield "invalid_utf8", (b"ok \xff\xfe bad \xc3 lone \xe2\x82 cut \x80\x80 cont \xed\xa0\x80 surrogate "
                           b"\xc0\xaf overlong \xf4\x90\x80\x80 big \xf0\x9f\x98 trunc a\xffb \xff\xff\xffx 1\xfe2 \xc3\xa9\xc3\n")
    yield "special_text", b"<|endoftext|> is plain text here <|endoftext|>\n"
    yield "shakespeare", shakespeare[:4000]
    yield "long_runs", (b" " * 300 + b"x" + b"=" * 257 + b"\n" * 40 + b"a" * 150 + b"\t" * 33 + b"!" * 99
                        + b"0" * 77 + "\u00e9".encode() * 60 + b" " * 5)
    for i in range(4):
        yield f"random_bytes_{i}", bytes(rng.randrange(256) for _ in range(300))
    alphabet = ["a", "Z", " ", "  ", "\n", "\t", "'", "'s", "1", "\u00e9", "\u4e2d", "\U0001F600", "!", ".",
                "\xa0", "\u3000", "\x00", "\xff"]
    for i in range(4):
        text = "".join(rng.choice(alphabet) for _ in range(200))
        yield f"random_mix_{i}", text.encode("utf-8", "surrogatepass").replace(b"\xc3\xbf", b"\xff")


def main():
    ref = ReferenceGpt2(os.path.join(ROOT, "data", "gpt2"))
    os.makedirs(OUT, exist_ok=True)
    names = []
    for name, data in cases():
        ids = ref.encode(data)
        assert ref.decode(ids) == data, f"{name}: reference round-trip failed"
        # Self-consistency: pieces concatenate back, and the ids' bytes re-encode to the same ids.
        assert b"".join(ref.pieces(data)) == data
        assert ref.encode(ref.decode(ids)) == ids
        with open(os.path.join(OUT, name + ".txt"), "wb") as f:
            f.write(data)
        with open(os.path.join(OUT, name + ".ids"), "w") as f:
            f.write(" ".join(map(str, ids)) + "\n")
        names.append(name)
        print(f"{name}: {len(data)} bytes -> {len(ids)} ids")
    with open(os.path.join(OUT, "CASES"), "w") as f:
        f.write("\n".join(names) + "\n")
    print(f"{len(names)} cases written to {OUT}")


if __name__ == "__main__":
    main()
