"""Every third-party package that `compute/` and `service/` import is declared in pyproject.toml.

A package that only arrives with another one (msgspec with litestar, kombu with celery) still
works until that other package stops bringing it; declaring what the code imports keeps an
install honest. Imports are read with `ast` at any depth of the code (inside functions and
`if TYPE_CHECKING:` blocks too), and mapped to the distributions that provide them.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("compute", "service")


def _normalized(name: str) -> str:
    """A distribution's name as PEP 503 compares them (`Pydantic_Core` == `pydantic-core`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    """Distribution names in `dependencies` and every `optional-dependencies` extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    names = set()
    for requirement in requirements:
        found = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        assert found, f"pyproject.toml: cannot read the requirement {requirement!r}"
        names.add(_normalized(found.group()))
    return names


def _imported_top_levels() -> dict[str, set[str]]:
    """Top-level module name -> the files importing it (absolute imports only)."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], set()).add(
                        str(path.relative_to(ROOT)))
    return found


def test_every_imported_package_is_declared() -> None:
    declared = _declared()
    providers = packages_distributions()
    undeclared: dict[str, list[str]] = {}
    for module, files in sorted(_imported_top_levels().items()):
        if module in sys.stdlib_module_names or module in PACKAGES:
            continue
        # Not installed here (an extra left out): its module name stands for its distribution.
        distributions = {_normalized(d) for d in providers.get(module, [module])}
        if not distributions & declared:
            undeclared[f"{module} ({', '.join(sorted(distributions))})"] = sorted(files)[:3]
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"
