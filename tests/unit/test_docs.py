"""The documentation stands on its own: no file links outside the repository, every relative
link in the Markdown files points to a file (and heading) that exists, and every metric name in
the catalog is documented with its unit in docs/metrics.md."""

from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path

import pytest

from compute.records import CATALOG, unit_of

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|^\[[^\]]+\]:\s*(\S+)", re.M)
OUTSIDE = "../" + "shared"  # spelled apart so this file does not match itself


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode()
        files = [ROOT / p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: walk the tree
        files = [p for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts
                 and ".git" not in p.parts]
    # new docs not yet committed are checked too
    files += [p for p in (ROOT / "docs").glob("*.md") if p not in files]
    return [p for p in files if p.is_file()]


def markdown_files() -> list[Path]:
    return sorted(p for p in tracked_files() if p.suffix == ".md")


def text_of(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    in_code = False
    for line in (text_of(path) or "").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", text_of(path) or "", flags=re.S)  # not code blocks
    text = re.sub(r"`[^`\n]*`", "", text)  # nor inline code
    return [a or b for a, b in LINK.findall(text)]


def test_no_file_refers_outside_the_repository() -> None:
    offenders = [str(p.relative_to(ROOT)) for p in tracked_files()
                 if OUTSIDE in (text_of(p) or "")]
    assert not offenders, f"files that refer to {OUTSIDE}, outside the repository: {offenders}"


def test_no_file_cites_a_metrics_file_outside_the_repository() -> None:
    """The metric definitions live in docs/metrics.md, not in a file a user's clone lacks."""
    name = "METRICS" + ".md"  # spelled apart so this file does not match itself
    offenders = [str(p.relative_to(ROOT)) for p in tracked_files()
                 if name in (text_of(p) or "")]
    assert not offenders, f"point these at docs/metrics.md instead: {offenders}"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(path: Path) -> None:
    problems = []
    for target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
            continue  # an absolute URL (https:, mailto:)
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.is_relative_to(ROOT):
            problems.append(f"{target}: outside the repository")
            continue
        if not dest.exists():
            problems.append(f"{target}: no such file")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not problems, f"{path.relative_to(ROOT)}: " + "; ".join(problems)


def test_slug_matches_github() -> None:
    assert slug("intervention.* — per layer, per kind") == "intervention--per-layer-per-kind"
    assert slug("Catalog: every name and unit") == "catalog-every-name-and-unit"
    assert slug("`api` section") == "api-section"


# --------------------------------------------------------------------------- docs/metrics.md


def catalog_table() -> dict[str, str]:
    """name -> unit from the catalog table at the end of docs/metrics.md."""
    text = (ROOT / "docs" / "metrics.md").read_text()
    table = text.split("## Catalog", 1)[1]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            for name in re.findall(r"`([^`]+)`", cells[0]):
                rows[name] = cells[1]
    return rows


def test_every_catalog_name_is_documented_with_its_unit() -> None:
    documented = catalog_table()
    text = (ROOT / "docs" / "metrics.md").read_text()
    for name, unit in CATALOG.items():
        assert documented.get(name) == unit, f"{name} ({unit}) missing from the catalog table"
        assert text.count(f"`{name}`") >= 2, f"{name} is listed but not defined"
    for name, unit in documented.items():
        example = name.replace("<k>", "5").replace("<n>", "2")
        assert unit_of(example) == unit, f"docs/metrics.md: {name} is not {unit} in the code"


def test_documented_variables_are_settings() -> None:
    """Every STRATA_* variable the docs name is a real setting (or a documented prefix)."""
    from service.settings import Settings
    from service.settings_doc import iter_settings

    known = {e for s in iter_settings(Settings) for e in s.env}
    problems = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name in set(re.findall(r"\bSTRATA_[A-Z0-9_]*[A-Z0-9]\b", text_of(path) or "")):
            prefix = any(k.startswith(name + "__") for k in known)  # a section, e.g. STRATA_JOBS
            if name not in known and not prefix:
                problems.append(f"{path.relative_to(ROOT)}: {name}")
    assert not problems, problems


def test_every_api_endpoint_is_documented(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/api.md lists every method and path the app serves under /api/v1."""
    from service.api.app import create_app
    from service.settings import Settings
    from service.store import Store
    from service.store.migrate import ensure_current

    monkeypatch.setenv("STRATA_DATA_DIR", str(tmp_path / "state"))
    settings = Settings(database=tmp_path / "docs.duckdb")
    store = Store.open(settings.database)
    try:
        ensure_current(store)
        app = create_app(settings, store)
        served = {(method, re.sub(r"\{[^}]*\}", "{}", route.path.removeprefix("/api/v1")))
                  for route in app.routes if route.path.startswith("/api/v1/")
                  for method in getattr(route, "methods", ()) if method not in {"OPTIONS",
                                                                                "HEAD"}}
    finally:
        store.close()
    text = (ROOT / "docs" / "api.md").read_text()
    documented = {(m, re.sub(r"\{[^}]*\}", "{}", p.rstrip("/")))
                  for m, p in re.findall(r"`(GET|POST|PUT|PATCH|DELETE) (/[^`?\s]*)", text)}
    missing = sorted(f"{m} /api/v1{p}" for m, p in served - documented)
    assert not missing, f"document these in docs/api.md: {missing}"
