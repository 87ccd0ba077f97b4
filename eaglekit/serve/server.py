"""Load the pair, build the batched engine and the app, run uvicorn until SIGTERM/SIGINT, drain, exit 0."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from ..errors import InputError


def serve(target_dir: str, draft_dir: str | None = None, host: str = "127.0.0.1", port: int = 8000,
          max_batch: int = 8, max_queue: int = 64, shape=None, served_model_name: list[str] | None = None,
          spec_max_batch: int | None = None, capture=None, allow_other_target: bool = False, backend: str = "auto",
          device: str = "auto", dtype: str | None = None, compile: str | bool = "auto", graphs="auto",
          chat_template: str | None = None, drain_timeout: float = 120.0, log_level: str = "info",
          threads: int | None = None, products: str = "auto", draft_quant: str | None = None) -> int:
    import uvicorn

    from .. import __version__
    from ..decoding.batch import BatchEngine
    from ..pair import load_pair
    from ..tokenizer import load_tokenizer
    from .app import build_app

    if max_batch < 1 or max_queue < 0:
        raise InputError(f"--max-batch must be >= 1 and --max-queue >= 0 (got {max_batch}, {max_queue})",
                         fix="e.g. --max-batch 8 --max-queue 64", code="E108")
    template = None
    if chat_template:
        f = Path(chat_template)
        template = f.read_text() if f.is_file() else chat_template  # a file, or the template itself
    if threads:
        import torch

        torch.set_num_threads(threads)  # global to torch: the engine thread runs with it too
    tok = load_tokenizer(target_dir)
    # 'auto' is off here: the batched engine meets many (rows, tokens) shapes, each a compile of its own (seconds
    # each, some of them while requests wait); --compile asks for it on purpose
    target, draft = load_pair(target_dir, draft_dir, backend, device, dtype,
                              compile="off" if compile in ("auto", None) else compile, products=products,
                              draft_quant=draft_quant,
                              batched=True)
    engine = BatchEngine(target, draft, shape, max_batch=max_batch, tokenizer=tok, spec_max_batch=spec_max_batch,
                         capture=capture, allow_other_target=allow_other_target, graphs=graphs)
    from ..distributed import current

    tp, lockstep = current(), None
    if tp is not None and tp.world > 1:  # --tp N / torchrun: rank 0 serves, the others decode in lockstep
        from .lockstep import Lockstep, follow

        lockstep = Lockstep(engine)
        if tp.rank != 0:
            return follow(lockstep)
        engine = lockstep
    shape = getattr(engine, "shape", shape)
    served = served_model_name or [target_dir]
    info = {"version": f"eaglekit {__version__}", "model_path": str(target_dir),
            "draft_model_path": None if draft_dir is None else str(draft_dir),
            "speculative_algorithm": "EAGLE3" if draft is not None else None,
            "speculative_num_steps": shape.steps if draft is not None and shape else None,
            "speculative_eagle_topk": shape.topk if draft is not None and shape else None,
            "speculative_num_draft_tokens": shape.draft_tokens if draft is not None and shape else None,
            "spec_max_batch": getattr(engine, "spec_max_batch", spec_max_batch),
            "device": str(target.device), "dtype": str(target.dtype).replace("torch.", ""),
            "tp_size": tp.world if tp is not None else 1}
    app = build_app(engine, tok, served, target.info.max_position_embeddings, max_batch, max_queue, template, info,
                    drain_timeout, speculative=draft is not None,
                    positions=shape.steps if draft is not None and shape else 0, vocab_size=target.info.vocab_size)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=int(drain_timeout))
    server = uvicorn.Server(config)
    # uvicorn drains open responses on SIGTERM, then re-raises the signal to the handler that was there before
    # it started; with the default handler the process would die by the signal after a clean drain
    drained = lambda sig, frame: None  # noqa: E731
    signal.signal(signal.SIGTERM, drained)
    signal.signal(signal.SIGINT, drained)
    try:
        server.run()
    finally:
        if lockstep is not None:
            lockstep.close()
    print("eaglekit serve: drained and stopped", file=sys.stderr)
    return 0
