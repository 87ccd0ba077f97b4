#!/usr/bin/env bash
# The GPU tier in parts: `bash tests/gpu_parts.sh 1` runs part 1, `all` every part in order, `list` names them.
# See tests/gpu_parts.py (the parts, JUnit files and a summary under $OUT when it is set).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python tests/gpu_parts.py "${@:-all}"
