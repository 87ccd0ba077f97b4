"""Writes the layer table of docs/architecture.md from the import contract (pyproject.toml, [tool.importlinter]) and
the package's import graph: python docs/make_architecture_md.py. Each row is a layer, top to bottom; "imports from"
lists the rooms its modules import (at module level or inside a function), each marked with the layer it sits in,
so that every arrow is seen to point down. `lint-imports` is what enforces it; tests/test_layers.py checks that
this table is the one the contract and the code give."""

from __future__ import annotations

import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter's own TOML reader
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
START, END = "<!-- layers: written by docs/make_architecture_md.py -->", "<!-- /layers -->"

WHAT = {
    "__main__": "`python -m eaglekit`",
    "cli": "the `eaglekit` command: parses flags, calls one function per subcommand",
    "demo": "`eaglekit demo`: the shipped pair on its held-out prompts",
    "serve": "the OpenAI-compatible server over the batched engine, and the load client",
    "integrations": "what runs inside other engines (the vLLM plugin, its runner) and drives them (the live doctor)",
    "doctor": "contract checks, the wiring probe, fingerprints, verdicts",
    "tune": "measured choices: the tree sweep, the CPU demo's chain pick",
    "interop": "SGLang / SpecForge / vLLM / EAGLE draft formats and their conventions",
    "train": "regeneration, features, vocabulary mapping, TTT, the training loop, the demo recipe",
    "pair": "a target and its draft loaded together, the products chosen",
    "options": "every command's options, declared once (the Python API's arguments and the CLI's flags)",
    "decoding": "the one engine (BatchEngine: any number of rows, and when to speculate; Decoder: one request on "
                "a batch of one), tree, acceptance, sampling, stops",
    "draft": "the EAGLE-3 draft: its network, the runner of its row caches, graphs and walks, its checkpoint",
    "models": "the target side: eaglekit's decoders, the transformers adapter, loading folders",
    "kernels": "batch-invariant Triton kernels, the Hopper CUDA kernels, int8, top-k, CUDA graphs, the chooser",
    "distributed": "tensor-parallel groups and collectives",
    "tokenizer": "tokenizers from model folders, prompt files",
    "gguf": "a llama.cpp .gguf target read as a Hugging Face folder (dequantized once, cached by its digest)",
    "observe": "the instruments every layer calls: tracing, metrics, profiles, reports",
    "capture": "`CaptureSpec`, the one contract object",
    "io": "atomic writes, checked paths and text, a model folder's JSON files",
    "errors": "the error registry: every user-caused failure has a code and a fix",
}


def layers() -> list[list[str]]:
    """The contract's layers, top to bottom, each a list of rooms (independent siblings)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    contract = next(c for c in cfg if c["type"] == "layers")
    return [[r.strip() for r in layer.split("|")] for layer in contract["layers"]]


def imports_between_rooms() -> dict[str, set[str]]:
    import grimp

    graph = grimp.build_graph("eaglekit", cache_dir=None)
    out: dict[str, set[str]] = {}
    for m in graph.modules:
        parts = m.split(".")
        if len(parts) < 2:
            continue
        for d in graph.find_modules_directly_imported_by(m):
            dp = d.split(".")
            if len(dp) >= 2 and dp[1] != parts[1]:
                out.setdefault(parts[1], set()).add(dp[1])
    return out


def render() -> str:
    stack = layers()
    level = {room: len(stack) - 1 - i for i, layer in enumerate(stack) for room in layer}
    uses = imports_between_rooms()
    rows = ["| layer | rooms | what they hold | imports from (layer) |", "|---|---|---|---|"]
    for i, layer in enumerate(stack):
        n = len(stack) - 1 - i
        rooms = " ".join(f"`{r}`" for r in layer)
        what = "; ".join(WHAT.get(r, "") for r in layer)
        used = sorted({u for r in layer for u in uses.get(r, ())}, key=lambda u: (-level.get(u, -1), u))
        arrows = ", ".join(f"{u} ({level[u]})" if u in level else f"{u} (?)" for u in used) or "-"
        rows.append(f"| {n} | {rooms} | {what} | {arrows} |")
    return "\n".join([START, *rows, END])


def updated(text: str) -> str:
    return re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: render(), text, flags=re.S)


if __name__ == "__main__":
    DOC.write_text(updated(DOC.read_text()))
