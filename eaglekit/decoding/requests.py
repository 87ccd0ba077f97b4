"""What goes into the engine and what comes out: a Request, its running state (Seq) and the Event a step returns
for it; a request's checks before it is queued (validate)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import EaglekitError, GenerationError
from .sampling import SamplingParams
from .stops import Emitter


@dataclass
class Request:
    rid: str
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()  # its `seed` seeds a generator of its own (else it shares the engine's)
    stop_strings: tuple[str, ...] = ()
    eos_ids: tuple[int, ...] | None = None  # None: the target's own


@dataclass
class Event:
    rid: str
    token_ids: list[int]  # emitted for this request in this step (after stop / EOS / max handling)
    finished: bool
    stop_reason: str | None  # "stop" (EOS or stop string), "length", "cancelled"; None while running
    accepted: int | None  # draft tokens accepted in this request's verify this step (None: no draft used)
    drafted: int | None  # draft tokens proposed to this request this step (None: no draft used)
    error: str | None = None  # stop_reason "error": this request's own per-row work failed; it alone was ended


# Emitter.reason -> Event.stop_reason
REASON: dict[str | None, str] = {"eos": "stop", "stop_string": "stop", "length": "length"}


def seeded(sp: SamplingParams) -> bool:
    """A sampled request with a seed: its output must be the same whatever shares the batch or ran before it."""
    return sp.seed is not None and not sp.greedy


class Seq:
    """A running request on the host: its emitter, generator, committed length and whether it drafts."""

    __slots__ = ("req", "em", "gen", "length", "use_draft", "new", "accepted", "drafted", "lag", "trail", "exc")

    def __init__(self, req: Request, em: Emitter, gen):
        self.req, self.em, self.gen = req, em, gen
        self.length = 0  # committed target (== draft) entries, host copy
        self.use_draft = False
        self.new: list[int] = []  # tokens emitted this step
        self.accepted: int | None = None  # (this step's, as Event's)
        self.drafted: int | None = None
        self.lag = 0  # plain tokens the draft has not seen yet (in the engine's catch-up window)
        self.trail: list[tuple[int, int]] | None = None  # set to a list: each cycle's (accepted, tree depth) kept
        self.exc: BaseException | None = None  # where this row's own work failed (BatchEngine._guard): it ends alone

    @property
    def ended(self) -> bool:
        return self.em.done or self.exc is not None

    @property
    def error(self) -> str | None:
        """The failure that ended this row, as its event reports it (a coded error keeps its code)."""
        if self.exc is None:
            return None
        return (
            str(self.exc).split("\n")[0]
            if isinstance(self.exc, EaglekitError)
            else f"[E311] {type(self.exc).__name__}: {self.exc}"
        )

    def raise_failure(self) -> None:
        """Raise the failure that ended this row, for a caller that waits for the row to its end (Decoder.generate,
        regeneration): a coded error as it is, anything else as E311 chained to it. Nothing where the row did not
        fail."""
        if self.exc is None:
            return
        if isinstance(self.exc, EaglekitError):
            raise self.exc
        raise GenerationError(
            f"the request failed in the engine step: {type(self.exc).__name__}: {self.exc}",
            fix="read the exception named; report it with the request's parameters if they were valid",
            code="E311",
        ) from self.exc

    def event(self) -> Event:
        """This step's event (its tokens, why it finished), and the step's fields cleared for the next."""
        if self.exc is not None:  # nothing of the failed step is emitted: what was sent before stands
            return Event(self.req.rid, [], True, "error", None, None, self.error)
        fin = self.em.done
        ev = Event(
            self.req.rid, self.new, fin, REASON.get(self.em.reason) if fin else None, self.accepted, self.drafted
        )
        self.new, self.accepted, self.drafted = [], None, None
        return ev


def validate(req: Request, info, tokenizer) -> None:
    """Refuse a request the engine cannot run (`info`: the target's ModelInfo), each with its fix."""
    ids = req.prompt_ids
    if not isinstance(req.max_new_tokens, int) or isinstance(req.max_new_tokens, bool) or req.max_new_tokens < 1:
        raise GenerationError(
            f"max_new_tokens must be an integer >= 1, got {req.max_new_tokens!r}",
            fix="ask for at least one new token",
            code="E301",
        )
    if not isinstance(req.sampling, SamplingParams):
        raise GenerationError("sampling must be a SamplingParams", fix="build it with SamplingParams(...)", code="E302")
    if len(ids) == 0:
        raise GenerationError("the prompt is empty", fix="give at least one token", code="E305")
    V = info.vocab_size
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < V for i in ids):
        raise GenerationError(
            f"prompt token ids must be integers in 0..{V - 1}", fix="tokenize with the target's tokenizer", code="E305"
        )
    ctx = info.max_position_embeddings
    if len(ids) + req.max_new_tokens > ctx:
        raise GenerationError(
            f"the prompt ({len(ids)} tokens) plus max_new_tokens ({req.max_new_tokens}) exceeds the target's "
            f"context of {ctx} positions",
            # a prompt of the whole context leaves room for no token: only a shorter prompt helps then
            fix=(
                f"lower max_new_tokens to {ctx - len(ids)}, or shorten the prompt"
                if len(ids) < ctx
                else f"shorten the prompt by at least {len(ids) - ctx + 1} tokens"
            ),
            code="E301",
        )
    if any(s for s in req.stop_strings) and tokenizer is None:
        raise GenerationError(
            "stop strings need a tokenizer to decode the output",
            fix="give the engine the target folder's tokenizer, or use token ids",
            code="E304",
        )
