"""GGUF targets under models/: the names of eaglekit.gguf, which sits below models/ and the tokenizer (both resolve a
target path through it)."""

from ..gguf import ARCHS, cache_root, find_smollm2, gguf_file_of, materialize, resolve_target, retype_gguf

__all__ = ["ARCHS", "cache_root", "find_smollm2", "gguf_file_of", "materialize", "resolve_target", "retype_gguf"]
