#!/usr/bin/env python3
"""tests/data/tokenizer/classes.txt: how Hugging Face `tokenizers` splits every code point.

The Qwen3.5/3.6 pre-tokenizer is one Split(regex, Isolated); its pieces depend on whether a
character is a letter or mark (\\p{L}, \\p{M}), a number (\\p{N}), white space (\\s) or anything
else, and those classes come from the regex engine's Unicode tables.  This script asks HF's own
pre-tokenizer, for every scalar value c (surrogates excepted), with three probes:
    "a" + c      one piece       -> L  (c continues a letter run: a letter or a mark)
    "!" + c + "!" one piece      -> O  (c joins a punctuation run: none of the others)
    c + c        two pieces      -> N  (\\p{N} takes one character at a time)
    otherwise                    -> S  (white space)
and writes the code points that are not O as ranges "LO HI CLASS" (hex).
tests/test_tokenizer.c (test_pretokenizer_classes) runs the same probes through the C
pre-tokenizer and compares every code point.

    pip install tokenizers==0.23.3
    python3 tools/gen/make_pretokenizer_classes.py      # about a minute
"""
import argparse
import json
import os

import tokenizers
from tokenizers import Regex
from tokenizers.pre_tokenizers import Split

# The Qwen3.5/3.6 split regex, as in tokenizer.json (and tokenizer.c's synthetic vocabulary).
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def classify(split, c):
    n = lambda s: len(split.pre_tokenize_str(s))
    if n("a" + c) == 1:
        return "L"
    if n("!" + c + "!") == 1:
        return "O"
    return "N" if n(c + c) == 2 else "S"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="build/tokenizer/tokenizer.json",
                    help="checked to use the same regex, when present")
    ap.add_argument("--out", default="tests/data/tokenizer/classes.txt")
    args = ap.parse_args()
    if os.path.exists(args.tokenizer):
        with open(args.tokenizer) as f:
            pre = json.load(f)["pre_tokenizer"]
        splits = [p for p in pre.get("pretokenizers", [pre]) if p["type"] == "Split"]
        assert splits and splits[0]["pattern"]["Regex"] == QWEN35_REGEX, "tokenizer.json has another regex"
    split = Split(Regex(QWEN35_REGEX), behavior="isolated")
    rows, lo, prev = [], 0, None
    for cp in range(0x110001):
        k = "O" if cp == 0x110000 or 0xD800 <= cp <= 0xDFFF else classify(split, chr(cp))
        if k != prev:
            if prev not in (None, "O"):
                rows.append(f"{lo:X} {cp - 1:X} {prev}")
            lo, prev = cp, k
    with open(args.out, "w") as f:
        f.write(f"# calla pre-tokenizer classes v1\n"
                f"# made by tools/gen/make_pretokenizer_classes.py with tokenizers {tokenizers.__version__}\n"
                f"# LO HI CLASS (hex, inclusive): L letter or mark, N number, S white space; others O\n")
        f.write("\n".join(rows) + "\n")
    print(f"make_pretokenizer_classes: {len(rows)} ranges, wrote {args.out}")


if __name__ == "__main__":
    main()
