"""GGUF checkpoints (llama.cpp's single-file format) as a model source.

A GGUF file is read once and dequantized into an ordinary Hugging Face checkpoint folder (float32
safetensors, config.json and the tokenizer the file carries), cached under
`<cache dir>/<sha256 of the file>/`; every later load of the same file reads that folder through
the `hf_dir` path. The dequantization itself is transformers' (with the `gguf` package): Strata
adds the checks that make a bad file a clear error before anything is written, and the record
of where the weights came from.

A dequantized 4-bit model is a different model from its float original, so a GGUF run's identity
says so: the model spec's `source` is `gguf`, its `revision` the file's checksum and its
`quantization` the file's quantization type (e.g. `Q4_1`).

Checks, each a `ModelLoadError` naming the file and what to do (nothing is cached on failure):
- the file is a readable GGUF whose tensors all lie inside it (truncated or corrupt files fail);
- its `general.architecture` is one transformers dequantizes and TransformerLens runs
  (`ARCHITECTURES`; otherwise `UnsupportedArchitectureError`);
- it carries a tokenizer (`tokenizer.ggml.model` and `tokenizer.ggml.tokens`).

>>> info = inspect_gguf(Path("SmolLM2-135M-Instruct.Q4_1.gguf"))  # doctest: +SKIP
>>> info.architecture, info.quantization                              # doctest: +SKIP
('llama', 'Q4_1')
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from compute.errors import ModelLoadError, UnsupportedArchitectureError

log = logging.getLogger(__name__)

# GGUF `general.architecture` -> the Hugging Face architecture transformers dequantizes it to,
# for the architectures TransformerLens also runs and transformers can dequantize (its
# GGUF_CONFIG_MAPPING: not Gemma 1, OLMo or Phi 1/2, which are refused by name). Llama covers
# Llama, Mistral and SmolLM (llama.cpp writes all three as "llama"); "llama" and "gemma3" are
# verified against Hugging Face's forward on real weights (SmolLM2-135M, Gemma 3 270M past its
# sliding window: tests/integration/test_gemma3.py); the others follow the same path, and
# every load, whatever its source, is held to the dequantized checkpoint's own Hugging Face
# forward by the parity check (compute.models.parity).
ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "bloom": "BloomForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
}
PROVENANCE_FILE = "strata-gguf.json"
_HASH_CHUNK = 1 << 22


@dataclass(frozen=True)
class GGUFInfo:
    """What a GGUF file says about itself, read from its header alone (nothing dequantized)."""

    file: str
    sha256: str
    architecture: str
    quantization: str  # the file type (e.g. Q4_1), or the commonest tensor type
    tensor_types: dict[str, int]
    n_tensors: int
    name: str | None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


_cache_dir: Path | None = None


def set_cache_dir(path: Path) -> None:
    """Where dequantized checkpoints are kept (the service sets `<data_dir>/gguf`)."""
    global _cache_dir
    _cache_dir = Path(path)


def cache_dir() -> Path:
    return _cache_dir if _cache_dir is not None else Path(".strata") / "gguf"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(_HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def inspect_gguf(path: Path, sha256: str | None = None) -> GGUFInfo:
    """Read and check a GGUF file's header; raise `ModelLoadError` for a file Strata cannot use.

    With `sha256` (a run's revision), a file whose bytes no longer match is refused. A file whose
    bytes were already dequantized into the cache is not parsed again: its header was checked
    then, and the cached record says what it held (parsing the header of a file with a 49,152-token
    vocabulary takes seconds; hashing it, a tenth of that)."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"no such file or directory: {path} (a GGUF file)")
    digest = file_sha256(path)
    if sha256 is not None and digest != sha256:
        raise ModelLoadError(
            f"{path}: the file changed after the run was specified (its sha256 is now "
            f"{digest[:16]}..., the run's {sha256[:16]}...); register or specify it again"
        )
    cached = _cached_info(digest)
    if cached is not None:
        return replace(cached, file=path.name)
    return _read_header(path, digest)


def _cached_info(sha256: str) -> GGUFInfo | None:
    """What the checkpoint dequantized from these exact bytes recorded, if there is one."""
    provenance = _cache_target(sha256) / PROVENANCE_FILE
    try:
        record = json.loads(provenance.read_text())
        record.pop("format", None)
        info = GGUFInfo(**record)
    except (OSError, ValueError, TypeError):
        return None
    return info if info.sha256 == sha256 else None


def cached_checkpoint(sha256: str) -> Path | None:
    """The checkpoint already dequantized from the file of this SHA-256, if there is one (never
    made here: `dequantized_checkpoint` makes it)."""
    target = _cache_target(sha256)
    return target if _cached_info(sha256) is not None else None


def _cache_target(sha256: str) -> Path:
    return cache_dir().resolve() / sha256[:32]


def _read_header(path: Path, sha256: str) -> GGUFInfo:
    import gguf

    try:
        reader = gguf.GGUFReader(str(path), "r")
    except Exception as exc:  # the reader's own parse errors: ValueError, struct/index errors
        raise ModelLoadError(
            f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc}); it may be truncated "
            "or corrupt: download it again"
        ) from exc
    size = path.stat().st_size
    for tensor in reader.tensors:
        if int(tensor.data_offset) + int(tensor.n_bytes) > size:
            raise ModelLoadError(
                f"{path}: tensor {tensor.name} ends past the end of the file ({size} bytes): the "
                "file is truncated; download it again"
            )

    def field(key: str) -> object | None:
        value = reader.fields.get(key)
        if value is None:
            return None
        try:
            return value.contents()
        except Exception as exc:
            raise ModelLoadError(
                f"{path}: metadata field {key} is unreadable ({exc}); the file is corrupt"
            ) from exc

    arch = field("general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError(
            f"{path}: no general.architecture in the file's metadata; not a model GGUF file"
        )
    if arch not in ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"{path}: architecture {arch!r} is not one Strata can run from GGUF (transformers "
            f"dequantizes, and TransformerLens runs: {', '.join(sorted(ARCHITECTURES))}); use "
            "the model's Hugging Face checkpoint folder instead (docs/architectures.md)"
        )
    if field("tokenizer.ggml.model") is None or "tokenizer.ggml.tokens" not in reader.fields:
        raise ModelLoadError(
            f"{path}: the file carries no tokenizer (tokenizer.ggml.model / tokenizer.ggml.tokens "
            "are missing); Strata needs the tokenizer to make its token batches: use a GGUF file "
            "exported with its tokenizer"
        )
    counts = collections.Counter(t.tensor_type.name for t in reader.tensors)
    quantization = _file_type_name(field("general.file_type")) or (
        counts.most_common(1)[0][0] if counts else "unknown"
    )
    name = field("general.name")
    return GGUFInfo(
        file=path.name,
        sha256=sha256,
        architecture=arch,
        quantization=quantization,
        tensor_types=dict(counts),
        n_tensors=len(reader.tensors),
        name=name if isinstance(name, str) else None,
    )


def _file_type_name(value: object) -> str | None:
    import gguf

    if not isinstance(value, int):
        return None
    try:
        return gguf.LlamaFileType(value).name.removeprefix("MOSTLY_")
    except ValueError:
        return None


def dequantized_checkpoint(path: Path, sha256: str | None = None) -> tuple[Path, GGUFInfo]:
    """The cached Hugging Face checkpoint of a GGUF file, made on first use.

    The folder is built in a temporary directory beside the cache and renamed into place, so a
    crash or a concurrent load never leaves a half-written checkpoint under the final name.
    """
    path = Path(path).resolve()
    info = inspect_gguf(path, sha256)
    target = _cache_target(info.sha256)
    if (target / PROVENANCE_FILE).is_file():
        return target, info
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=target.parent))
    try:
        _dequantize_into(path, info, tmp)
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / PROVENANCE_FILE).is_file():  # not a concurrent load's finished copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target, info


def _dequantize_into(path: Path, info: GGUFInfo, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("dequantizing %s (%s, %s) into %s", path, info.architecture, info.quantization, out)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
    except Exception as exc:
        raise ModelLoadError(
            f"{path}: transformers could not dequantize this GGUF file "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    # The dequantized weights are plain float32: what is saved is an ordinary checkpoint.
    model.config.__dict__.pop("quantization_config", None)
    # torch types Module.__setattr__ for tensors and submodules only; this is a plain attribute.
    model.hf_quantizer = None  # type: ignore[assignment]
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / PROVENANCE_FILE).write_text(
        json.dumps({"format": "gguf", **info.as_dict()}, indent=2, sort_keys=True)
    )
