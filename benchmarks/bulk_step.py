"""Products "bulk" (eaglekit.models.bulk) at the Llama-3.1-8B shape: where the recorded baseline step's time goes.

The decoder's own graph of one greedy step (context 512 in a 1024 cache, random bf16 weights), recorded twice: with
every bulk kernel a programmatic dependent launch (as shipped) and with plain launches (ek_bulk_set_pdl(0)). For
each: the step by CUDA events (median of 200 replays), and one replay under torch.profiler: kernels by kind (count,
summed duration; under PDL a kernel's duration includes its time parked at griddepcontrol.wait, so only the plain
recording's sums are each kernel's own cost) and the span. Also 8 layers alone (bulk.Kernels.layer on fixed
inputs, one graph), the shape benchmarks/layer_probe.py timed its harness variants at.

    python benchmarks/bulk_step.py OUT_DIR
"""

import collections
import json
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import h200_suite as suite  # noqa: E402
from fast_probe import timeline  # noqa: E402


def kinds(ev) -> dict:
    by = collections.defaultdict(lambda: [0, 0.0])
    for _, dur, name in ev:
        key = re.sub(r"\(.*", "", name.replace("void ", "").replace("(anonymous namespace)::", ""))[:70]
        by[key][0] += 1
        by[key][1] += dur
    return {k: [n, round(us / 1e3, 4)] for k, (n, us) in sorted(by.items(), key=lambda kv: -kv[1][1])}


def layers_graph(t, kern, n_layers: int = 8):
    """bulk's layer for the first n_layers layers at one row, context 512, one CUDA graph -> (ms, output)."""
    net, c = t.net, t.cfg
    x0 = torch.randn(1, 1, c.hidden_size, device="cuda", generator=torch.Generator("cuda").manual_seed(0)).bfloat16()
    pos = torch.tensor([512], device="cuda")
    cos, sin = (a.reshape(1, -1).contiguous() for a in net.rotary(pos, torch.bfloat16))
    base = torch.tensor([512], device="cuda")
    from eaglekit.models import attend

    mask = torch.zeros(1, 1, 1024, dtype=torch.bool, device="cuda")
    mask[..., :513] = True
    slots, count, _ = attend.visible(mask, base)
    scratch = kern.scratch(1, 1024, c.num_kv_heads, c.num_heads // c.num_kv_heads)

    def body():
        x = x0
        for i in range(n_layers):
            x = kern.layer(net.model.layers[i], x, cos, sin, t.cache.layer(i), base, slots[0], count[0], scratch)
        return x

    body()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = body()
    return suite.events_ms(g.replay, reps=200, warm=10), out


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    from eaglekit.decoding.engine import Decoder
    from eaglekit.models import bulk

    suite.copy_bandwidth()
    bw = suite.RESULTS["copy_bandwidth_bytes_per_s"]
    suite.PRODUCTS = "bulk"
    t, _ = suite.llama8b()
    emb = t.net.model.embed_tokens.weight
    nbytes = sum(p.numel() * p.element_size() for p in t.net.parameters()) - emb.numel() * emb.element_size()
    lib = bulk.library()
    kern = t.net.products.layer_kernels
    res = {"copy_bandwidth_TBps": round(bw / 1e12, 3), "weight_bytes": nbytes}
    dec = Decoder(t)
    prompt = torch.randint(0, 128000, (512,), device="cuda")
    for pdl in (1, 0):
        lib.ek_bulk_set_pdl(pdl)
        t.reset(1024)
        logits, _ = t.prefill(prompt)
        dec._steps.clear()
        g, buf = dec._graphed_step(logits[-1].argmax())
        ms = suite.events_ms(g.replay, reps=200, warm=5)
        ev = timeline(g.replay)
        span = (ev[-1][0] + ev[-1][1] - ev[0][0]) / 1e3
        l8, _ = layers_graph(t, kern)
        res[f"pdl{pdl}"] = {"step_ms": round(ms, 4), "fraction_of_copy": round(nbytes / (ms / 1e3) / bw, 4),
                            "profiled_span_ms": round(span, 4), "kernels": len(ev),
                            "eight_layers_ms": round(l8, 4), "by_kind": kinds(ev),
                            "one_layer": [[round(d, 2), kinds([(0, d, n)]).popitem()[0]] for _, d, n in ev[60:67]]}
        print(json.dumps({k: v for k, v in res[f"pdl{pdl}"].items() if k not in ("by_kind", "one_layer")}))
        print("   a layer's kernels (us):", res[f"pdl{pdl}"]["one_layer"], flush=True)
        for k, v in list(res[f"pdl{pdl}"]["by_kind"].items())[:14]:
            print(f"   {v[0]:5d} {v[1]:8.4f} ms  {k}")
    lib.ek_bulk_set_pdl(1)
    # how the products read x (bulk.cu's EK_XLOAD), each a library of its own swapped into the same kernels object
    _, ref = layers_graph(t, kern)
    for xl in (1, 2, 0):
        kern.lib = bulk.library((f"EK_XLOAD={xl}",)) if xl else lib
        l8, y = layers_graph(t, kern)
        t.reset(1024)
        logits, _ = t.prefill(prompt)
        dec._steps.clear()
        g, buf = dec._graphed_step(logits[-1].argmax())
        ms = suite.events_ms(g.replay, reps=200, warm=5)
        res[f"xload{xl}"] = {"eight_layers_ms": round(l8, 4), "same_bits": bool(torch.equal(y, ref)),
                             "step_ms": round(ms, 4), "fraction_of_copy": round(nbytes / (ms / 1e3) / bw, 4)}
        print(f"xload {xl}:", res[f"xload{xl}"], flush=True)
    (out / "bulk_step.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
