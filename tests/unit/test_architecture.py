"""The layout's import rules, as drawn in docs/architecture.md, checked on the code.

Static rules read every module's imports (module level and inside functions) with `ast`; the
client's rule is also checked at run time, in a fresh interpreter, because what matters there is
what `import service.client` actually loads.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("compute", "service")

# Third-party frameworks by role: the science may use none of them.
WEB = {"litestar", "starlette", "uvicorn", "fastapi", "flask", "httpx"}
DATABASE = {"sqlalchemy", "duckdb", "duckdb_engine", "alembic"}
QUEUE = {"celery", "kombu", "redis"}
MODELS = {"torch", "transformer_lens", "transformers", "compute"}

# Which project packages a package may import (besides itself). A package absent from a rule's
# list is forbidden to it; `service.cli` and `service.serve` assemble the whole and may use all.
# The schemas are the contract every side shares (the API, the store's ingest summary, the job
# service, the Python client, the worker's delivery client): a package of their own below all of
# them, importing nothing of the project.
CONTRACT = "service.schemas"
ALLOWED: dict[str, set[str]] = {
    "compute": set(),
    CONTRACT: set(),
    "service.settings": {"compute"},
    "service.exports": {"compute"},
    "service.store": {"compute", "service.settings", CONTRACT},
    "service.jobs": {"compute", "service.settings", "service.store", CONTRACT},
    "service.api": {"compute", "service.settings", "service.store", "service.jobs",
                    "service.exports", CONTRACT},
    "service.client": {CONTRACT},
    "service.worker": {"compute", "service.settings", "service.exports", "service.jobs.broker",
                       "service.jobs.errors", "service.client", CONTRACT},
}
# Third-party imports a package may not make.
FORBIDDEN_EXTERNAL: dict[str, set[str]] = {
    "compute": WEB | DATABASE | QUEUE,
    CONTRACT: WEB | DATABASE | QUEUE | MODELS,
    "service.client": DATABASE | QUEUE | MODELS | {"litestar", "starlette", "uvicorn"},
    "service.store": WEB | QUEUE,
    "service.worker": DATABASE,
    "service.exports": WEB | DATABASE | QUEUE,
}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every module `name` imports, absolute, at any depth of its code."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                if path.name != "__init__.py":
                    base = base[:-1]
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.add(module)
            out |= {f"{module}.{alias.name}" for alias in node.names}
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id == "__import__"))):
            out.add(node.args[0].value)
    return out


def _project_module(imported: str) -> str | None:
    """The project module an import names (`from a.b import c` may name a module or an
    attribute), or None for a third-party one."""
    while imported and imported not in MODULES:
        imported = imported.rpartition(".")[0]
    return imported or None


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in MODULES.items():
        for imported in _imports(name, path):
            target = _project_module(imported)
            if target and target != name:
                graph[name].add(target)
    return graph


def _rule_for(module: str, rules: dict[str, set[str]]) -> str | None:
    candidates = [p for p in rules if module == p or module.startswith(p + ".")]
    return max(candidates, key=len) if candidates else None


def _within(module: str, prefixes: set[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_every_package_imports_only_what_the_layout_allows() -> None:
    assert len(MODULES) > 60
    graph = _graph()
    offenders: dict[str, list[str]] = {}
    for module in MODULES:
        rule = _rule_for(module, ALLOWED)
        if rule is None:
            continue
        bad = sorted(t for t in graph[module]
                     if not _within(t, {rule} | ALLOWED[rule]))
        if bad:
            offenders[module] = bad
    assert not offenders, f"imports across the layout's lines: {offenders}"


def test_nothing_below_the_api_imports_it() -> None:
    """The API is imported only by what assembles the whole (the CLI, `strata serve`): the
    store, the jobs, the worker, the client and the contract never reach up into it."""
    graph = _graph()
    assemblers = {"service.api", "service.cli", "service.serve"}
    offenders = {module: sorted(t for t in targets if _within(t, {"service.api"}))
                 for module, targets in graph.items() if not _within(module, assemblers)}
    assert not {m: t for m, t in offenders.items() if t}


def test_no_package_imports_a_framework_outside_its_role() -> None:
    offenders: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        rule = _rule_for(name, FORBIDDEN_EXTERNAL)
        if rule is None:
            continue
        top = {m.split(".")[0] for m in _imports(name, path) if not _project_module(m)}
        if top & FORBIDDEN_EXTERNAL[rule]:
            offenders[name] = sorted(top & FORBIDDEN_EXTERNAL[rule])
    assert not offenders, offenders


def test_workers_never_reach_the_database_even_indirectly() -> None:
    """Everything a worker module can load, following project imports, stays off the store."""
    graph = _graph()
    seen: set[str] = set()
    todo = [m for m in MODULES if _within(m, {"service.worker"})]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += graph[module]
    assert not {m for m in seen if _within(m, {"service.store", "service.api"})
                and not _within(m, {CONTRACT})}
    externals = {i.split(".")[0] for m in seen for i in _imports(m, MODULES[m])
                 if not _project_module(i)}
    assert not externals & DATABASE


def test_no_import_cycles() -> None:
    """Between project modules, at any depth of the code (a function-level import that only
    hides a cycle is still a cycle)."""
    graph = _graph()
    colour: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        colour[module] = 1
        for target in sorted(graph[module]):
            # a package's __init__ importing its own submodules is how packages re-export
            if target.startswith(module + "."):
                continue
            if colour.get(target) == 1:
                cycles.append([*path[path.index(target):], target])
            elif target not in colour:
                visit(target, [*path, target])
        colour[module] = 2

    for module in sorted(MODULES):
        if module not in colour:
            visit(module, [module])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("module", ["service.client", "service.schemas.models",
                                    "service.schemas.jobs", "service.schemas.runs"])
def test_the_client_loads_without_compute_torch_or_transformer_lens(module: str) -> None:
    """What a downstream tool gets from `import service.client` (and the contract it decodes
    with): checked in a fresh interpreter, so anything loaded indirectly counts. Neither the
    science nor the web framework or the database."""
    heavy = sorted(MODELS | {"litestar", "sqlalchemy", "duckdb"})
    probe = (f"import sys, {module}\n"
             "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
             f"{heavy!r})\n"
             "print(','.join(heavy))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"{module} loads {done.stdout.strip()}"


def test_beat_loads_no_engine() -> None:
    """`strata beat` (a Celery worker of the `ops` queue) imports the tasks module; its one
    task is an HTTP call, so nothing of torch or TransformerLens may load with it (it did,
    through the model cache's annotations: ~2 s of CPU at every start)."""
    probe = ("import sys, service.worker.tasks\n"
             f"print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in "
             f"{sorted(MODELS - {'compute'})!r})))")  # compute.errors is light
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"service.worker.tasks loads {done.stdout.strip()}"
