"""Where the zoo's trained checkpoints live (`compute/zoo/checkpoints/<name>/`).

A leaf module: the model sources (`compute.models.sources`), the planted controls and
`compute.zoo.describe` all read these paths, and it imports none of them.
"""

from __future__ import annotations

from pathlib import Path

ZOO_DIR = Path(__file__).parent / "checkpoints"


def zoo_path(name: str) -> Path:
    return ZOO_DIR / name
