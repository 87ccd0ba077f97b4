"""How a batch engine runs, as one object (BatchEngine's options): the tree, the batch sizes, the wiring it checks,
the policy, the recording, the profile. Callers build it once (serve from its flags, the Decoder per tree shape,
benchmarks per case) and hand it whole; the engine reads nothing else."""

from __future__ import annotations

from dataclasses import dataclass

from ..capture import CaptureSpec
from ..errors import GenerationError
from .tree import TreeShape


@dataclass(frozen=True)
class EngineOptions:
    shape: TreeShape | None = None  # the draft tree (None: TreeShape.make()'s default); shallower ones come with it
    max_batch: int = 8  # rows decoded together: the KV caches hold this many
    spec_max_batch: int | None = None  # above this many running rows, plain steps (None: max_batch; 0: never draft)
    capture: CaptureSpec | None = None  # the wiring to run instead of the draft's own (checked: draft.check_pair)
    allow_other_target: bool = False  # run a draft whose recorded target fingerprint differs (check_pair)
    pair_checked: bool = False  # the caller checked the pair and `capture` is what to run (decoding.decoder.Decoder)
    graphs: bool | str = "auto"  # CUDA graphs: auto = on a GPU with a static-cache target
    adaptive: bool = True  # the speculation policy chooses tree, shallower tree or plain step per step
    synthetic_accept_length: float | None = None  # benchmark mode: accept at this rate whatever the target says
    profile: bool = False  # time each phase of the steps (EngineStats)
    profile_ranges: bool = False  # ... and mark them as NVTX ranges
    plain_rows: int = 1  # rows of a plain step (the verify's rounding the baseline shares: Decoder's baseline rows)
    strict_features: bool = False  # a prompt whose features are not finite raises E401 (else its row drops the draft)
    # Rows admitted in one step without their draft prefill together, right-padded, in forwards of at most this many
    # tokens (0: one forward a prompt). A row's bits then depend on the rows beside it (the products' row count, the
    # attention's key count), so it is for regeneration, where nothing is compared with a one-row decode; one forward
    # a prompt is what a GPU's regeneration spent most of its time on (docs/performance.md#d61)
    prefill_tokens: int = 0
    # the generator that the sampled requests without a seed of their own share (None: seeded by torch): their draws
    # come from it in one call for all rows with the same sampling parameters
    seed: int | None = None

    def __post_init__(self):
        mb = self.max_batch
        if isinstance(mb, bool) or not isinstance(mb, int) or mb < 1:
            raise GenerationError(
                f"max_batch must be an integer >= 1, got {mb!r}", fix="e.g. --max-batch 8", code="E307"
            )
        pr = self.plain_rows
        if isinstance(pr, bool) or not isinstance(pr, int) or pr < 1:
            raise GenerationError(
                f"plain rows must be an integer >= 1, got {pr!r}",
                fix="pass plain_rows=1 (the default), or the rows of the verify whose rounding the "
                "plain step should share (decoding.decoder.resolve_baseline_rows)",
                code="E300",
            )

        pt = self.prefill_tokens
        if isinstance(pt, bool) or not isinstance(pt, int) or pt < 0:
            raise GenerationError(
                f"prefill_tokens must be an integer >= 0, got {pt!r}",
                fix="pass 0 (one forward a prompt, the default) or the most tokens a batched prefill may hold",
                code="E300",
            )

    @property
    def tree(self) -> TreeShape:
        return self.shape or TreeShape.make()
