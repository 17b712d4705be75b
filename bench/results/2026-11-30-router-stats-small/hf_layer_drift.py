#!/usr/bin/env python3
"""hf_layer_drift.py DIR [N]: HF bf16 against HF fp32 on a Calla checkpoint, hidden state after each layer
(normalised error), N bench-rule tokens (default 128). Needs torch + transformers."""
import json
import os
import sys

import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../tools"))
from make_golden import Checkpoint, build_hf, hash_prompt
d = sys.argv[1]
cfg = json.load(open(os.path.join(d, "config.json")))
V = cfg["text_config"]["vocab_size"]
ids = hash_prompt(int(sys.argv[2]) if len(sys.argv) > 2 else 128, 0, V)
out = {}
for dt in (torch.float32, torch.bfloat16):
    m, _ = build_hf(Checkpoint(d), cfg, "cpu", dt)
    with torch.no_grad():
        o = m(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    out[dt] = [h[0].double() for h in o.hidden_states]
    del m
a, b = out[torch.float32], out[torch.bfloat16]
for i, (x, y) in enumerate(zip(a, b)):
    print(f"hidden {i:2d}: rms {float(x.pow(2).mean().sqrt()):8.3f}  nerr bf16 vs fp32 {float((y - x).norm() / x.norm()):.3e}")
