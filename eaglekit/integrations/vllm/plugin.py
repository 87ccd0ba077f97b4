"""eaglekit inside vLLM: EAGLE3_DEBUG tracing at the capture points of the hidden-state contract.

Installed through vLLM's plugin entry point (`vllm.general_plugins`, see pyproject.toml), so vLLM calls
`register()` in every process it starts (front end, engine core, workers). Without EAGLE3_DEBUG it
returns at once: nothing is imported, nothing is patched. With EAGLE3_DEBUG=1 it wraps, on the classes:

    target  vllm.model_executor.models.llama.LlamaModel.forward: the aux hidden states it returns
            (residual streams entering the layers in `aux_hidden_state_layers`) -> `target.capture`
    draft   Eagle3LlamaForCausalLM.combine_hidden_states: the [T, C*H_t] features and the fc output
            -> `draft.input.features`, `draft.input.fc`; the draft LlamaModel.forward -> the
            `draft.input.embedding` / `draft.input.hidden` of each draft step; the first draft layer
            -> `draft.concat` (the 2H-wide [input_layernorm(embedding), hidden_norm(hidden)])
    config  what vLLM resolved, once per process (point `engine.config`, no tensor): the aux layer ids
            (vLLM's "input of layer" ids and the same as eaglekit after_layers), whether they came from
            the draft's config or vLLM's default, the fc width, the draft vocabulary and its d2t.

The records are eaglekit's (eaglekit.observe.trace.record: same point names, same fields, JSON lines in
EAGLE3_DEBUG_FILE), plus `engine: "vllm"` and, on `target.capture`, the per-layer statistics.
`cycle` counts the target forwards of real requests in this process (0 = the prefill); vLLM's start-up
dummy runs are not traced. Trace one request at a time, in eager mode (enforce_eager=True): under
torch.compile the wrappers record nothing, since reading statistics would break the graph.

Facts from vLLM 0.32.0's code that the wrappers rely on: the target collects `hidden + residual` at
layer index i in `aux_hidden_state_layers` before layer i runs (so id i = input of layer i = eaglekit
after_layers i - 1; 0 is the embedding), stores the ids sorted and de-duplicated, and the model runner
concatenates them in that order along the last dimension before `combine_hidden_states`.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, TypedDict

ENGINE = "vllm"
_done = False


class _State(TypedDict):
    cycle: int  # the cycle the draft work belongs to (the last target forward's)
    next: int  # the cycle the next target forward opens
    dummy: int  # nesting depth of dummy runs (tracing is off while > 0)
    from_target: bool  # the next draft forward starts from the target's projected features
    layers: list[int] | None  # the after_layers the target collects at, once vLLM resolved them
    config: dict[str, Any]  # what vLLM resolved, as the engine.config records give it


_state: _State = {"cycle": 0, "next": 0, "dummy": 0, "from_target": False, "layers": None, "config": {}}


def _on() -> bool:
    return os.environ.get("EAGLE3_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")


def register() -> None:
    """vLLM's entry point. Idempotent: vLLM may call it more than once in a process."""
    global _done
    if _done or not _on():
        return
    _done = True
    _patch_runner()
    _patch_target()
    _patch_draft()


# --- helpers ------------------------------------------------------------------------------------------
def _tracing() -> bool:
    import torch

    from ...observe import trace

    if _state["dummy"] or torch.compiler.is_compiling():
        return False
    trace.set_cycle(_state["cycle"])
    return trace.active()


def _record(point, tensor, **meta):
    from ...observe import trace

    return trace.record(point, tensor, engine=ENGINE, **meta)


def _config(**fields) -> None:
    """One `engine.config` record (no tensor) per call: what vLLM resolved, written even when
    EAGLE3_DEBUG_STEPS=0 (the live doctor reads these alone)."""
    from ...observe import trace

    _state["config"].update(fields)
    rec = {"cycle": -1, "point": "engine.config", "engine": ENGINE, "pid": os.getpid(), **fields}
    if trace.FILE:
        with open(trace.FILE, "a") as f:
            f.write(json.dumps(rec) + "\n")
    if trace._sink is not None:
        trace._sink.append(rec)
    print(
        f"[EAGLE3_DEBUG] {ENGINE} engine.config " + " ".join(f"{k}={v}" for k, v in fields.items()), file=trace._stream
    )


def vllm_member(obj, name: str, default=None):
    """A member of a vLLM object (a class, a model or its config, a metric), or `default` where this release or this
    architecture has none: vLLM adds, renames and drops them between releases, and the plugin runs inside whichever
    one is installed. The plugin's one question of that kind."""
    return getattr(obj, name, default)


_WRAPPED: set = set()  # the functions _wrap installed: wrapping one again would trace its calls twice


def _wrap(cls, name, make, optional: bool = False):
    """cls.name through make(cls.name), once. `optional`: a member this vLLM release may lack (then left alone)."""
    fn = vllm_member(cls, name) if optional else getattr(cls, name)
    if fn is None or fn in _WRAPPED:
        return
    new = functools.wraps(fn)(make(fn))
    _WRAPPED.add(new)
    setattr(cls, name, new)


def _quiet(fn):
    """Run `fn` with tracing suppressed (vLLM's profiling / warm-up forwards on dummy inputs)."""

    def run(*a, **k):
        _state["dummy"] += 1
        try:
            return fn(*a, **k)
        finally:
            _state["dummy"] -= 1

    return run


# --- the model runner: dummy runs and the aux layer ids it resolves ---------------------------------
def _patch_runner() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    for name in ("_dummy_run", "profile_run", "_dummy_sampler_run"):
        _wrap(GPUModelRunner, name, _quiet, optional=True)
    try:
        from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer as P
    except ImportError:  # the class name differs between vLLM versions: patch whatever defines dummy_run
        P = None
    if P is not None:
        _wrap(P, "dummy_run", _quiet, optional=True)

    def from_config(fn):
        def run(self, *a, **k):
            ids = fn(self, *a, **k)
            _state["config"]["ids_from_config"] = list(ids) if ids else None
            return ids

        return run

    _wrap(GPUModelRunner, "_get_eagle3_aux_layers_from_config", from_config, optional=True)

    from vllm.model_executor.models.interfaces import EagleModelMixin

    def set_layers(fn):
        def run(self, layers, *a, **k):
            out = fn(self, layers, *a, **k)
            resolved = list(self.aux_hidden_state_layers)
            _state["layers"] = [i - 1 for i in resolved]
            given = _state["config"].get("ids_from_config")
            _config(
                aux_layer_ids=list(layers),
                aux_layer_ids_resolved=resolved,
                after_layers=_state["layers"],
                ids_source="draft config" if given else "vLLM default (the draft's config gives no ids)",
                num_layers=len(vllm_member(self, "layers", []) or []),
            )
            return out

        return run

    _wrap(EagleModelMixin, "_set_aux_hidden_state_layers", set_layers)


# --- the target: aux hidden state collection ---------------------------------------------------------
def _patch_target() -> None:
    from vllm.model_executor.models.llama import LlamaModel

    def forward(fn):
        def run(self, *a, **k):
            out = fn(self, *a, **k)
            if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], list) and out[1]:
                if not _state["dummy"]:
                    # one target forward opens a cycle (0 = the prefill); the draft work after it belongs to it
                    _state["cycle"] = _state["next"]
                    _state["next"] += 1
                if _tracing():
                    _trace_capture(self, out[1])
            return out

        return run

    _wrap(LlamaModel, "forward", forward)


def _trace_capture(model, aux: list) -> None:
    import torch

    from ...observe import trace

    feats = torch.cat(aux, dim=-1)
    layers = [i - 1 for i in getattr(model, "aux_hidden_state_layers", ())] or _state["layers"]
    assert layers is not None  # aux is collected only at layers set by _set_aux_hidden_state_layers, which records them
    per_layer = []
    for i, h in zip(layers, aux):
        s = trace.stats(h)
        per_layer.append({"after_layer": i, **{k: s[k] for k in ("mean", "std", "absmax", "nan", "inf", "head")}})
    _record("target.capture", feats, layers=layers, hidden=aux[0].shape[-1], tokens=feats.shape[0], per_layer=per_layer)


# --- the draft: fc input / output, each step's inputs, the concatenation -----------------------------
def _patch_draft() -> None:
    from vllm.model_executor.models import llama_eagle3 as m

    def combine(fn):
        def run(self, hidden_states, *a, **k):
            on = _tracing()
            if on:
                _record("draft.input.features", hidden_states, layers=_state["layers"])
            out = fn(self, hidden_states, *a, **k)
            if on and out is not hidden_states:
                _record("draft.input.fc", out)
            _state["from_target"] = True  # the next draft forward starts from these projected features
            return out

        return run

    _wrap(m.Eagle3LlamaForCausalLM, "combine_hidden_states", combine)

    def load(fn):
        def run(self, *a, **k):
            out = fn(self, *a, **k)
            _draft_config(self)
            return out

        return run

    _wrap(m.Eagle3LlamaForCausalLM, "load_weights", load)

    def model_forward(fn):
        def run(self, input_ids, positions, hidden_states, input_embeds=None, *a, **k):
            if _tracing():
                if not _state["from_target"]:
                    _record("draft.input.hidden", hidden_states)
                emb = input_embeds if input_embeds is not None else self.embed_input_ids(input_ids)
                _record("draft.input.embedding", emb)
            _state["from_target"] = False
            return fn(self, input_ids, positions, hidden_states, input_embeds, *a, **k)

        return run

    _wrap(m.LlamaModel, "forward", model_forward)

    def layer_forward(fn):
        def run(self, positions, embeds, hidden_states, residual, *a, **k):
            if self.layer_idx == 0 and _tracing():
                import torch

                # recomputed from the layer's own norms (pure functions) rather than read from inside it
                h, _ = self._residual_norm(hidden_states=hidden_states)
                x = torch.cat([self.input_layernorm(embeds), h], dim=-1)
                _record("draft.concat", x, width=x.shape[-1])
            return fn(self, positions, embeds, hidden_states, residual, *a, **k)

        return run

    _wrap(m.LlamaDecoderLayer, "forward", layer_forward)


def _draft_config(model) -> None:
    c, inner = model.config, model.model
    d2t = vllm_member(model, "draft_id_to_target_id")
    fields = {
        "fc_in": vllm_member(inner, "fc_input_size"),
        "fc_out": c.hidden_size,
        "num_aux_hidden_states": vllm_member(inner, "num_aux_hidden_states"),
        "target_hidden_size": vllm_member(c, "target_hidden_size", c.hidden_size),
        "draft_vocab_size": c.draft_vocab_size,
        "vocab_size": c.vocab_size,
        "norm_before_fc": bool(vllm_member(inner, "norm_before_fc", False)),
        "fc_norm": vllm_member(inner, "fc_norm") is not None,
        "norm_before_residual": bool(vllm_member(c, "norm_before_residual", False)),
        "d2t": None,
    }
    if d2t is not None:
        import torch

        from ...draft.checkpoint import vocab_map_sha

        v = d2t.detach().cpu().long()
        # the hash eaglekit records in a draft's config (vocab_map_sha256): equal hashes, equal mappings
        fields["d2t"] = {
            "nonzero": int((v != 0).sum()),
            "max_target_id": int((v + torch.arange(v.numel())).max()),
            "sha256": vocab_map_sha(v),
        }
    _config(**fields)
