"""Feature fingerprint: a few dozen numbers per capture slot that describe the features a draft was trained on.

The residual stream's scale grows with depth and its mean direction drifts layer by layer, so matched against
every layer of a target these statistics point at a layer per slot. They also move with the text: over text unlike
the training text the demo draft's own target is one layer off at a slot (docs/performance.md#d40), so the doctor
reports the match as evidence and decides nothing on it (eaglekit.doctor.identity). Training records, per capture slot,
  rms     sqrt(mean f^2) over tokens and dims (the scale)
  mean    P @ mean_t(f)       a fixed random projection of the mean feature (SKETCH floats)
  second  mean_t((P f)^2)     the second moment along the same SKETCH directions
with P a seeded Gaussian [SKETCH, H] / sqrt(H): 1 + 2 x SKETCH = 33 floats a slot, in the draft's
`eaglekit.features` block. The doctor computes the same statistics for every target layer (-1 .. n-1) over
its probe text and reports the nearest layer to each slot.
"""

from __future__ import annotations

import math
from typing import Any

import torch

SKETCH = 16
SEED = 20261130
VERSION = 1


def projection(hidden: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(SEED)
    return torch.randn(SKETCH, hidden, generator=g, dtype=torch.float64) / math.sqrt(hidden)


class FeatureSketch:
    """Running sums (float64, on the CPU) of the statistics above, for `slots` slots of width `hidden`."""

    def __init__(self, slots: int, hidden: int):
        self.slots, self.hidden = slots, hidden
        self.P = projection(hidden)
        self.n = 0
        self.sq = torch.zeros(slots, dtype=torch.float64)
        self.s1 = torch.zeros(slots, SKETCH, dtype=torch.float64)
        self.s2 = torch.zeros(slots, SKETCH, dtype=torch.float64)

    @torch.no_grad()
    def add(self, feats: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        """feats [B, T, slots*hidden] (or [N, slots*hidden]); valid [B, T] marks real tokens."""
        f = feats[valid.bool()] if valid is not None else feats.reshape(-1, feats.shape[-1])
        f = f.detach().to("cpu", torch.float64).view(-1, self.slots, self.hidden)
        z = f @ self.P.T  # [N, slots, SKETCH]
        self.n += f.shape[0]
        self.sq += f.pow(2).mean(-1).sum(0)
        self.s1 += z.sum(0)
        self.s2 += z.pow(2).sum(0)

    def state(self) -> dict:
        return {"n": self.n, "sq": self.sq.clone(), "s1": self.s1.clone(), "s2": self.s2.clone()}

    def load_state(self, st: dict) -> None:
        self.n, self.sq, self.s1, self.s2 = int(st["n"]), st["sq"].clone(), st["s1"].clone(), st["s2"].clone()

    def slot(self, i: int) -> dict:
        n = max(self.n, 1)
        return {
            "rms": math.sqrt(float(self.sq[i]) / n),
            "mean": (self.s1[i] / n).tolist(),
            "second": (self.s2[i] / n).tolist(),
        }

    def to_json(self, layers: tuple[int, ...] | None = None) -> dict:
        """The block recorded in the draft: `layers` are the after_layers the slots were captured at."""

        def r(x):
            return float(f"{x:.5g}")

        out: dict[str, Any] = {"version": VERSION, "sketch": SKETCH, "seed": SEED, "tokens": self.n, "slots": []}
        for i in range(self.slots):
            s = self.slot(i)
            out["slots"].append(
                {"rms": r(s["rms"]), "mean": [r(x) for x in s["mean"]], "second": [r(x) for x in s["second"]]}
            )
        if layers is not None:
            out["after_layers"] = list(layers)
        return out


# the scale weighs RMS_WEIGHT times more than the sketches, which vary more with the text's token mix; it varies
# too: from the demo draft's training text to the doctor's probe texts the demo target's scale at a slot moves up
# to ~4%, where one layer moves it 0.5-15% (the scale term is most of each distance:
# docs/performance.md#d41)
RMS_WEIGHT = 20.0


def distance(a: dict, b: dict) -> float:
    """Scale (log ratio, weighted) + direction of the mean (1 - cosine) + second moments (mean |log ratio|)."""
    eps = 1e-12
    d = RMS_WEIGHT * abs(math.log((a["rms"] + eps) / (b["rms"] + eps)))
    ma, mb = torch.tensor(a["mean"]), torch.tensor(b["mean"])
    d += float(1 - torch.nn.functional.cosine_similarity(ma, mb, dim=0, eps=1e-12))
    sa, sb = torch.tensor(a["second"]), torch.tensor(b["second"])
    d += float(((sa + eps).log() - (sb + eps).log()).abs().mean())
    return d


def match(recorded: dict, layer_sketch: FeatureSketch, layer_ids: list[int]) -> list[dict]:
    """For each recorded slot: the nearest target layer, its distance, and the runner-up (the margin says how
    sure: a slot whose best and second distances are close is not named with confidence)."""
    layers = [layer_sketch.slot(j) for j in range(layer_sketch.slots)]
    out = []
    for i, s in enumerate(recorded["slots"]):
        d = sorted((distance(s, lay), lid) for lay, lid in zip(layers, layer_ids))
        (d0, l0), (d1, l1) = d[0], d[1] if len(d) > 1 else (float("inf"), None)
        out.append(
            {
                "slot": i,
                "layer": l0,
                "distance": round(d0, 4),
                "runner_up": l1,
                "runner_up_distance": round(d1, 4),
                "confident": d1 > 1.25 * d0 + 0.01,
            }
        )
    return out


def usable(recorded) -> bool:
    return (
        isinstance(recorded, dict)
        and recorded.get("version") == VERSION
        and recorded.get("sketch") == SKETCH
        and recorded.get("seed") == SEED
        and bool(recorded.get("slots"))
    )


@torch.no_grad()
def sketch_of(target, examples, capture, max_tokens: int = 200_000, batch_size: int = 8) -> FeatureSketch:
    """The fingerprint of `capture` over `examples` (train.data.Example), as training records it: for drafts
    trained before fingerprints existed, given text like their training data."""
    from .data import pad_batch

    sk = FeatureSketch(capture.num_captures, target.info.hidden_size)
    for i in range(0, len(examples), batch_size):
        if sk.n >= max_tokens:
            break
        ids, _, valid = pad_batch(examples[i : i + batch_size])
        _, feats = target.features(ids.to(target.device), valid.long().to(target.device), capture)
        sk.add(feats, valid.to(target.device))
    return sk


# --- the target's weights ------------------------------------------------------------------------------------
# The config fingerprint (models.config.config_fingerprint) names a target's shapes; two targets of one shape with
# other weights (a fine-tune, another revision, a perturbed copy) share it. This one reads a few fixed slices of
# every tensor straight from the safetensors files (get_slice: only those bytes), so it costs milliseconds even
# for a large target:
#   sha256    of the sliced values rounded to bfloat16 (a float32 and a bfloat16 copy of one target agree)
#   sample    WEIGHT_SAMPLE floats: each tensor's sliced values, over their RMS, projected on a seeded Gaussian
#             vector, summed into the bucket its name hashes to. A change of the weights by a relative amount e
#             moves the sample by about e relative (weights_distance), so a mismatch comes with a measured size.
WEIGHTS_VERSION = 1
WEIGHT_SAMPLE = 64
SLICE = 32  # values read from each of a tensor's first, middle and last rows


def _slices(sl) -> torch.Tensor:
    shape = sl.get_shape()
    if not shape:
        return torch.zeros(0)
    if len(shape) == 1:
        return sl[:SLICE].float().reshape(-1)
    rows = sorted({0, shape[0] // 2, shape[0] - 1})
    lead = (0,) * (len(shape) - 2)  # a 3-d or larger tensor: its first matrix
    parts = []
    for r in rows:
        idx = (slice(r, r + 1),) + tuple(slice(i, i + 1) for i in lead) + (slice(0, SLICE),)
        parts.append(sl[idx].float().reshape(-1))
    return torch.cat(parts)


def _weight_files(folder) -> list:
    from pathlib import Path

    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        import json

        return sorted({folder / f for f in json.loads(index.read_text()).get("weight_map", {}).values()})
    return sorted(folder.glob("*.safetensors"))


def weights_fingerprint(folder) -> dict | None:
    """The fingerprint of the target weights in `folder` (safetensors); None when it has none to read."""
    import hashlib
    import zlib

    from safetensors import safe_open

    from ..gguf import resolve_target

    files = _weight_files(resolve_target(folder))  # a .gguf: its materialized folder, the same weights' fingerprint
    if not files:
        return None
    h = hashlib.sha256()
    sample = torch.zeros(WEIGHT_SAMPLE, dtype=torch.float64)
    n = 0
    names: list[tuple[str, safe_open]] = []
    handles = [safe_open(str(f), "pt") for f in files]
    for f in handles:
        names += [(k, f) for k in f.keys()]  # noqa: SIM118 (a safetensors handle, not a dict)
    for name, f in sorted(names, key=lambda x: x[0]):
        sl = f.get_slice(name)
        if "int" in str(sl.get_dtype()).lower() or "bool" in str(sl.get_dtype()).lower():
            continue
        v = _slices(sl)
        h.update(name.encode() + str(tuple(sl.get_shape())).encode())
        h.update(v.to(torch.bfloat16).view(torch.int16).numpy().tobytes())
        seed = zlib.crc32(name.encode())
        g = torch.Generator().manual_seed(seed)
        # each tensor on its own scale (a norm's ones would outweigh a matrix's 0.02s): a relative change of any
        # tensor moves its term by about that much
        u = v.double() / v.double().pow(2).mean().sqrt().clamp(min=1e-30) if v.numel() else v.double()
        sample[seed % WEIGHT_SAMPLE] += float(torch.randn(v.numel(), generator=g, dtype=torch.float64) @ u)
        n += 1
    return {
        "version": WEIGHTS_VERSION,
        "sha256": h.hexdigest()[:16],
        "tensors": n,
        "sample": [float(f"{x:.6g}") for x in sample.tolist()],
    }


def weights_distance(recorded: dict, current: dict) -> float | None:
    """Relative distance of the two samples (0: the same weights at the sampled places); None: not comparable."""
    if (
        not (isinstance(recorded, dict) and isinstance(current, dict))
        or recorded.get("version") != WEIGHTS_VERSION
        or len(recorded.get("sample") or []) != len(current.get("sample") or [])
    ):
        return None
    a, b = torch.tensor(recorded["sample"], dtype=torch.float64), torch.tensor(current["sample"], dtype=torch.float64)
    return float((a - b).norm() / a.norm().clamp(min=1e-30))
