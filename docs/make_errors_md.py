"""Writes docs/errors.md from eaglekit.errors.CODES (the one registry): python docs/make_errors_md.py"""

from pathlib import Path

from eaglekit.errors import CODES

CLASSES = {"E0": "generic", "E1": "input: paths, files, option values (InputError)",
           "E2": "contract: the draft vs the target (ContractError; the fault classes of faults.md)",
           "E3": "generation parameters (GenerationError)", "E4": "features at run time (FeatureError)",
           "W3": "doctor warnings", "I3": "doctor notes"}


def render() -> str:
    out = ["# eaglekit error codes", "",
           "Every error eaglekit raises for bad input carries a stable code, a sentence with the numbers involved,",
           "and a `fix:` line; the CLI prints it without a traceback (exit status 2) and ends it with",
           "`see: docs/errors.md#<code>`. This page is generated from `eaglekit.errors.CODES`, the one registry",
           "(`python docs/make_errors_md.py`); a test checks that every code the package raises is registered and",
           "listed here. The E2xx codes are the hidden-state contract faults of [faults.md](faults.md).", ""]
    cur = None
    for code, (meaning, fix) in CODES.items():
        if code[:2] != cur:
            cur = code[:2]
            out += ["", f"## {cur}xx: {CLASSES.get(cur, '')}", "", "| code | meaning | usual fix |",
                    "| --- | --- | --- |"]
        out.append(f'| <a id="{code.lower()}"></a>{code} | {meaning} | {fix} |')
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    (Path(__file__).parent / "errors.md").write_text(render())
