"""Tensor parallelism plumbing: the process group, its collectives (with timeouts and readable errors),
sharding arithmetic, and the `--tp N` launcher.

One group per process (module state `_TP`, set by `init_tp`). Ranks come from the torchrun environment
(WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR/PORT). NCCL on GPUs, gloo on CPUs. On a GPU the all-reduce of
the row-parallel layers can go through torch's symmetric memory (`one_shot_all_reduce`: each rank reads the
peers' buffers over NVLink, ~15 us for 8 KiB on the H200 pair against 44-55 us for NCCL) with NCCL as the
fallback (messages larger than the buffer, fp16, or allreduce="nccl"). NVLink multicast stays off: the two
variables in ENV_DEFAULTS are set before the group is created unless the user set them.

A collective that fails (a peer died, or no answer within `timeout_s`) raises DistributedError on the
surviving ranks; inside CUDA graphs NCCL's watchdog aborts the process after the same timeout.
"""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .errors import EaglekitError, InputError

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

ENV_DEFAULTS = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0"}
ALLREDUCE = ("auto", "nccl", "symm")
LM_HEAD = ("auto", "vocab", "replicated")
TP_COMMANDS = ("generate", "eval", "doctor")
# on a CPU the lm_head is sharded by vocabulary only when it is this large: below, reading the whole of it
# costs less than one gloo all-gather of the logits (a round trip through the loopback, ~0.1-1 ms)
CPU_VOCAB_PARALLEL_BYTES = 64 * 2**20


class DistributedError(EaglekitError):
    """A rank died, a collective timed out, or the ranks were launched inconsistently."""

    code = "E140"


@dataclass
class TPGroup:
    world: int
    rank: int
    device: torch.device
    backend: str
    timeout_s: float
    allreduce: str = "gloo"  # gloo | nccl | symm (what the row-parallel layers use)
    lm_head: str = "auto"  # auto | vocab | replicated (see pick_lm_head)
    note: str = ""
    pg: ProcessGroup | None = None  # the process group of a launch of more than one rank (init_tp)
    _symm: list = field(default_factory=list)
    _symm_dtype: torch.dtype | None = None
    _flip: int = 0
    _copy_op: bool = True

    # --- collectives ---------------------------------------------------------------------------
    def _failed(self, what: str, e: Exception) -> DistributedError:
        return DistributedError(
            f"rank {self.rank} of {self.world}: the {what} collective failed ({str(e).splitlines()[0][:200]}): "
            f"another rank died or did not answer within {self.timeout_s:.0f} s",
            fix="look at the other ranks' errors (the first one to fail names the cause); raise --tp-timeout if a "
            "rank is merely slow (e.g. loading a large checkpoint)",
            code="E141",
        )

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of `x` over the ranks (a new tensor on the symmetric-memory path, `x` itself otherwise)."""
        if self.world == 1:
            return x
        if self._symm and x.dtype == self._symm_dtype and x.numel() <= self._symm[0].numel() and x.is_contiguous():
            # two buffers used in turn: a rank may write the next input while a slower peer still reads
            # the previous one (the op's own end barrier makes this belt and braces)
            buf = self._symm[self._flip].view(-1)[: x.numel()].view(x.shape)
            self._flip ^= 1
            assert self.pg is not None  # (setup_symm made the buffers over the group's process group)
            if self._copy_op:
                return torch.ops.symm_mem.one_shot_all_reduce_copy(buf, x, "sum", self.pg.group_name)
            buf.copy_(x)  # older torch: stage the input in the symmetric buffer ourselves
            return torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", self.pg.group_name)
        import torch.distributed as dist

        try:
            dist.all_reduce(x, group=self.pg)
        except RuntimeError as e:
            raise self._failed("all-reduce", e) from None
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """[..., n] on each rank -> [..., world * n], rank order (vocab-parallel logits)."""
        if self.world == 1:
            return x
        import torch.distributed as dist

        x = x.contiguous()
        out = torch.empty((self.world * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        try:
            with warnings.catch_warnings():  # (renamed all_gather_single in newer torch; same collective)
                warnings.simplefilter("ignore", FutureWarning)
                dist.all_gather_into_tensor(out, x, group=self.pg)
        except RuntimeError as e:
            raise self._failed("all-gather", e) from None
        out = out.view(self.world, *x.shape)
        return out.movedim(0, -2).reshape(*x.shape[:-1], self.world * x.shape[-1])

    def broadcast_int(self, value: int) -> int:
        """Rank 0's value on every rank (one small collective, e.g. a sampling seed)."""
        if self.world == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.long, device=self.device)
        try:
            dist.broadcast(t, 0, group=self.pg)
        except RuntimeError as e:
            raise self._failed("broadcast", e) from None
        return int(t)

    def agree(self, what: str, value: str) -> None:
        """Refuse ranks that disagree about `value` (e.g. their command lines): same error on every rank."""
        import torch.distributed as dist

        got = [None] * self.world
        try:
            dist.all_gather_object(got, value, group=self.pg)
        except RuntimeError as e:
            raise self._failed("agreement", e) from None
        if len(set(got)) > 1:
            raise DistributedError(
                f"the ranks disagree about {what}: {got}", fix="launch every rank with the same arguments", code="E142"
            )

    def setup_symm(self, numel: int, dtype: torch.dtype) -> None:
        """Symmetric-memory buffers for all-reduces of up to `numel` elements (collective: all ranks call it)."""
        if self._symm and self._symm_dtype == dtype and self._symm[0].numel() >= numel:
            return
        if self.device.type != "cuda" or self.allreduce != "symm" or dtype not in (torch.bfloat16, torch.float32):
            if self.allreduce == "symm":
                self.allreduce, self.note = "nccl", f"symmetric memory unavailable for {dtype} / {self.device}"
            return
        try:
            import torch.distributed._symmetric_memory as symm_mem

            assert self.pg is not None  # (symmetric memory is set up for the ranks of a launch: init_tp's group)

            if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed by older torch, a no-op later
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)
                    symm_mem.enable_symm_mem_for_group(self.pg.group_name)
            bufs = []
            for _ in range(2):
                b = symm_mem.empty(numel, dtype=dtype, device=self.device)
                symm_mem.rendezvous(b, self.pg.group_name)
                bufs.append(b)
            self._symm, self._symm_dtype = bufs, dtype
            self._copy_op = hasattr(torch.ops.symm_mem, "one_shot_all_reduce_copy")
        except Exception as e:  # an old torch, no P2P between the GPUs: NCCL does the job, slower
            self.allreduce, self.note = "nccl", f"symmetric memory failed ({type(e).__name__}: {e}); using NCCL"


_TP: TPGroup | None = None


def current() -> TPGroup | None:
    return _TP


def env_world() -> tuple[int, int, int]:
    """(world size, rank, local rank) from the torchrun environment; (1, 0, 0) outside it."""
    return (
        int(os.environ.get("WORLD_SIZE", "1")),
        int(os.environ.get("RANK", "0")),
        int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))),
    )


def init_tp(
    tp: int | None = None,
    device: str = "auto",
    allreduce: str = "auto",
    timeout_s: float = 120.0,
    lm_head: str = "auto",
) -> TPGroup:
    """Join the tensor-parallel group of this torchrun launch. `tp`, when given, must equal WORLD_SIZE."""
    global _TP
    world, rank, local = env_world()
    if tp is not None and tp != world:
        raise DistributedError(
            f"--tp {tp} but this launch has {world} process{'es' if world != 1 else ''} (WORLD_SIZE={world})",
            fix=f"launch with torchrun --nproc-per-node {tp}, or pass --tp {world} (or leave --tp out under torchrun)",
            code="E143",
        )
    if allreduce not in ALLREDUCE:
        raise InputError(f"unknown all-reduce {allreduce!r}", fix=f"use one of {', '.join(ALLREDUCE)}", code="E108")
    if _TP is not None:
        return _TP
    for k, v in ENV_DEFAULTS.items():
        os.environ.setdefault(k, v)
    cuda = torch.cuda.is_available() if device == "auto" else str(device).startswith("cuda")
    if cuda:
        if local >= torch.cuda.device_count():
            raise DistributedError(
                f"rank {rank} wants GPU {local} but {torch.cuda.device_count()} are visible",
                fix="run at most one process per GPU",
                code="E143",
            )
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    backend = "nccl" if cuda else "gloo"
    if lm_head not in LM_HEAD:
        raise InputError(f"unknown lm_head layout {lm_head!r}", fix=f"use one of {', '.join(LM_HEAD)}", code="E108")
    group = TPGroup(world, rank, dev, backend, float(timeout_s), lm_head=lm_head)
    if world > 1:
        import torch.distributed as dist

        kw: dict[str, Any] = {"device_id": dev} if cuda else {}
        try:
            if not dist.is_initialized():
                dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s), **kw)
        except (RuntimeError, ValueError) as e:
            raise group._failed("process-group setup", e) from None
        group.pg = dist.group.WORLD
    group.allreduce = ("symm" if allreduce == "auto" else allreduce) if cuda else "gloo"
    if not cuda and allreduce != "auto":
        group.note = f"--tp-allreduce {allreduce} needs GPUs: gloo on this CPU"
    _TP = group
    from .observe import trace

    trace.RANK = rank
    return group


def leave_group(barrier: bool = True) -> None:
    """Tear down the default process group, if any. `barrier`: first wait until every rank is done with its
    collectives (and whatever it writes before): without it a rank still finishing the last exchange (a server's
    "stop", rank 0 saving a trained draft) can lose its peer mid-read, or a rank exiting with the group alive can
    abort at exit ("terminate called without an active exception"; seen under load and in the torchrun training
    test). A rank that failed leaves without the barrier, which its peers would wait on until the timeout."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if barrier:
        try:
            dist.barrier()
        except Exception:  # noqa: BLE001 - a rank already gone: tear down anyway
            pass
    dist.destroy_process_group()


def shutdown() -> None:
    global _TP
    if _TP is not None and _TP.world > 1:
        leave_group()
    _TP = None


# --- sharding arithmetic -------------------------------------------------------------------------------
def shard(n: int, world: int, rank: int) -> slice:
    """Rank `rank`'s contiguous share of n items (n divisible by world: checked by check_divisible)."""
    k = n // world
    return slice(rank * k, (rank + 1) * k)


def pick_lm_head(mode: str, vocab: int, hidden: int, world: int, device: torch.device, elem: int) -> bool:
    """True: the lm_head is split by vocabulary rows (one all-gather of the logits per forward)."""
    if mode not in LM_HEAD:
        raise InputError(f"unknown lm_head layout {mode!r}", fix=f"use one of {', '.join(LM_HEAD)}", code="E108")
    if world == 1 or mode == "replicated":
        return False
    if mode == "vocab":
        return True
    if vocab % world:
        return False
    # GPU: each rank reads 1/world of the V x H matrix per token instead of all of it; the gather of [T, V]
    # logits is small next to that (8B: 0.5 GB per token saved, 0.5 MB gathered). CPU: see the constant.
    return device.type == "cuda" or vocab * hidden * elem >= CPU_VOCAB_PARALLEL_BYTES


def check_divisible(cfg, world: int, vocab_parallel: bool) -> None:
    """Every shape the ranks split must divide by the world size: one error naming them all."""
    parts = [
        ("attention heads (num_attention_heads)", cfg.num_heads),
        ("key/value heads (num_key_value_heads)", cfg.num_kv_heads),
        ("MLP width (intermediate_size)", cfg.intermediate_size),
    ]
    if vocab_parallel:
        parts.append(("vocabulary (vocab_size, lm_head split by vocabulary)", cfg.vocab_size))
    bad = [f"{name} {n}" for name, n in parts if n % world]
    if bad:
        ok = [w for w in range(1, 9) if all(n % w == 0 for _, n in parts)]
        raise InputError(
            f"tensor parallelism over {world} ranks splits these shapes, which {world} does not divide: "
            f"{', '.join(bad)}",
            fix=f"use --tp one of {ok}"
            + (" or --tp-lm-head replicated" if vocab_parallel and cfg.vocab_size % world else ""),
            code="E144",
        )


# --- the command line ------------------------------------------------------------------------------------
_REAL_STDERR = None


def error_stream():
    """Where the CLI writes an error: the real stderr even on ranks whose output is silenced."""
    return _REAL_STDERR or sys.stderr


def rank_tag() -> str:
    return f" [rank {_TP.rank}/{_TP.world}]" if _TP is not None and _TP.world > 1 else ""


def silence_other_ranks() -> None:
    """Rank 0 prints; the others keep quiet except for their own errors."""
    global _REAL_STDERR
    if _TP is not None and _TP.rank != 0:
        _REAL_STDERR = sys.stderr
        sys.stdout = open(os.devnull, "w")
        sys.stderr = open(os.devnull, "w")
        from .observe import trace

        trace._stream = sys.stderr  # EAGLE3_DEBUG lines from rank 0 only (EAGLE3_DEBUG_FILE gets every rank's)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the rendezvous of `--tp N`, servers started by tests and benchmarks)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(n: int, argv: list[str], grace_s: float = 30.0, cmd: list[str] | None = None) -> int:
    """`eaglekit ... --tp N` outside torchrun: start N copies of this command with the torchrun environment
    (one per GPU, or N CPU processes), wait, and return the first failure's exit status. A rank that
    fails makes the others fail on their next collective; any still running after `grace_s` are killed."""
    port = free_port()
    procs = []
    for r in range(n):
        env = dict(
            os.environ,
            WORLD_SIZE=str(n),
            RANK=str(r),
            LOCAL_RANK=str(r),
            LOCAL_WORLD_SIZE=str(n),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(subprocess.Popen([*(cmd or [sys.executable, "-m", "eaglekit"]), *argv], env=env))
    _forward_signals(procs[0])
    rc, failed_at = 0, None
    while any(p.poll() is None for p in procs):
        for p in procs:
            if p.poll() not in (None, 0) and failed_at is None:
                rc, failed_at = p.returncode, time.time()
        if failed_at is not None and time.time() - failed_at > grace_s:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)
    for p in procs:
        if p.returncode and not rc:
            rc = p.returncode
    return rc if rc >= 0 else 1


def _forward_signals(rank0: subprocess.Popen) -> None:
    """The launcher stands for the launch: SIGTERM goes on to rank 0 (a server drains, then stops the other
    ranks itself; any other command ends and the others fail on their next collective). Ctrl-C reaches every
    rank from the terminal already: the launcher only keeps waiting for them."""
    import signal

    def term(sig, frame):
        if rank0.poll() is None:
            rank0.send_signal(signal.SIGTERM)

    try:
        signal.signal(signal.SIGTERM, term)
        signal.signal(signal.SIGINT, lambda sig, frame: None)
    except ValueError:  # not the main thread: leave the handlers alone
        pass


def enter_cli(args, argv: list[str] | None) -> int | None:
    """For the TP commands: spawn `--tp N` ranks (returns their exit status), or, inside a torchrun launch,
    join the group and silence ranks > 0 (returns None: run the command). `args`: a command's with the options of
    cli.common.add_tp and --device (generate, eval, doctor, serve)."""
    tp = args.tp
    world = env_world()[0]
    if world == 1 and (tp is None or tp == 1):
        return None
    if world == 1:
        assert tp is not None  # (world 1 without --tp returned above)
        if tp < 1:
            raise InputError(f"--tp must be >= 1, got {tp}", fix="e.g. --tp 2", code="E108")
        return launch(tp, list(sys.argv[1:] if argv is None else argv))
    dev = args.device
    group = init_tp(tp, "auto" if dev in (None, "auto") else dev, args.tp_allreduce, args.tp_timeout, args.tp_lm_head)
    group.agree("the command line", " ".join(sys.argv[1:] if argv is None else argv))
    silence_other_ranks()
    return None
