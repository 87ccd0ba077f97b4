"""Writes docs/errors.md from eaglekit.errors.CODES (the one registry): python docs/make_errors_md.py"""

from pathlib import Path

from eaglekit.errors import CODES

# one section per class, in this order; every code of CODES falls in one (render() refuses a code that does not)
CLASSES = {"E0": "generic", "E1": "input: paths, files, option values (InputError)",
           "E2": "contract: the draft vs the target (ContractError; the fault classes of faults.md)",
           "E3": "generation parameters (GenerationError)", "E4": "features at run time (FeatureError)",
           "W2": "doctor warnings: what the probe could not tell, what the folder does not record",
           "W3": "doctor warnings about capture-layer ids", "I3": "doctor notes"}


def render() -> str:
    out = ["# eaglekit error codes", "",
           "Every error eaglekit raises for bad input carries a stable code, a sentence with the numbers involved,",
           "and a `fix:` line; the CLI prints it without a traceback (exit status 2) and ends it with",
           "`see: docs/errors.md#<code>`. This page is generated from `eaglekit.errors.CODES`, the one registry",
           "(`python docs/make_errors_md.py`); a test checks that every code the package raises is registered and",
           "listed here. The E2xx codes are the hidden-state contract faults of [faults.md](faults.md).", ""]
    # sections by class, codes in numeric order within each: the registry's own order is the order codes were added
    unknown = sorted(c for c in CODES if c[:2] not in CLASSES)
    if unknown:
        raise ValueError(f"codes of no class in CLASSES: {unknown}")
    for cls, title in CLASSES.items():
        codes = sorted(c for c in CODES if c[:2] == cls)
        if not codes:
            continue
        out += ["", f"## {cls}xx: {title}", "", "| code | meaning | usual fix |", "| --- | --- | --- |"]
        out += [f'| <a id="{c.lower()}"></a>{c} | {CODES[c][0]} | {CODES[c][1]} |' for c in codes]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    (Path(__file__).parent / "errors.md").write_text(render())
