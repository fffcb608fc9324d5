"""A model reference that names nothing loadable is refused with what is wrong with it: a path
that does not exist says so, one that exists says what it lacks, and a name lists every zoo
model (or how many more there are)."""

from __future__ import annotations

from pathlib import Path

import pytest

from compute.errors import UnknownModelError
from compute.models import resolve_model_spec, zoo_names
from compute.models.unknown import looks_like_path, zoo_hint


def refusal(ref: str) -> str:
    with pytest.raises(UnknownModelError) as caught:
        resolve_model_spec(ref)
    return str(caught.value)


def test_a_path_that_does_not_exist_is_named(tmp_path: Path) -> None:
    absent = tmp_path / "my-checkpoint"
    assert refusal(str(absent)).endswith(f": no such file or directory: {absent}")
    assert "not a zoo model" not in refusal(str(absent))


def test_a_path_that_exists_says_what_it_lacks(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"")
    assert "is a directory without config.json" in refusal(str(tmp_path))
    assert "is a file, not a checkpoint directory" in refusal(str(tmp_path / "weights.bin"))


def test_an_unknown_name_lists_every_zoo_model() -> None:
    message = refusal("no-such-model-anywhere")
    assert message.startswith("unknown model 'no-such-model-anywhere': not a zoo model (")
    assert "tiny-2l-s0" in message  # the two the Quickstart uses
    assert "tiny-4l-s0" in message
    for name in zoo_names():
        assert name in message


def test_a_long_zoo_list_says_how_many_more() -> None:
    names = [f"m{i:02d}" for i in range(20)]
    assert zoo_hint(names, shown=16) == ", ".join(names[:16]) + ", … and 4 more"
    assert zoo_hint(names[:3], shown=16) == "m00, m01, m02"


def test_hub_names_are_not_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert not looks_like_path("someone/not-a-model")
    assert not looks_like_path("gpt2")
    (tmp_path / "checkpoints").mkdir()
    assert looks_like_path("checkpoints/typo")
    for path in ("./x", "../x", "~/x", "/x"):
        assert looks_like_path(path)
