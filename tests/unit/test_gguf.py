"""GGUF files that Strata cannot use fail with a clear error, before anything is dequantized or
cached: an unreadable or truncated file, an architecture TransformerLens cannot run, a file
without a tokenizer. Files are written here with the `gguf` package's own writer. (A real GGUF
model, SmolLM2-135M, is loaded, checked against Hugging Face and computed in
`tests/integration/test_smollm2.py`.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from compute import gguf as strata_gguf
from compute.errors import ModelLoadError
from compute.models import resolve_model_spec
from service.cli.errors import EXIT_LOAD
from tests.serving import run_strata


def write_gguf(path: Path, *, arch: str = "llama", tokenizer: bool = True,
               n_tensors: int = 2) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(["<|endoftext|>", "a", "b", "ab"])
        writer.add_token_merges(["a b"])
    for i in range(n_tensors):
        writer.add_tensor(f"blk.0.t{i}.weight", np.full((8, 8), i, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_well_formed_header_is_read(tmp_path: Path) -> None:
    info = strata_gguf.inspect_gguf(write_gguf(tmp_path / "ok.gguf"))
    assert info.architecture == "llama"
    assert info.quantization == "ALL_F32"
    assert info.tensor_types == {"F32": 2}
    assert len(info.sha256) == 64


@pytest.mark.parametrize(("make", "says"), [
    (lambda p: write_gguf(p, arch="mamba"), "architecture 'mamba'"),
    (lambda p: write_gguf(p, tokenizer=False), "carries no tokenizer"),
    (lambda p: p.write_bytes(b"GGUF" + bytes(range(256)) * 4), "not a readable GGUF"),
    (lambda p: p.write_bytes(b"not a gguf file at all"), "not a readable GGUF"),
])
def test_unusable_files_are_refused_before_dequantizing(tmp_path: Path, make, says) -> None:
    path = tmp_path / "bad.gguf"
    make(path)
    strata_gguf.set_cache_dir(tmp_path / "cache")
    with pytest.raises(ModelLoadError, match=says):
        resolve_model_spec(str(path))
    with pytest.raises(ModelLoadError, match=says):
        strata_gguf.dequantized_checkpoint(path)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_a_truncated_file_is_refused(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "whole.gguf", n_tensors=3)
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 100])  # the last tensor loses its tail
    with pytest.raises(ModelLoadError, match="truncated"):
        strata_gguf.inspect_gguf(cut)


def test_a_file_that_changed_after_its_run_was_specified_is_refused(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    spec = resolve_model_spec(str(path))
    assert spec.revision == "sha256:" + strata_gguf.file_sha256(path)
    write_gguf(path, n_tensors=3)  # new bytes under the same name
    with pytest.raises(ModelLoadError, match="the file changed after the run was specified"):
        strata_gguf.inspect_gguf(path, spec.revision.removeprefix("sha256:"))


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no such file or directory"):
        resolve_model_spec(str(tmp_path / "absent.gguf"))


def test_cli_exits_with_the_load_code_and_caches_nothing(tmp_path: Path) -> None:
    bad = write_gguf(tmp_path / "mamba.gguf", arch="mamba")
    out = tmp_path / "out.parquet"
    ran = run_strata(["compute", "--model", str(bad), "--out", str(out), "--metrics", "norms",
                      "--quiet"], {"HF_HUB_OFFLINE": "1", "STRATA_DATA_DIR": str(tmp_path / "d")})
    assert ran.exit_code == EXIT_LOAD, ran.output
    assert "architecture 'mamba'" in ran.stderr
    assert not out.exists()
    assert not (tmp_path / "d" / "gguf").exists()
