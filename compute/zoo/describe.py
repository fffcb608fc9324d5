"""What the zoo holds, for `strata zoo list` and `strata zoo show`: trained checkpoints with
their training record, and planted controls with the answers they encode."""

from __future__ import annotations

import json
from typing import Any

from compute.errors import UnknownModelError
from compute.models import zoo_names
from compute.zoo.paths import zoo_path
from compute.zoo.planted import PLANTED, planted_metadata
from compute.zoo.train import ZOO_METADATA_FILE


def zoo_entry(name: str) -> dict[str, Any]:
    """Everything known about one zoo model without loading it."""
    name = name.removeprefix("zoo:")
    if name in PLANTED:
        return planted_metadata(name)
    meta_file = zoo_path(name) / ZOO_METADATA_FILE
    if not (zoo_path(name) / "config.json").is_file():
        raise UnknownModelError(f"no zoo model named {name!r}; available: {', '.join(zoo_names())}")
    meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
    return {"name": name, "kind": meta.get("kind", "trained checkpoint"), **meta}


def zoo_line(name: str) -> str:
    """One line of `strata zoo list`: name, kind and the headline facts."""
    entry = zoo_entry(name)
    if entry["kind"] == "planted control":
        return f"{name}\tplanted control: {entry['summary']}"
    loss = entry.get("val_loss")
    line = f"{name}\tval_loss={loss if loss is None else round(loss, 4)}"
    summary = entry.get("summary")
    return f"{line}\t{summary}" if summary else line
