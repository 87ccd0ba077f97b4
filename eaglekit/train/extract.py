"""Offline feature extraction: safetensors shards + a JSON manifest, resumable and verified.

Each shard holds, for up to `shard_size` sequences (right-padded to the shard's longest):
input_ids [n, T] int32, loss_mask [n, T] uint8, lengths [n] int32, features [n, T, C*H] (the aux
captures) and target_hidden [n, T, H] (the final normed hidden; target logits = lm_head(target_hidden)).
That is (C + 1) x H values per token: 4 x H for the usual three captures.

The manifest records the target fingerprint, the CaptureSpec, dtype, sequence and token counts and
each shard's sha256; it is rewritten atomically after every shard, so a killed extraction resumes at
the first shard the manifest lacks. Shards are verified against their sha256 when read.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch

from .. import __version__
from ..capture import CaptureSpec
from ..errors import ContractError, InputError
from ..io import atomic_write_json, save_tensors, sha256_file
from .data import Example, pad_batch
from .ttt import TargetBatch

_DT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def data_hash(examples: list[Example]) -> str:
    h = hashlib.sha256()
    for e in examples:
        h.update(json.dumps([e.input_ids, e.loss_mask]).encode())
    return h.hexdigest()[:16]


def bytes_needed(examples: list[Example], hidden: int, captures: int, dtype: str) -> int:
    per = torch.tensor([], dtype=_DT[dtype]).element_size()
    return sum(len(e) for e in examples) * ((captures + 1) * hidden * per + 5)


def extract(
    target,
    examples: list[Example],
    out: str | Path,
    capture: CaptureSpec,
    shard_size: int = 256,
    batch_size: int = 8,
    dtype: str = "bfloat16",
    pad_id: int = 0,
    log=print,
    progress: bool = True,
) -> dict:
    from .trainer import crash_hook

    if capture is None:
        raise ContractError(
            "extraction needs a CaptureSpec",
            code="E209",
            fix="pass the spec the draft will be trained on (CaptureSpec.default(n) if unsure)",
        )
    if dtype not in _DT:
        raise InputError(f"unknown feature dtype {dtype!r}", fix=f"use one of {', '.join(_DT)}", code="E108")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    info = target.info
    spec = capture.validate(target.info.num_layers)
    header = _header(info, examples, spec, dtype, shard_size)
    n_shards = header["num_shards"]
    mpath = out / "manifest.json"
    shards = _shards_done(out, mpath, header)
    need = bytes_needed(examples[len(shards) * shard_size :], info.hidden_size, spec.num_captures, dtype)
    _check_space(out, need, header, len(shards), log)
    from .vocab import count_tokens

    # loss-masked token counts: the draft vocabulary is chosen from them without reading the shards again
    save_tensors(out / "token_counts.safetensors", {"counts": count_tokens(examples, info.vocab_size)})
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n_shards, initial=len(shards), desc="extract", unit="shard")
    for s in range(len(shards), n_shards):
        part = examples[s * shard_size : (s + 1) * shard_size]
        name = f"shard-{s:05d}.safetensors"
        tensors = _shard_tensors(target, part, spec, _DT[dtype], batch_size, pad_id)
        sha = save_tensors(out / name, tensors, metadata={"capture": json.dumps(spec.to_dict())})
        shards.append({"file": name, "sha256": sha, "sequences": len(part), "tokens": sum(len(e) for e in part)})
        atomic_write_json(mpath, {**header, "shards": shards, "complete": len(shards) == n_shards})
        if bar is not None:
            bar.update(1)
        crash_hook("extract_shard", s + 1)
    if bar is not None:
        bar.close()
    if not mpath.is_file():  # empty input
        atomic_write_json(mpath, {**header, "shards": shards, "complete": True})
    return json.loads(mpath.read_text())


def _header(info, examples: list[Example], spec: CaptureSpec, dtype: str, shard_size: int) -> dict:
    """The manifest but its `shards` and `complete`: every key but eaglekit_version must match for a run to resume."""
    return {
        "eaglekit_version": __version__,
        "target": {
            "fingerprint": info.fingerprint,
            "family": info.family,
            "hidden_size": info.hidden_size,
            "num_layers": info.num_layers,
            "vocab_size": info.vocab_size,
        },
        "capture": spec.to_dict(),
        "dtype": dtype,
        "shard_size": shard_size,
        "data_hash": data_hash(examples),
        "sequences": len(examples),
        "tokens": sum(len(e) for e in examples),
        "loss_tokens": sum(sum(e.loss_mask) for e in examples),
        "num_shards": (len(examples) + shard_size - 1) // shard_size,
    }


def _shards_done(out: Path, mpath: Path, header: dict) -> list[dict]:
    """The shards an earlier run of the same extraction left in `out` (its manifest lists them and their file is
    there); refuses a folder that holds an extraction with other settings."""
    if not mpath.is_file():
        return []
    old = json.loads(mpath.read_text())
    differs = [k for k in header if k != "eaglekit_version" and old.get(k) != header[k]]
    if differs:
        raise InputError(
            f"{out} holds an extraction with other settings ({', '.join(differs)} differ)",
            fix="use a new --out folder, or delete the old one",
            code="E121",
        )
    return [s for s in old.get("shards", []) if (out / s["file"]).is_file()]


def _check_space(out: Path, need: int, header: dict, done: int, log) -> None:
    """Logs the plan and refuses to start where the shards still to write (`need` bytes) do not fit on the disk."""
    free = shutil.disk_usage(out).free
    log(
        f"extract: {header['sequences']} sequences, {header['tokens']} tokens, {header['num_shards']} shards; "
        f"{done} already done; needs {need / 1e9:.2f} GB, {free / 1e9:.1f} GB free"
    )
    if need > free:
        raise InputError(
            f"extraction needs {need / 1e9:.2f} GB but {out} has {free / 1e9:.2f} GB free",
            fix="free disk space, or train online (eaglekit train --target ... --data ...)",
            code="E122",
        )


def _shard_tensors(
    target, part: list[Example], spec: CaptureSpec, dtype: torch.dtype, batch_size: int, pad_id: int
) -> dict[str, torch.Tensor]:
    """One shard's tensors (the module's docstring lists them): `part` right-padded to its longest, run through the
    target `batch_size` sequences at a time."""
    ids, mask, valid = pad_batch(part, pad_id)
    feats, hidden = [], []
    for i in range(0, len(part), batch_size):
        b_ids = ids[i : i + batch_size].to(target.device)
        b_valid = valid[i : i + batch_size].to(target.device)
        with torch.no_grad():
            h, f = target.features(b_ids, b_valid.long(), spec)
        feats.append(f.to(dtype).cpu())
        hidden.append(h.to(dtype).cpu())
    return {
        "input_ids": ids.to(torch.int32),
        "loss_mask": mask.to(torch.uint8),
        "lengths": valid.sum(1).to(torch.int32),
        "features": torch.cat(feats),
        "target_hidden": torch.cat(hidden),
    }


class FeatureStore:
    """Reads an extraction folder; refuses one made for another target or capture."""

    def __init__(self, folder: str | Path, target_info=None, capture: CaptureSpec | None = None):
        self.folder = Path(folder)
        mpath = self.folder / "manifest.json"
        if not mpath.is_file():
            raise InputError(f"{self.folder} has no manifest.json", fix="run eaglekit extract first", code="E101")
        self.manifest = json.loads(mpath.read_text())
        if not self.manifest.get("complete"):
            done = len(self.manifest.get("shards", []))
            raise InputError(
                f"the extraction in {self.folder} is incomplete ({done} of {self.manifest['num_shards']} shards)",
                fix="rerun eaglekit extract: it resumes",
                code="E123",
            )
        self.capture = CaptureSpec.from_dict(self.manifest["capture"])
        if capture is not None and capture != self.capture:
            raise ContractError(
                f"features in {self.folder} were captured at {self.capture.describe()}, the draft "
                f"expects {capture.describe()}",
                fix="extract again with the draft's capture",
                code="E209",
            )
        if target_info is not None and target_info.fingerprint != self.manifest["target"]["fingerprint"]:
            raise ContractError(
                f"features in {self.folder} come from a target with fingerprint "
                f"{self.manifest['target']['fingerprint']}, not {target_info.fingerprint}",
                fix="extract with the target you train for",
                code="E208",
            )
        self.shards = self.manifest["shards"]
        self.offsets = [0]
        for s in self.shards:
            self.offsets.append(self.offsets[-1] + s["sequences"])
        self.n = self.offsets[-1]
        self._cached: tuple[int, dict] | None = None

    def _shard(self, k: int) -> dict:
        if self._cached is None or self._cached[0] != k:
            from safetensors.torch import load_file

            s = self.shards[k]
            path = self.folder / s["file"]
            if sha256_file(path) != s["sha256"]:
                raise InputError(
                    f"feature shard {path} does not match its sha256 in the manifest (corrupt or changed)",
                    fix="delete the shard and its manifest entry, then rerun extract",
                    code="E124",
                )
            self._cached = (k, load_file(str(path)))
        return self._cached[1]

    def token_counts(self) -> torch.Tensor:
        from safetensors.torch import load_file

        return load_file(str(self.folder / "token_counts.safetensors"))["counts"]

    def epoch_order(self, g: torch.Generator) -> list[int]:
        """Shards in random order, rows shuffled within each: every shard is read once per epoch."""
        out = []
        for k in torch.randperm(len(self.shards), generator=g).tolist():
            rows = torch.randperm(self.shards[k]["sequences"], generator=g)
            out += (rows + self.offsets[k]).tolist()
        return out

    def batch(self, indices, device) -> TargetBatch:
        import bisect

        parts = []
        for i in indices:
            k = bisect.bisect_right(self.offsets, i) - 1
            sh = self._shard(k)
            r = i - self.offsets[k]
            n = int(sh["lengths"][r])
            parts.append(
                (sh["input_ids"][r, :n], sh["loss_mask"][r, :n], sh["features"][r, :n], sh["target_hidden"][r, :n])
            )
        T = max(p[0].numel() for p in parts)
        B = len(parts)
        ids = torch.zeros(B, T, dtype=torch.long)
        mask = torch.zeros(B, T, dtype=torch.long)
        valid = torch.zeros(B, T, dtype=torch.bool)
        feats = torch.zeros(B, T, parts[0][2].shape[-1], dtype=parts[0][2].dtype)
        hid = torch.zeros(B, T, parts[0][3].shape[-1], dtype=parts[0][3].dtype)
        for j, (a, m, f, h) in enumerate(parts):
            n = a.numel()
            ids[j, :n], mask[j, :n], valid[j, :n], feats[j, :n], hid[j, :n] = a.long(), m.long(), True, f, h
        return TargetBatch(
            feats=feats.to(device),
            ids=ids.to(device),
            loss_mask=mask.to(device),
            valid=valid.to(device),
            target_hidden=hid.to(device),
        )
