#!/usr/bin/env python3
"""Golden outputs of the reference implementation (Hugging Face transformers) for Calla's tests.

For each geometry: `calla synth` writes a synthetic MLX checkpoint; this script maps the MLX
tensors back into an HF `Qwen3_5MoeForCausalLM` (dequantize; undo the folded +1 on the decoder
norms; conv [C,K,1] -> [C,1,K]; gate/up experts fused into gate_up_proj), runs it on fixed
prompts and writes one small fixture per (geometry, prompt) under tests/golden/.

Regenerate (needs torch + transformers; the H200 machine has them):
    make && python3 tools/gen/make_golden.py --calla build/calla --out tests/golden
Full shape (HF in bf16 on the GPU, a short prompt), not committed:
    python3 tools/gen/make_golden.py --calla build/calla --out /tmp/gold-full --geometries full \
        --device cuda --dtype bf16 --model-dir /tmp/full

Fixture format (little-endian), version 1:
    "CALLAGLD" u32 version | char geometry[32] | u64 seed | char ref[32] (e.g. "hf-5.17.0-float32")
    u32 n_prompt, i32 prompt[n_prompt]
    u32 n_rows; per row: u32 position, i32 top1, f32 margin (top1 - top2 over the whole vocabulary),
        f32 rms (of the whole row), u32 n_ids, i32 ids[n_ids], f32 logits[n_ids]
    u32 n_gen; i32 gen[n_gen]; f32 margin[n_gen]
Logits are kept for a fixed spread of 4,096 vocabulary ids (id = 61 j mod V) plus the row's
top 256, so a fixture stays ~100 KB while the error is still measured across the vocabulary.
"""
import argparse
import json
import os
import struct
import subprocess
import sys

import numpy as np

MAGIC = b"CALLAGLD"
VERSION = 1
SPREAD = 4096
TOP = 256


def hash_prompt(n, offset, vocab):
    return [((i + offset) * 2654435761 % (1 << 32)) % vocab for i in range(n)]


# ---- reading the MLX checkpoint ------------------------------------------------------------

class Checkpoint:
    def __init__(self, d):
        self.dir = d
        idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
        self.where = idx["weight_map"]
        self.headers = {}
        for f in set(self.where.values()):
            path = os.path.join(d, f)
            with open(path, "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                hdr = json.loads(fh.read(n))
            self.headers[f] = (path, 8 + n, hdr)

    def raw(self, name):
        path, start, hdr = self.headers[self.where[name]]
        meta = hdr[name]
        b, e = meta["data_offsets"]
        dt = {"U32": np.uint32, "BF16": np.uint16, "F32": np.float32}[meta["dtype"]]
        mm = np.memmap(path, dtype=np.uint8, mode="r", offset=start + b, shape=(e - b,))
        return meta["dtype"], mm.view(dt).reshape(meta["shape"])

    def plain(self, torch, name, device):
        dt, a = self.raw(name)
        if dt == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        return torch.from_numpy(np.array(a, dtype=np.float32)).to(device)

    def dequant(self, torch, module, device, first=None):
        """w = scale * q + bias, in float32, as [.., N, K]; first = (a, b) takes matrices a..b-1 of a stack."""
        _, w = self.raw(module + ".weight")
        _, s = self.raw(module + ".scales")
        _, bias = self.raw(module + ".biases")
        if first is not None:
            w, s, bias = w[first[0]:first[1]], s[first[0]:first[1]], bias[first[0]:first[1]]
        K = s.shape[-1] * 64
        bits = w.shape[-1] * 32 // K
        per = 32 // bits
        wt = torch.from_numpy(np.array(w).view(np.int32)).to(device)
        shifts = (torch.arange(per, device=device, dtype=torch.int32) * bits)
        q = (wt.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)          # low bits first
        q = q.reshape(*w.shape[:-1], K).to(torch.float32)
        def f32(x):
            return torch.from_numpy((np.array(x).astype(np.uint32) << 16).view(np.float32)).to(device)
        sc = f32(s).repeat_interleave(64, dim=-1)
        bi = f32(bias).repeat_interleave(64, dim=-1)
        return sc * q + bi


def synth_profile(d):
    """The calla synth profile of checkpoint d ("uniform" when it has no calla_synth.json)."""
    try:
        with open(os.path.join(d, "calla_synth.json")) as f:
            return json.load(f).get("profile", "uniform")
    except OSError:
        return "uniform"


def build_hf(ck, cfg, device, dtype):
    import torch
    import transformers
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    tc = cfg["text_config"]
    rp = tc["rope_parameters"]
    keys = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
            "linear_value_head_dim", "linear_conv_kernel_dim", "num_experts", "num_experts_per_tok",
            "moe_intermediate_size", "shared_expert_intermediate_size", "max_position_embeddings",
            "rms_norm_eps", "layer_types"]
    conf = Qwen3_5MoeTextConfig(
        **{k: tc[k] for k in keys},
        rope_parameters={"rope_type": "default", "rope_theta": rp["rope_theta"],
                         "partial_rotary_factor": rp["partial_rotary_factor"]},
        tie_word_embeddings=False, attention_bias=False, hidden_act="silu")
    torch.set_default_dtype(dtype)
    with torch.device(device):
        try:
            model = Qwen3_5MoeForCausalLM._from_config(conf, attn_implementation="eager")
        except (TypeError, ValueError):
            conf._attn_implementation = "eager"
            model = Qwen3_5MoeForCausalLM(conf)
    torch.set_default_dtype(torch.float32)
    model.eval()
    params = dict(model.named_parameters())
    P = "language_model."
    loaded = set()

    def put(name, value):
        p = params[name]
        assert tuple(p.shape) == tuple(value.shape), (name, tuple(p.shape), tuple(value.shape))
        with torch.no_grad():
            p.copy_(value.to(p.dtype))
        loaded.add(name)

    put("model.embed_tokens.weight", ck.dequant(torch, P + "model.embed_tokens", device))
    put("lm_head.weight", ck.dequant(torch, P + "lm_head", device))
    put("model.norm.weight", ck.plain(torch, P + "model.norm.weight", device) - 1)   # HF applies 1 + w
    I = tc["moe_intermediate_size"]
    for i, kind in enumerate(tc["layer_types"]):
        L = f"model.layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm"):
            put(L + n + ".weight", ck.plain(torch, P + L + n + ".weight", device) - 1)
        if kind == "full_attention":
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                put(L + f"self_attn.{n}.weight", ck.dequant(torch, P + L + f"self_attn.{n}", device))
            for n in ("q_norm", "k_norm"):
                put(L + f"self_attn.{n}.weight", ck.plain(torch, P + L + f"self_attn.{n}.weight", device) - 1)
        else:
            for n in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
                put(L + f"linear_attn.{n}.weight", ck.dequant(torch, P + L + f"linear_attn.{n}", device))
            conv = ck.plain(torch, P + L + "linear_attn.conv1d.weight", device)          # MLX [C, K, 1]
            put(L + "linear_attn.conv1d.weight", conv.transpose(1, 2).contiguous())      # HF [C, 1, K]
            put(L + "linear_attn.A_log", ck.plain(torch, P + L + "linear_attn.A_log", device))
            put(L + "linear_attn.dt_bias", ck.plain(torch, P + L + "linear_attn.dt_bias", device))
            put(L + "linear_attn.norm.weight", ck.plain(torch, P + L + "linear_attn.norm.weight", device))  # no +1
        put(L + "mlp.gate.weight", ck.dequant(torch, P + L + "mlp.gate", device))
        put(L + "mlp.shared_expert_gate.weight", ck.dequant(torch, P + L + "mlp.shared_expert_gate", device))
        for n in ("gate_proj", "up_proj", "down_proj"):
            put(L + f"mlp.shared_expert.{n}.weight", ck.dequant(torch, P + L + f"mlp.shared_expert.{n}", device))
        # experts a slice at a time: the full-shape fp32 model leaves little GPU memory for temporaries
        gu, dn = params[L + "mlp.experts.gate_up_proj"], params[L + "mlp.experts.down_proj"]
        E = gu.shape[0]
        with torch.no_grad():
            for a in range(0, E, 32):
                b = min(E, a + 32)
                gu[a:b, :I].copy_(ck.dequant(torch, P + L + "mlp.switch_mlp.gate_proj", device, (a, b)))  # gate rows
                gu[a:b, I:].copy_(ck.dequant(torch, P + L + "mlp.switch_mlp.up_proj", device, (a, b)))    # then up
                dn[a:b].copy_(ck.dequant(torch, P + L + "mlp.switch_mlp.down_proj", device, (a, b)))
        loaded.update([L + "mlp.experts.gate_up_proj", L + "mlp.experts.down_proj"])
    missing = set(params) - loaded
    assert not missing, f"parameters not loaded: {sorted(missing)[:10]}"
    return model, transformers.__version__


def add_router_hooks(model, k, trace):
    """Record every routing decision as 'layer position gap ids lgap w1 wk lstd' (the format of
    CALLA_ROUTER_TRACE): gap = k-th probability minus the (k+1)-th, ids the chosen k ascending, lgap the
    same gap in logits, w1 and wk the largest and k-th renormalised weights, lstd the logits' std."""
    import torch
    for name, m in model.named_modules():
        if not type(m).__name__.endswith("TopKRouter"):
            continue
        layer = int(name.split("layers.")[1].split(".")[0])

        def hook(mod, inp, out, layer=layer):
            if not trace["on"]:
                return
            p = (out[0] if isinstance(out, tuple) else out).float()
            if not torch.allclose(p.sum(-1), torch.ones_like(p[:, 0]), atol=1e-3):
                p = p.softmax(-1)   # a router that returns raw logits
            top = torch.topk(p, k + 1, dim=-1)
            v = top.values.double()
            gap = (v[:, k - 1] - v[:, k]).tolist()
            lgap = (v[:, k - 1].log() - v[:, k].log()).tolist()           # logits differ from log p by a constant
            w1 = (v[:, 0] / v[:, :k].sum(-1)).tolist()
            wk = (v[:, k - 1] / v[:, :k].sum(-1)).tolist()
            lstd = p.double().clamp_min(1e-300).log().std(-1, unbiased=False).tolist()
            ids = top.indices[:, :k].sort(dim=-1).values.tolist()
            for pos, row in enumerate(ids):
                trace["lines"].append(f"{layer} {pos} {gap[pos]:.9g} {','.join(str(i) for i in row)} "
                                      f"{lgap[pos]:.6g} {w1[pos]:.6g} {wk[pos]:.6g} {lstd[pos]:.6g}\n")
        m.register_forward_hook(hook)


def logits_of(model, ids, device):
    import torch
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], device=device), use_cache=False)
    return out.logits[0].float().cpu().numpy()


def row_record(pos, row):
    order = np.argsort(-row, kind="stable")
    top1 = int(order[0])
    margin = float(row[order[0]] - row[order[1]])
    rms = float(np.sqrt(np.mean(row.astype(np.float64) ** 2)))
    V = row.shape[0]
    ids = sorted(set(int(61 * j % V) for j in range(SPREAD)) | set(int(x) for x in order[:TOP]))
    ids = np.array(ids, dtype=np.int32)
    return struct.pack("<Iiff", pos, top1, margin, rms) + struct.pack("<I", len(ids)) + ids.tobytes() + \
        row[ids].astype(np.float32).tobytes()


def write_fixture(path, geometry, seed, ref, prompt, rows, gen, gen_margin):
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<I", VERSION))
        f.write(geometry.encode().ljust(32, b"\0") + struct.pack("<Q", seed) + ref.encode()[:31].ljust(32, b"\0"))
        f.write(struct.pack("<I", len(prompt)) + np.array(prompt, dtype=np.int32).tobytes())
        f.write(struct.pack("<I", len(rows)) + b"".join(rows))
        f.write(struct.pack("<I", len(gen)) + np.array(gen, dtype=np.int32).tobytes() +
                np.array(gen_margin, dtype=np.float32).tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calla", default="build/calla")
    ap.add_argument("--out", default="tests/golden")
    ap.add_argument("--geometries", default="tiny,small")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", default="uniform", choices=["uniform", "trained"],
                    help="calla synth --profile for a new checkpoint (tests/golden* were made from uniform)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bf16"])
    ap.add_argument("--model-dir", default=None, help="reuse/put the synthetic checkpoint here")
    ap.add_argument("--gen", type=int, default=20, help="greedy tokens to generate")
    ap.add_argument("--prompts", default=None, help="prompt lengths, e.g. 40,320 (default: 40,320; full: 16)")
    ap.add_argument("--router-trace", default=None,
                    help="write HF's routing decisions on each prompt to PATH.pN (compare: tools/dev/router_diff.py)")
    ap.add_argument("--gdn", default="chunked", choices=["chunked", "recurrent"],
                    help="HF's DeltaNet prefill: its chunked form (default) or its token-by-token recurrence")
    a = ap.parse_args()
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = torch.float32 if a.dtype == "float32" else torch.bfloat16
    os.makedirs(a.out, exist_ok=True)
    for geom in a.geometries.split(","):
        d = a.model_dir or f"/tmp/calla-golden-{geom}-{a.seed}"
        if not os.path.exists(os.path.join(d, "config.json")):
            subprocess.run([a.calla, "synth", "--geometry", geom, "--seed", str(a.seed), "--profile", a.profile,
                            "--out", d], check=True)
        cfg = json.load(open(os.path.join(d, "config.json")))
        ck = Checkpoint(d)
        model, ver = build_hf(ck, cfg, a.device, dtype)
        ref = f"hf-{ver}-{a.dtype}"
        profile = synth_profile(d)
        mod = sys.modules[type(model).__module__]
        rec = getattr(mod, "torch_recurrent_gated_delta_rule", None)
        gdn = [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]
        names = [k for k, v in vars(gdn[0]).items() if callable(v) and "delta" in k.lower()] if gdn else []
        print(f"HF DeltaNet: {len(gdn)} layers, delta-rule attributes {names}, recurrent form "
              f"{'present' if rec else 'absent'}", flush=True)
        if a.gdn == "recurrent":   # the same formula token by token (HF uses it for cached decode)
            n = 0
            for m in gdn:
                for k, v in list(vars(m).items()):
                    if callable(v) and "chunk" in k and "delta" in k:
                        setattr(m, k, rec)
                        n += 1
            mod.torch_chunk_gated_delta_rule = rec   # for a forward that looks it up at call time
            print(f"HF DeltaNet prefill patched to the recurrence ({n} attributes)", flush=True)
            ref += "-rec"
        if profile == "trained":   # tests/test_golden.c synthesises (or expects) the fixture's profile
            ref += "-trained"
        V = cfg["text_config"]["vocab_size"]
        trace = {"on": False, "lines": []}
        if a.router_trace:
            add_router_hooks(model, cfg["text_config"]["num_experts_per_tok"], trace)
        lengths = [int(x) for x in (a.prompts or ("16" if geom == "full" else "40,320")).split(",")]
        for n in lengths:
            prompt = hash_prompt(n, 7919 if n > 64 else 0, V)
            trace["on"], trace["lines"] = bool(a.router_trace), []
            lg = logits_of(model, prompt, a.device)
            trace["on"] = False
            if a.router_trace:
                with open(f"{a.router_trace}.p{n}", "w") as f:
                    f.writelines(trace["lines"])
            positions = sorted(set([0, n // 3, (2 * n) // 3, n - 1]))
            rows = [row_record(p, lg[p]) for p in positions]
            # Greedy continuation, recomputing the whole sequence each step (no cache involved).
            seq, gen, margins = list(prompt), [], []
            last = lg[-1]
            for _ in range(a.gen):
                o = np.argsort(-last, kind="stable")
                gen.append(int(o[0]))
                margins.append(float(last[o[0]] - last[o[1]]))
                seq.append(int(o[0]))
                if len(gen) < a.gen:
                    last = logits_of(model, seq, a.device)[-1]
            path = os.path.join(a.out, f"{geom}-p{n}{'-trained' if profile == 'trained' else ''}.golden")
            write_fixture(path, geom, a.seed, ref, prompt, rows, gen, margins)
            print(f"{path}: {ref}, prompt {n}, rows {positions}, top1 {[struct.unpack('<Iiff', r[:16])[1] for r in rows]}, "
                  f"gen {gen}, min margin {min(margins):.4f}", flush=True)
        del model
        if a.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
