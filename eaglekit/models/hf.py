"""A target over any transformers AutoModelForCausalLM (DeepSeek-V3, Gemma, ...).

Capture by forward hooks on the decoder layers (the residual stream a layer returns), trees by a 4D
additive attention mask and explicit position ids, KV keep/drop by editing the DynamicCache tensors.
Slower than our compact decoder, but it runs what transformers runs.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import InputError
from .base import SequenceTarget, TargetInfo
from .config import config_fingerprint


def _member(obj, name: str, default=None):
    """A member of a transformers object (a model, its config, a cache layer), or `default` where this architecture
    or this release has none: what they hold differs from one model class to the next. The adapter's one question of
    that kind."""
    return getattr(obj, name, default)


def _decoder_layers(model) -> torch.nn.ModuleList:
    base = model.base_model
    layers = _member(base, "layers")
    if isinstance(layers, torch.nn.ModuleList):
        return layers
    lists = [m for m in base.modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        raise InputError(
            f"cannot find the decoder layers of {type(model).__name__}",
            code="E104",
            fix="this architecture has no layer list eaglekit can hook",
        )
    return max(lists, key=len)


class HFTarget(SequenceTarget):
    backend = "hf"

    def __init__(self, model, device, dtype):
        self.model = model.eval()
        self.device, self.dtype = torch.device(device), dtype
        cfg = model.config
        eos = cfg.eos_token_id
        eos = () if eos is None else ((eos,) if isinstance(eos, int) else tuple(eos))
        fp = config_fingerprint(cfg.to_dict())
        self.layers = _decoder_layers(model)
        self.info = TargetInfo(
            cfg.model_type,
            cfg.vocab_size,
            cfg.hidden_size,
            len(self.layers),
            _member(cfg, "max_position_embeddings", 4096),
            eos,
            fp,
        )
        self._caught: dict[int, torch.Tensor] = {}
        self._hooked: set[int] = set()
        self._wanted: frozenset[int] = frozenset()
        self.cache = None
        # transformers renamed `past_key_values` to `cache` in 5.2x; 5.17 knows only the old name
        import inspect

        self._cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self._length = 0

    @classmethod
    def from_folder(cls, folder, device="cpu", dtype=torch.float32) -> "HFTarget":
        from transformers import AutoConfig, AutoModelForCausalLM

        folder = Path(folder)
        if not (folder / "config.json").is_file():
            raise InputError(f"target folder {folder} has no config.json", fix="pass a model folder", code="E101")
        try:
            config = AutoConfig.from_pretrained(folder, local_files_only=True)
        except (ValueError, KeyError) as e:
            from .config import FAMILIES

            raise InputError(
                f"transformers does not know the architecture in {folder / 'config.json'} ({e})",
                fix=f"eaglekit runs {', '.join(FAMILIES)} with its own decoder and any architecture your "
                "transformers version supports through --backend hf; upgrade transformers for newer ones",
                code="E104",
            ) from None
        extra = {"experts_implementation": "eager"} if dtype == torch.float64 else {}  # grouped_mm lacks float64
        try:
            model = AutoModelForCausalLM.from_pretrained(
                folder, config=config, dtype=dtype, local_files_only=True, **extra
            )
        except (OSError, ValueError) as e:
            raise InputError(
                f"transformers could not load {folder}: {e}", fix="check the weights files", code="E106"
            ) from None
        return cls(model.to(device), device, dtype)

    # --- capture ---------------------------------------------------------------------------------
    # Hooks are added once per layer a call asks for and stay; each records only while a call wants it.
    def _want(self, capture):
        self._caught = {}
        if capture is None:
            self._wanted = frozenset()
            return
        capture.validate(self.info.num_layers)
        self._wanted = frozenset(capture.after_layers)
        for i in self._wanted - self._hooked:
            mod = self.model.get_input_embeddings() if i == -1 else self.layers[i]
            mod.register_forward_hook(self._hook(i))
            self._hooked.add(i)

    def _hook(self, idx):
        def fn(_mod, _inp, out):
            if idx in self._wanted:
                self._caught[idx] = out[0] if isinstance(out, tuple) else out

        return fn

    def _gather(self, capture):
        if capture is None:
            return None
        feats = torch.cat([self._caught[i] for i in capture.after_layers], dim=-1)
        self._caught = {}
        return feats

    # --- sequence state --------------------------------------------------------------------------
    # transformers' DynamicCache grows with each call, so this backend is eager: it reads the accepted
    # count on the host in `keep` and builds masks of the current length.
    def reset(self, span: int) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache()
        self._length = 0
        self.span = span

    @property
    def length(self) -> int:
        return self._length

    def _forward(self, ids, depths, block, capture):
        L, T = self._length, ids.numel()
        allowed = torch.zeros(T, L + T, dtype=torch.bool, device=self.device)
        allowed[:, :L] = True
        allowed[:, L:] = block
        add = torch.zeros((1, 1, T, L + T), dtype=self.dtype, device=self.device)
        add.masked_fill_(~allowed[None, None], torch.finfo(self.dtype).min)
        self._want(capture)
        out = self.model(
            input_ids=ids.view(1, T),
            attention_mask=add,
            position_ids=(L + depths).view(1, T),
            use_cache=True,
            **{self._cache_kw: self.cache},
        )  # the cache is updated in place
        return out.logits[0].float(), (self._gather(capture)[0] if capture is not None else None)

    def _advance(self, n: int) -> None:
        self._length += n

    def keep(self, path, n, in_place: bool = False) -> None:  # (any path: in_place changes nothing here)
        L = self._length
        k = int(n)
        idx = torch.cat([torch.arange(L, device=self.device), L + path[:k].to(self.device)])
        for layer in self.cache.layers:
            if _member(layer, "keys") is not None and layer.keys.numel():
                layer.keys = layer.keys.index_select(2, idx)
                layer.values = layer.values.index_select(2, idx)
        self._length = L + k

    @torch.no_grad()
    def generate_batch(self, ids, pad, max_new, sp, seed, eos_ids=()):
        """Regeneration's batches (this adapter decodes one row at a time in the engine, so transformers' generate
        runs them): continue left-padded prompts ids [B, P] (pad [B]: padding per row, never attended to) by up to
        `max_new` tokens, greedy or sampled by SamplingParams `sp` with `seed`, stopping once every row has emitted
        an EOS -> new tokens [B, T <= max_new] (a row's tokens after its EOS are filler). The sequence of `reset` is
        left alone."""
        P = ids.shape[1]
        att = (torch.arange(P, device=ids.device)[None, :] >= pad[:, None]).long()
        torch.manual_seed(seed)
        kw = dict(do_sample=not sp.greedy, max_new_tokens=max_new, pad_token_id=0, eos_token_id=list(eos_ids) or None)
        if not sp.greedy:
            kw.update(temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k or None)
        return self.model.generate(ids, attention_mask=att, **kw)[:, P:]

    @torch.no_grad()
    def features(self, ids, pad_mask=None, capture=None):
        self._want(capture)
        out = self.model.base_model(input_ids=ids, attention_mask=pad_mask, use_cache=False)
        return out.last_hidden_state, self._gather(capture)

    def lm_head_weight(self):
        return self.model.get_output_embeddings().weight

    def embed_weight(self):
        return self.model.get_input_embeddings().weight
