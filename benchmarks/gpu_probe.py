"""A first look at our decoder on the GPU (copy bandwidth, eager and compiled decode/verify at the
Llama-3.1-8B shape). Every section is guarded: a failure is printed and the probe goes on."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import torch


def timed(fn, reps=30, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def main():
    out = {}
    dev = "cuda"
    x = torch.empty(2 * 2**30, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    ms = timed(lambda: y.copy_(x), reps=20)
    out["copy_bandwidth_bytes_per_s"] = 2 * x.numel() / (ms / 1e3)
    del x, y
    print("copy bandwidth", out["copy_bandwidth_bytes_per_s"] / 1e12, "TB/s", flush=True)
    from eaglekit.models.config import parse_target_config
    from eaglekit.models.layers import KVCache
    from eaglekit.models.llama import LlamaModel
    from eaglekit.train.pretrain import llama_config

    raw = llama_config(128256, 4096, 32, 32, 8, 14336, max_pos=8192, tie=False)
    raw["rope_theta"] = 500000.0
    cfg = parse_target_config(raw)
    with torch.device(dev):
        net = LlamaModel(cfg).to(torch.bfloat16).eval()
    for p in net.parameters():
        p.data.normal_(0, 0.02)
    nbytes = sum(p.numel() * p.element_size() for p in net.parameters()) - net.model.embed_tokens.weight.numel() * 2
    out["weight_bytes_non_embedding"] = nbytes
    S = 1024
    cache = KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, S, 1, dev, torch.bfloat16)
    L = 512

    def step_fn(T):
        ids = torch.randint(0, 1000, (1, T), device=dev)
        pos = torch.arange(L, L + T, device=dev)
        slots = pos.clone()
        mask = torch.ones(1, T, S, dtype=torch.bool, device=dev)

        def f():
            with torch.inference_mode():
                h, _ = net(ids, pos, cache, slots, mask)
                return net.lm_head(h[:, -1])
        return f

    for T in (1, 4, 8, 16, 48):
        try:
            ms = timed(step_fn(T))
            out[f"eager_T{T}_ms"] = ms
            print(f"eager T={T}: {ms:.2f} ms", flush=True)
        except Exception:
            traceback.print_exc()
    for mode in ("reduce-overhead", "max-autotune-no-cudagraphs"):
        try:
            t0 = time.time()
            cf = torch.compile(net, mode=mode, fullgraph=True)
            for T in (1, 4, 8):
                ids = torch.randint(0, 1000, (1, T), device=dev)
                pos = torch.arange(L, L + T, device=dev)
                mask = torch.ones(1, T, S, dtype=torch.bool, device=dev)

                def g():
                    with torch.inference_mode():
                        h, _ = cf(ids, pos, cache, pos, mask)
                        return h
                ms = timed(g, reps=50, warm=3)
                out[f"{mode}_T{T}_ms"] = ms
                print(f"{mode} T={T}: {ms:.2f} ms ({time.time() - t0:.0f}s incl. compile)", flush=True)
        except Exception:
            traceback.print_exc()
    if "reduce-overhead_T1_ms" in out:
        tps = 1e3 / out["reduce-overhead_T1_ms"]
        out["compiled_tokens_per_s"] = tps
        out["bandwidth_fraction"] = tps * nbytes / out["copy_bandwidth_bytes_per_s"]
    print(json.dumps(out, indent=1))
    dest = os.environ.get("OUT", "/tmp")
    with open(os.path.join(dest, "gpu_probe.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
