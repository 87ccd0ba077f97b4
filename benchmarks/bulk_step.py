"""Products "bulk" (eaglekit.models.bulk) at the Llama-3.1-8B shape: where the recorded baseline step's time goes.

The decoder's own graph of one greedy step (context 512 in a 1024 cache, random bf16 weights), recorded with the norms
in the products (five kernels a layer, as shipped) and each norm its own kernel (seven), alternating, every kernel a
programmatic dependent launch; then as shipped with plain launches (ek_bulk_set_pdl(0)). For
each: the step by CUDA events (median of 200 replays), and one replay under torch.profiler: kernels by kind (count,
summed duration; under PDL a kernel's duration includes its time parked at griddepcontrol.wait, so only the plain
recording's sums are each kernel's own cost) and the span. Also 8 layers alone (bulk.Kernels.layer on fixed
inputs, one graph), the shape benchmarks/layer_probe.py timed its harness variants at, and the step at a verify's
row counts.

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
    pos = base = torch.tensor([512], device="cuda")
    block = torch.ones(1, 1, dtype=torch.bool, device="cuda")
    inv_freq = net.rotary.inv_freq.float()
    scratch = kern.scratch(1, 1024, c.num_kv_heads, c.num_heads // c.num_kv_heads)

    def body():
        return kern.layers(net.model.layers[:n_layers], x0, pos, inv_freq, t.cache.layer, base, block, scratch)

    body()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = body()
    return suite.events_ms(g.replay, reps=200, warm=10), out


def rows_ms(t, dec, logits, counts) -> dict:
    """The step recorded with k rows (the token and k - 1 copies of it, as Target.step(rows=k) runs them): ms each."""
    out = {}
    for rows in counts:
        g, buf = dec._graphed_step(logits[-1].argmax(), rows)
        t.committed.fill_(512)  # (each replay commits one token: 105 of them stay inside the 1024 cache)
        out[rows] = round(suite.events_ms(g.replay, reps=100, warm=5), 4)
    return out


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
    # the norms in the products (five kernels a layer, the default) against each norm its own kernel (seven), side
    # by side in two rounds, then the default with plain launches (its kernels' own durations)
    for name, stats, pdl in (("stats", True, 1), ("rms", False, 1), ("stats", True, 1), ("rms", False, 1),
                             ("stats", True, 0)):
        lib.ek_bulk_set_pdl(pdl)
        kern.norm_stats = stats
        t.reset(1024)
        logits, _ = t.prefill(prompt)
        dec._steps.clear()
        g, buf = dec._graphed_step(logits[-1].argmax())
        ms = suite.events_ms(g.replay, reps=200, warm=5)
        ev = timeline(g.replay)
        span = (ev[-1][0] + ev[-1][1] - ev[0][0]) / 1e3
        l8, _ = layers_graph(t, kern)
        per = 5 if stats else 7
        key = f"{name}_pdl{pdl}" + ("" if f"{name}_pdl{pdl}" not in res else "_again")
        res[key] = {"step_ms": round(ms, 4), "fraction_of_copy": round(nbytes / (ms / 1e3) / bw, 4),
                    "profiled_span_ms": round(span, 4), "kernels": len(ev), "eight_layers_ms": round(l8, 4),
                    "by_kind": kinds(ev),
                    "one_layer": [[round(d, 2), kinds([(0, d, n)]).popitem()[0]]
                                  for _, d, n in ev[10 * per:11 * per]]}
        print(key, json.dumps({k: v for k, v in res[key].items() if k not in ("by_kind", "one_layer")}))
        print("   a layer's kernels (us):", res[key]["one_layer"], flush=True)
        for k, v in list(res[key]["by_kind"].items())[:10]:
            print(f"   {v[0]:5d} {v[1]:8.4f} ms  {k}")
    lib.ek_bulk_set_pdl(1)
    kern.norm_stats = True
    dec._steps.clear()  # (the plain recording's graphs must not serve the row counts below)
    # (build options compared in earlier sessions the same way: x loads, a chunk's copies by one producer lane or
    # eight, rings of 8 or 12 slots; NOTES, sixteenth session. bulk.library(("EK_NSLOTS=12",)) builds such a variant.)
    # a verify's shapes (rows_ms)
    t.reset(1024)
    logits, _ = t.prefill(prompt)
    # past 8 rows: tile groups of 2 (the default) against 1, each build swapped into kern.lib, alternating
    variants = {"": lib, "_tg1": bulk.library(("EK_TG_WIDE=1",))}
    for rnd in range(2):
        for name, vlib in variants.items():
            kern.lib = vlib
            dec._steps.clear()
            key = f"rows_ms{name}" + ("_again" if rnd else "")
            res[key] = rows_ms(t, dec, logits, (1, 5, 7, 9, 17, 49) if not (name or rnd) else (9, 17, 49))
            print(f"step at k rows (ms), {key}:", res[key], flush=True)
    kern.lib = lib
    # products "invariant" (uncompiled graphs) at the same row counts, same machine: what bulk replaces
    t.set_products("invariant")
    dec = Decoder(t)
    t.reset(1024)
    logits, _ = t.prefill(prompt)
    res["rows_ms_invariant"] = rows_ms(t, dec, logits, (1, 9, 17, 49))
    print("step at k rows (ms), invariant:", res["rows_ms_invariant"], flush=True)
    (out / "bulk_step.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
