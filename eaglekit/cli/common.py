"""The options and checks that the `eaglekit` commands share: the flag groups several commands declare (runtime,
compile, tree, sampling, capture, tensor parallelism) from eaglekit/options.py, their values read back as
ModelOptions and DecodeOptions, the checks of model folders and of a prompt against the target's context made before a
model loads, and the cut of a text at its first stop string."""

from __future__ import annotations

from pathlib import Path

from ..options import COMPILE_FLAGS, DecodeOptions, ModelOptions

# --- shared option groups: declared once, in eaglekit/options.py --------------------------------------
_TREE = ("steps", "topk", "draft_tokens")
_SAMPLING = ("temperature", "top_p", "top_k", "seed")


def add_runtime(p, **defaults):
    """--backend, --device, --dtype."""
    ModelOptions.add_runtime(p, **defaults)


def add_compile(p):
    ModelOptions.add_args(p, only=COMPILE_FLAGS)


def add_tree(p):
    DecodeOptions.add_args(p, only=_TREE)


def add_sampling(p):
    DecodeOptions.add_args(p, only=_SAMPLING)


def add_capture(p):
    """--capture-layers and --allow-other-target."""
    ModelOptions.add_args(p, only=("capture_layers", "allow_other_target"))


def model_options(args, **over) -> ModelOptions:
    return ModelOptions.from_args(args, **over)


def decode_options(args, **over) -> DecodeOptions:
    return DecodeOptions.from_args(args, **over)


def add_tp(p):
    g = p.add_argument_group("tensor parallelism (also under torchrun --nproc-per-node N -m eaglekit ...)")
    g.add_argument(
        "--tp",
        type=int,
        default=None,
        help="split the target over N processes (one per GPU, or CPU "
        "processes over gloo); the draft runs replicated on each",
    )
    g.add_argument(
        "--tp-allreduce",
        default="auto",
        choices=["auto", "nccl", "symm"],
        help="GPU all-reduce: symm (torch symmetric memory, one-shot; auto) or nccl",
    )
    g.add_argument(
        "--tp-lm-head",
        default="auto",
        choices=["auto", "vocab", "replicated"],
        help="lm_head split by vocabulary or replicated (auto: split on GPUs, by size on CPUs)",
    )
    g.add_argument("--tp-timeout", type=float, default=120.0, help="seconds before a silent rank is an error")


def check_folders(target: str | None = None, draft: str | None = None) -> None:
    """--target and --draft are folders whose JSON files parse and whose config.json fields are sound (E101,
    E117, E118, E150-E155): checked with the other options, before a tokenizer or a model loads."""
    from ..io import need_dir
    from ..models.config import check_model_folder

    if target is not None:
        check_model_folder(need_dir(target, "--target"))
    if draft is not None:
        check_model_folder(need_dir(draft, "--draft"), target=False)


def target_context(target: str) -> int | None:
    from ..models.config import read_json

    n = read_json(Path(target) / "config.json", "target config").get("max_position_embeddings")
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def check_prompt_fits(n_tokens: int, context: int | None) -> None:
    """A prompt that leaves no room for one new token is refused by its own length (E309), before the model
    loads; one that fits, with too many new tokens asked for, is the engine's E301."""
    if context is not None and n_tokens >= context:
        from ..errors import GenerationError

        raise GenerationError(
            f"the prompt is {n_tokens} tokens; the target's context is {context}, so it is "
            f"{n_tokens - context + 1} token(s) too long to leave room for one new token",
            fix=f"shorten the prompt by at least {n_tokens - context + 1} tokens",
            code="E309",
        )


def cut_at_stop(text: str, stops) -> str:
    """The text before the first stop string, as the server (and OpenAI's API) returns it."""
    hits = [i for s in stops or () if (i := text.find(s)) >= 0]
    return text[: min(hits)] if hits else text


def tree_shape(args):
    return decode_options(args).shape()


def capture_override(args):
    return model_options(args).capture


def sampling_params(args):
    sp = decode_options(args).sampling()
    if sp.seed is None and sp.temperature > 0:
        from ..distributed import current

        tp = current()
        if tp is not None and tp.world > 1:  # every rank must sample alike: rank 0 draws the seed
            import dataclasses
            import random

            sp = dataclasses.replace(sp, seed=tp.broadcast_int(random.randrange(2**62)))
    return sp
