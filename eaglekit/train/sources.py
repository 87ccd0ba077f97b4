"""Where training batches come from.

OnlineSource computes the target's features for each batch on the fly (nothing written to disk: the
choice when the target fits beside the draft). FeatureStore (extract.py) reads offline shards.
Both hand the trainer a TargetBatch and an epoch order of sample indices.
"""

from __future__ import annotations

import torch

from .data import Example, pad_batch
from .ttt import TargetBatch


class OnlineSource:
    def __init__(self, target, examples: list[Example], capture, pad_id: int = 0):
        if capture is None:
            from ..errors import ContractError

            raise ContractError(
                "online training needs a CaptureSpec",
                code="E209",
                fix="pass the spec the draft is trained on (CaptureSpec.default(n) if unsure)",
            )
        self.target, self.capture = target, capture
        self.examples = examples
        self.pad_id = pad_id
        self.n = len(examples)

    def epoch_order(self, g: torch.Generator) -> list[int]:
        return torch.randperm(self.n, generator=g).tolist()

    def batch(self, indices, device) -> TargetBatch:
        ids, mask, valid = pad_batch([self.examples[i] for i in indices], self.pad_id)
        ids, mask, valid = ids.to(device), mask.to(device), valid.to(device)
        with torch.no_grad():
            hidden, feats = self.target.features(ids, valid.long(), self.capture)
        return TargetBatch(feats=feats, ids=ids, loss_mask=mask, valid=valid, target_hidden=hidden)
