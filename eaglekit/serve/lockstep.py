"""`eaglekit serve --tp N`: one HTTP server, N ranks decoding in lockstep.

Rank 0 runs the HTTP server and the scheduler over a `Lockstep` wrapper of its BatchEngine; ranks > 0 run
`follow`, no HTTP. Every engine call that changes state (add, cancel, step) happens on every rank in the same
order: rank 0 applies add and cancel at once (so its checks raise to the client as usual) and queues them;
each step sends the queued operations to the other ranks, which apply them and step too. The engines then
hold the same rows and run the same collectives (the target's all-reduces), and greedy tokens agree because
every rank sees the same all-reduced residual stream and gathered logits. A sampled request without a seed
gets one drawn on rank 0, so every rank's generator draws the same tokens.

The operations travel over a separate gloo group with a long timeout: an idle server sends nothing, and its
followers must wait for the next request without tripping the decoding collectives' short timeout. A rank
that dies ends the launch (torchrun or `--tp N` tears the others down); SIGTERM reaches rank 0 (the `--tp N`
launcher forwards it), which drains and then stops the followers.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import random

import torch

log = logging.getLogger("eaglekit.serve")

# how long a follower may wait for the next step of an idle server
IDLE_TIMEOUT = datetime.timedelta(days=365)


class Lockstep:
    """An Engine (eaglekit.decoding.protocols) around a BatchEngine: reads pass through, and its state changes reach
    every rank."""

    def __init__(self, engine):
        import torch.distributed as dist

        self._engine = engine
        self._pending: list[tuple[str, object]] = []
        # collective: every rank creates it, in the same order as the other groups
        self._ctl = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def add(self, req) -> None:
        sp = req.sampling
        if not sp.greedy and sp.seed is None:
            req = dataclasses.replace(req, sampling=dataclasses.replace(sp, seed=random.randrange(2**62)))
        self._engine.add(req)  # raises on a bad request: nothing is sent
        self._pending.append(("add", req))

    def cancel(self, rid: str) -> None:
        self._engine.cancel(rid)
        self._pending.append(("cancel", rid))

    def step(self):
        ops, self._pending = self._pending, []
        send(self._ctl, ("step", ops))
        return self._engine.step()

    def close(self) -> None:
        """Tell the followers to stop (after the server has drained)."""
        send(self._ctl, ("stop", self._pending))
        self._pending = []


def send(ctl, msg) -> None:
    import torch.distributed as dist

    dist.broadcast_object_list([msg], src=0, group=ctl)


def receive(ctl):
    import torch.distributed as dist

    box = [None]
    dist.broadcast_object_list(box, src=0, group=ctl)
    return box[0]


def follow(lockstep: Lockstep) -> int:
    """A rank > 0: apply rank 0's operations and step, until it says stop. A failure in a step is what
    rank 0 sees too (same rows, same code): it cancels those requests, and the cancels arrive here."""
    import signal

    # a launcher (torchrun) may signal every rank: the followers wait for rank 0's stop after its drain
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    eng, ctl = lockstep._engine, lockstep._ctl
    with torch.inference_mode():  # the engine's tensors are inference tensors, updated in place by add/cancel
        while True:
            kind, ops = receive(ctl)
            for op, arg in ops:
                try:
                    eng.add(arg) if op == "add" else eng.cancel(arg)
                except Exception:  # noqa: BLE001 - rank 0 applied it first and went on; so do we
                    log.exception("follower: engine.%s failed", op)
            if kind == "stop":
                return 0
            try:
                eng.step()
            except Exception:  # noqa: BLE001 - as the scheduler on rank 0: the requests are cancelled next
                log.exception("follower: engine.step failed")
