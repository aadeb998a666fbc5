#!/usr/bin/env bash
# What `omnivox bench gpu-torch` needs on a GPU host lent for checks beyond what it has (torch,
# transformers, numpy, safetensors, tokenizers, pytest; Python 3.12; no network): the `snac`
# package and its `einops`, both pure Python (about 75 KB together). Unpacked into .gpu-carry/
# (ignored by git), which travels with the working tree. Then, on the host, from the tree's root:
#
#   PYTHONPATH=.:.gpu-carry python -m agent.bench.gpu_torch --json gpu-torch-check.json
#
# Without .gpu-carry the check still runs; SNAC says "not run: snac not installed".
set -euo pipefail
cd "$(dirname "$0")/../.."
PIP=${PIP:-.venv/bin/pip}
rm -rf .gpu-carry
"$PIP" install --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --target .gpu-carry snac==1.2.1 einops==0.8.2
du -sh .gpu-carry
