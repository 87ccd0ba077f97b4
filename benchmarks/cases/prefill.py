"""Where a served prefill's time goes: the shipped demo pair in the engine `eaglekit serve` builds, one prompt at a
time, split into its parts.

    python -m benchmarks run cpu-prefill                          # ~30 s on 2 cores
    bash benchmarks/device.sh gpu-prefill [--param prompt_graphs=true]   # one GPU, ~1 minute

For prompts of `lengths` tokens (random ids: the cost depends on shapes, not values), `n` timed calls each, timed as the
suite times (benchmarks.timing.samples_ms: between CUDA events on a GPU, where a host-bound call spans its host time;
wall time on a CPU):
  admit_draft      BatchEngine.admit of one request with the draft (a served prefill: the target's forward capturing
                   features, the finite check's host read, the first token's read, the draft's extend over the prompt)
  admit_no_draft   the same in an engine built without the draft
  target_capture   the target's forward_rows alone, capturing the draft's features (inside prompt_calls, as a prefill)
  target_plain     the same without the capture
  draft_extend     the draft's extend_rows over the prompt's features alone
and one admit_draft call under torch.profiler: its aten calls, and on a GPU its kernels and their device time. Where the
admit's wall time is far above its kernels' device time, the prefill is host-bound (launches, per-op Python work).
"""

from __future__ import annotations

import time

import torch

from ..registry import case, suite
from ..schema import stats, value
from ..timing import samples_ms


def _engine(device: str, with_draft: bool, max_batch: int, prompt_graphs: bool, threads: int | None):
    """The engine `eaglekit serve` builds for the demo pair (its own loader and engine builder, warm-up left out: a
    prefill replays no recorded graph, and prompt graphs compile at the first prefill, which the untimed calls make)."""
    from eaglekit.demo import demo_paths
    from eaglekit.options import ModelOptions, ServeOptions
    from eaglekit.serve.server import _engine as serve_engine
    from eaglekit.serve.server import _load

    tdir, ddir, _ = demo_paths()
    model = ModelOptions(target=str(tdir), draft=str(ddir) if with_draft else None, device=device,
                         prompt_graphs=prompt_graphs)
    o = ServeOptions(max_batch=max_batch, warm_up_span=0, threads=threads)  # (threads None: serve's default)
    tok, target, draft = _load(model, o, None)
    return serve_engine(target, draft, tok, model, o, None, None)


class _Admits:
    """One request of T random tokens and one new token through an engine per call: it ends at its prefill, its row
    freed by the step that returns its event. Request ids stay distinct over the whole run."""

    def __init__(self, seed: int):
        self.g = torch.Generator().manual_seed(seed)
        self.count = 0

    def call(self, e, T: int):
        from eaglekit.decoding.requests import Request

        def admit():
            self.count += 1
            e.add(Request(f"p{self.count}", torch.randint(100, 8000, (T,), generator=self.g).tolist(), 1))
            e.admit()
            e.step()

        return admit


def _parts(e, T: int, n: int, cuda: bool, g: torch.Generator) -> dict[str, list[float]]:
    """The target's forward with and without the capture and the draft's extend, each alone, on row 0's caches."""
    from eaglekit.kernels.compiling import prompt_calls

    st, setup, dev = e.state, e.setup, e.state.device
    ids = torch.randint(100, 8000, (1, T), generator=g).to(dev)
    causal = torch.ones(1, T, T, dtype=torch.bool, device=dev).tril_()
    depths = torch.arange(T, device=dev)[None]
    kv, dk = st.tk.rows(0, 1), st.dk.rows(0, 1)
    lengths = torch.full((1,), T, dtype=torch.long, device=dev)

    def forward(capture):
        kv.length.zero_()
        return setup.target.forward_rows(kv, ids, depths, causal, T, capture, last=True)

    out = {}
    with torch.inference_mode(), prompt_calls():
        out["target_capture"] = samples_ms(lambda: forward(setup.capture), n, cuda=cuda)
        out["target_plain"] = samples_ms(lambda: forward(None), n, cuda=cuda)
        _, feats = forward(setup.capture)

        def extend():
            dk.length.zero_()
            setup.draft.extend_rows(dk, feats, ids, lengths, T)

        out["draft_extend"] = samples_ms(extend, n, cuda=cuda)
        kv.length.zero_()
        dk.length.zero_()
    return out


def _profiled(admit, cuda: bool) -> dict:
    """One admit under torch.profiler: its wall ms there, aten calls, and on a GPU its kernels and their device ms."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    sync()
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=acts) as prof:
        admit()
        sync()
    wall = (time.perf_counter() - t0) * 1e3
    events = prof.events()
    kernels = [ev for ev in events if ev.device_type == torch.autograd.DeviceType.CUDA]
    return {"wall_ms_under_profiler": wall, "aten_calls": sum(ev.name.startswith("aten::") for ev in events),
            "kernels": len(kernels), "kernel_device_ms": sum(ev.device_time for ev in kernels) / 1e3}


@case("prefill-split", "a served prefill of the demo pair split into the target's forward (with and without the "
      "capture), the draft's extend and an admit's kernels (host-bound or not)",
      defaults={"device": "cpu", "lengths": [16, 128], "n": 30, "max_batch": 64, "prompt_graphs": False,
                "threads": None},
      quick={"lengths": [16], "n": 5, "max_batch": 4})
def prefill_split(p, ctx):
    dev = p["device"]
    cuda = dev.startswith("cuda")
    lengths = p["lengths"] if isinstance(p["lengths"], list) else [p["lengths"]]
    engines = {v: _engine(dev, v == "draft", p["max_batch"], p["prompt_graphs"], p["threads"])
               for v in ("draft", "no_draft")}
    admits = _Admits(0)
    metrics: dict = {}
    profiles: dict = {}
    for T in lengths:
        for v, e in engines.items():
            # (three untimed calls first: first-use work, allocations, a prompt graph's compile)
            metrics[f"admit_{v}_ms_T{T}"] = stats(samples_ms(admits.call(e, T), p["n"], warm=3, cuda=cuda), "ms")
        for part, xs in _parts(engines["draft"], T, p["n"], cuda, admits.g).items():
            metrics[f"{part}_ms_T{T}"] = stats(xs, "ms")
        prof = _profiled(admits.call(engines["draft"], T), cuda)
        profiles[f"T{T}"] = {k: round(x, 3) if isinstance(x, float) else x for k, x in prof.items()}
        metrics[f"admit_aten_calls_T{T}"] = value(prof["aten_calls"], "calls")
        if cuda:
            metrics[f"admit_kernels_T{T}"] = value(prof["kernels"], "kernels")
            metrics[f"admit_kernel_device_ms_T{T}"] = value(prof["kernel_device_ms"], "ms")
    return {"metrics": metrics,
            "details": {"device": torch.cuda.get_device_name() if cuda else "cpu", "profile": profiles,
                        "engine": "the demo pair as eaglekit serve builds it (max_batch rows, graphs auto, adaptive)"}}


suite("cpu-prefill", "a served prefill of the demo pair on this machine, split into its parts", ["prefill-split"])
suite("gpu-prefill", "a served prefill of the demo pair on one GPU, split into its parts, and its kernels' device time",
      [("prefill-split", {"device": "cuda"})], needs="cuda")
