"""The draft folder layouts of the ecosystem, as interop sees them.

Reading every layout (eaglekit, SGLang / SpecForge, vLLM speculators, the EAGLE reference) is the draft
checkpoint's job (eaglekit.draft.checkpoint), so that `load_draft` reads any folder without reaching up
into interop: interop depends on draft, never the other way. This module names that reader for the
commands that describe folders (inspect, doctor).
"""

from __future__ import annotations

from ..draft.checkpoint import CONVENTIONS, FORMATS, FolderFormat, declared_captures, read_folder

NAMES = FORMATS
normalize = read_folder  # config in the SGLang layout, tensors under our names, the FolderFormat read

__all__ = ["CONVENTIONS", "FORMATS", "NAMES", "FolderFormat", "declared_captures", "normalize", "read_folder"]
