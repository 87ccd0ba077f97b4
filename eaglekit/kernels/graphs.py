"""The one way eaglekit records CUDA graphs (the decode engine's phases, the products' tuning).

("capture" in eaglekit means hidden-state capture only; CUDA graphs are "recorded".)
"""

from __future__ import annotations

import gc

import torch

# torch.cuda.graphs needs a few eager runs on a side stream before recording (allocator, cuBLAS workspaces)
WARMUP_RUNS = 2


def record_graphs(warmup: list[list], record: dict, state: list[torch.Tensor]) -> dict[str, torch.cuda.CUDAGraph]:
    """`warmup` is a list of groups of callables, each group one cycle's worth of work: every group runs in
    order WARMUP_RUNS times on a side stream, and after each group the `state` tensors it advanced (lengths,
    persistent inputs) are put back, so warm-up writes stay inside one cycle's pending slots. Then each
    callable of `record` is recorded in a graph, all graphs sharing one memory pool (they run one after the
    other, never at once). Recording executes nothing."""
    snap = [x.clone() for x in state]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(WARMUP_RUNS):
            for group in warmup:
                for fn in group:
                    fn()
                for x, v in zip(state, snap):
                    x.copy_(v)
    torch.cuda.current_stream().wait_stream(s)
    pool = torch.cuda.graph_pool_handle()
    graphs = {}
    # no garbage collection while recording: an engine dropped earlier (its phases and their graphs hold each other,
    # a cycle only the collector frees) would have its graphs destroyed mid-recording, which invalidates the capture
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for name, fn in record.items():
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                fn()
            graphs[name] = g
    finally:
        if was_enabled:
            gc.enable()
    torch.cuda.synchronize()
    return graphs
