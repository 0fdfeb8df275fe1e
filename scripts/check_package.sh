#!/usr/bin/env bash
# Build the wheel and sdist as a release would, check their metadata, and install the wheel
# the way a user does (a fresh virtualenv, torch first) to run what the README promises.
#   scripts/check_package.sh          (after scripts/setup.sh: uses .venv's build and twine)
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

"$py" -m build --outdir "$out/dist" . >"$out/build.log" 2>&1 || { cat "$out/build.log"; exit 1; }
"$py" -m twine check --strict "$out"/dist/*

wheel=$(ls "$out"/dist/*.whl)
sdist=$(ls "$out"/dist/*.tar.gz)
# (listings in variables: `grep -q` on a pipe would end it early, and pipefail would call that a failure)
in_wheel=$("$py" -m zipfile -l "$wheel")
in_sdist=$(tar -tzf "$sdist")
for shipped in LICENSE ensemble_core/py.typed langchain_ensemble/py.typed llamaindex_ensemble/py.typed; do
  grep -q "$shipped" <<<"$in_wheel" || { echo "error: the wheel lacks $shipped" >&2; exit 1; }
done
grep -q '/LICENSE$' <<<"$in_sdist" || { echo "error: the sdist lacks LICENSE" >&2; exit 1; }
if grep -q '/tests/' <<<"$in_sdist"; then
  echo "error: the sdist ships tests, which cannot run outside a checkout" >&2; exit 1
fi

# A user's install: a fresh virtualenv, torch first (the local CPU wheel on these machines; users
# take theirs from the index for their hardware), then the wheel with both adapters.
"$(command -v python3.11 || command -v python3)" -m venv "$out/venv"
user="$out/venv/bin"
"$user/python" -m pip install --quiet "torch==${TORCH_VERSION:-2.13.0}"
"$user/python" -m pip install --quiet "$wheel[langchain,llamaindex]"
cd "$out"  # not the checkout: imports must come from the installed wheel
"$user/ensemble-llm" --version
HF_HUB_OFFLINE=1 "$user/ensemble-llm" models list >/dev/null
"$user/python" -c "import langchain_ensemble, llamaindex_ensemble, ensemble_core; print('imports: ok', ensemble_core.__file__)"
echo "package: ok ($(basename "$wheel"), $(basename "$sdist"))"
