"""The job system's state transitions, in one process: the real app (`create_app`) through
Litestar's TestClient, a real `JobService` on a real DuckDB file, and a fake broker that keeps
what it was sent. The worker's side of the protocol (claim, heartbeat, fail, deliver) is driven
by the test over HTTP, with results computed here by `compute_run` exactly as a worker computes
them; the real worker processes and brokers are in test_jobs.py.

What is checked: submission and its refusals (nothing queued), one job per configuration and
`force`, claims and stale dispatches, device refusal, cancellation of queued and running jobs,
failure, delivery, lost leases and redispatch, reconciliation (metric-version bumps, racing
requests), and a broker that refuses (503, nothing kept)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from compute.run import METRIC_VERSION, RunConfig, compute_run
from service.api.app import create_app
from service.jobs.board import Board
from service.jobs.errors import BrokerUnavailableError
from service.jobs.service import JobService
from service.settings import Settings
from service.store import Store
from service.store.migrate import upgrade
from tests.integration.api_server import arrow_body
from tests.integration.synthetic import old_version_body
from tests.serving import wait_for

KEY = "states-key"
V1 = "/api/v1"
ARROW = {"Content-Type": "application/vnd.apache.arrow.stream"}
SMALL = {"metrics": ["intervention", "logit_lens"], "n_sequences": 2, "seq_len": 16}


@dataclass
class FakeBroker:
    """The `Broker` protocol, recording each message; `down` makes it refuse as Celery's would
    when the broker cannot be reached."""

    sent: list[tuple[int, int, str]] = field(default_factory=list)
    down: bool = False

    def send(self, job_id: int, dispatch: int, queue: str = "gpu") -> None:
        if self.down:
            raise BrokerUnavailableError("the job broker cannot be reached (fake); nothing was "
                                         "queued")
        self.sent.append((job_id, dispatch, queue))


@dataclass
class Jobs:
    http: TestClient[Any]
    broker: FakeBroker
    service: JobService
    store: Store

    def submit(self, model: str = "tiny-2l-s0", **fields: Any) -> Any:
        return self.http.post(f"{V1}/jobs", json={"model": model, **fields})

    def job(self, job_id: int) -> dict[str, Any]:
        answer = self.http.get(f"{V1}/jobs/{job_id}")
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def claim(self, job_id: int, dispatch: int, device: str = "cpu", worker: str = "w1") -> Any:
        return self.http.post(f"{V1}/jobs/{job_id}/claim",
                              json={"dispatch": dispatch, "worker": worker, "device": device})

    def heartbeat(self, job_id: int, dispatch: int, worker: str = "w1", **progress: Any) -> Any:
        return self.http.post(f"{V1}/jobs/{job_id}/heartbeat",
                              json={"dispatch": dispatch, "worker": worker, **progress})

    def deliver(self, job_id: int, config: dict[str, Any]) -> Any:
        """Compute the claimed configuration as a worker does, and deliver it."""
        result = compute_run(RunConfig.model_validate(config))
        return self.http.post(f"{V1}/runs/ingest", content=arrow_body(result),
                              params={"job_id": job_id}, headers=ARROW)

    def worker_alive(self, device: str = "cpu", queues: tuple[str, ...] = ("gpu",)) -> None:
        answer = self.http.post(f"{V1}/workers/heartbeat", json={
            "name": "w1", "device": device, "dtype": "float32", "queues": list(queues),
            "host": "here", "pid": 1})
        assert answer.status_code in (200, 201, 204), answer.text

    def runs(self) -> list[dict[str, Any]]:
        return list(self.http.get(f"{V1}/runs", params={"limit": 500}).json()["items"])


@contextlib.contextmanager
def open_jobs(tmp_path: Path, *, lease_s: float = 30.0, **jobs_settings: Any
              ) -> Iterator[Jobs]:
    db = tmp_path / "jobs.duckdb"
    with Store.open(db, threads=1) as store:
        upgrade(store)
        settings = Settings(database=db, api_keys=KEY, data_dir=tmp_path / "state",
                            jobs={"lease_s": lease_s, "reconcile": False, "register_zoo": False,
                                  **jobs_settings})  # type: ignore[arg-type]
        broker = FakeBroker()
        service = JobService(store, settings, broker, Board(lease_s))
        with TestClient(create_app(settings, store, jobs=service)) as http:
            http.headers["X-API-Key"] = KEY
            jobs = Jobs(http, broker, service, store)
            registered = http.post(f"{V1}/models", json={"source": "zoo:tiny-2l-s0"})
            assert registered.status_code == 201, registered.text
            yield jobs
        service.stop()


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    with open_jobs(tmp_path) as opened:
        yield opened


def test_a_job_goes_queued_running_succeeded_and_is_one_per_configuration(jobs: Jobs) -> None:
    submitted = jobs.submit(**SMALL)
    assert submitted.status_code == 202, submitted.text
    job = submitted.json()
    assert (job["state"], job["run_id"], job["attempts"]) == ("queued", None, 0)
    assert jobs.broker.sent == [(job["id"], 0, "gpu")]
    claimed = jobs.claim(job["id"], 0)
    assert claimed.status_code == 200, claimed.text
    running = jobs.job(job["id"])
    assert (running["state"], running["worker"], running["attempts"]) == ("running", "w1", 1)
    assert jobs.heartbeat(job["id"], 0, done=1, total=4, tokens_per_s=10.0,
                          elapsed_s=1.0).json()["stop"] is False
    assert jobs.job(job["id"])["progress"]["fraction"] == pytest.approx(0.25)
    delivered = jobs.deliver(job["id"], claimed.json()["config"])
    assert delivered.status_code == 201, delivered.text
    done = jobs.job(job["id"])
    assert done["state"] == "succeeded"
    assert done["run_id"] == delivered.json()["run_id"]
    assert [r["id"] for r in jobs.runs()] == [done["run_id"]]
    # the same configuration again is the same job; nothing is sent
    again = jobs.submit(**SMALL)
    assert again.status_code == 200
    assert again.json()["id"] == job["id"]
    assert len(jobs.broker.sent) == 1
    # force: a new job, whose delivery replaces the run (still one run)
    forced = jobs.submit(**SMALL, force=True)
    assert forced.status_code == 202
    second = forced.json()
    assert second["forced"]
    assert jobs.broker.sent[-1] == (second["id"], 0, "gpu")
    config = jobs.claim(second["id"], 0).json()["config"]
    replaced = jobs.deliver(second["id"], config)
    assert replaced.status_code == 200, replaced.text  # 200: an existing run was replaced
    assert replaced.json()["replaced"] is True
    assert jobs.job(second["id"])["state"] == "succeeded"
    assert [r["id"] for r in jobs.runs()] == [replaced.json()["run_id"]]
    # a message for a finished job is stale: the worker is told not to start it
    stale = jobs.claim(job["id"], 0)
    assert stale.status_code == 409
    assert "stale" in stale.json()["detail"]


def test_bad_submissions_are_refused_before_anything_is_queued(jobs: Jobs) -> None:
    jobs.worker_alive("cpu")
    cases = [
        ({"model": "no-such-model"}, 422, "unknown model"),
        ({"model": "tiny-2l-s0", "metrics": ["intervention", "vibes"]}, 422, "vibes"),
        ({"model": "tiny-2l-s0", "seq_len": 4096}, 422, "context"),
        ({"model": "tiny-2l-s0", "device": "cuda"}, 422, "no worker has device 'cuda'"),
        ({"model": "tiny-2l-s0", "dtype": "int8"}, 422, "dtype"),
        ({"model": "tiny-2l-s0", "tokens": "corpus:/etc"}, 422, "configured root"),
        ({"model": "tiny-2l-s0", "tokens": "source:999"}, 422, "no stored token source"),
        ({"model": "tiny-2l-s0", "queue": "tiny-gpu"}, 422, "no worker consumes queue"),
        ({"model": "tiny-2l-s0", "n_sequences": 0}, 400, "n_sequences"),
        ({"model": "tiny-2l-s0", "colour": "red"}, 400, "colour"),
    ]
    for body, status, words in cases:
        answer = jobs.http.post(f"{V1}/jobs", json=body)
        assert answer.status_code == status, (body, answer.text)
        assert words in answer.json()["detail"], (body, answer.json())
    assert jobs.http.post(f"{V1}/jobs", json={"model": "tiny-2l-s0"},
                          headers={"X-API-Key": "wrong"}).status_code == 401
    assert jobs.http.get(f"{V1}/jobs/424242").status_code == 404
    assert jobs.http.delete(f"{V1}/jobs/424242").status_code == 404
    assert jobs.http.get(f"{V1}/jobs", params={"state": "sleeping"}).status_code == 422
    assert jobs.http.get(f"{V1}/jobs").json()["total"] == 0
    assert jobs.broker.sent == []


def test_more_sequences_than_the_text_yields_are_refused_naming_the_true_number(
        jobs: Jobs, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request beyond what the token source yields is a 422 at submission naming how many
    it yields (it used to be accepted and fail in the worker); that number is the true limit:
    asking for exactly it is accepted, and the worker's tokens for it load."""
    import re

    from compute.models import load_model
    from compute.tokens import load_tokens

    jobs.worker_alive("cpu")
    refused = jobs.submit(metrics=["norms"], n_sequences=1_000_000, seq_len=128)
    assert refused.status_code == 422, refused.text
    detail = refused.json()["detail"]
    found = re.search(r"the text yields only (\d+) sequences of seq_len=128", detail)
    assert found, detail
    yields = int(found.group(1))
    assert "1000000 were requested" in detail
    assert jobs.broker.sent == []
    assert jobs.submit(metrics=["norms"], n_sequences=yields + 1,
                       seq_len=128).status_code == 422
    accepted = jobs.submit(metrics=["norms"], n_sequences=yields, seq_len=128)
    assert accepted.status_code == 202, accepted.text
    config = RunConfig.model_validate(jobs.claim(accepted.json()["id"], 0).json()["config"])
    lm = load_model(config.model, "cpu")
    tokens = load_tokens(config.tokens, lm.tokenizer, bos_token_id=lm.bos_token_id,
                         d_vocab=lm.d_vocab, n_ctx=lm.n_ctx)
    assert tokens.shape == (yields, 128)
    # a request that plainly fits is accepted without tokenizing the text
    import compute.tokens

    def tokenized(*_: Any) -> None:
        raise AssertionError("the text was tokenized for a request that plainly fits")

    monkeypatch.setattr(compute.tokens, "tokenized_stream", tokenized)
    assert jobs.submit(metrics=["norms"], n_sequences=4, seq_len=16).status_code == 202


def test_tuned_lens_settings_and_a_stored_lens_are_checked_at_submission(jobs: Jobs,
                                                                         tmp_path: Path) -> None:
    """What would otherwise fail only in the worker is a 422 naming what to fix: settings
    without the family, an unknown lens key, a lens of another model, a token source with no
    training split; bounds are the schema's (400). Good settings reach the run's identity."""
    from compute.lens.store import LensStore
    from compute.lens.translators import BASIS_STRATA, LensInfo, TunedLens
    from compute.models import resolve_model_spec

    jobs.worker_alive("cpu")
    spec = resolve_model_spec("zoo:tiny-2l-s0")
    key = "0123456789abcdef"
    model = jobs.http.get(f"{V1}/models/tiny-2l-s0").json()
    info = LensInfo(key=key, n_layers=model["n_layers"], d_model=model["d_model"],
                    basis=BASIS_STRATA, model=spec.model_dump(mode="json"))
    LensStore(tmp_path / "state" / "lenses").put(TunedLens.identity(info))
    assert jobs.http.post(f"{V1}/models", json={"source": "zoo:tiny-4l-s0"}).status_code == 201
    tuned = {"metrics": ["logit_lens", "tuned_lens"], "n_sequences": 2, "seq_len": 16}
    cases = [
        ({**SMALL, "tuned_lens": {"steps": 5}}, 422, "does not compute the tuned_lens family"),
        ({**tuned, "tuned_lens": {"lens": "ffffffffffffffff"}}, 422, "no stored lens"),
        ({**tuned, "tuned_lens": {"lens": "../etc/passwd"}}, 422, "is not a lens key"),
        ({**tuned, "model": "tiny-4l-s0", "tuned_lens": {"lens": key}}, 422,
         "made for model tiny-2l-s0"),
        ({**tuned, "tokens": "pile"}, 422, "no training split"),
        ({**tuned, "tuned_lens": {"steps": 0}}, 400, "steps"),
        ({**tuned, "tuned_lens": {"colour": 1}}, 400, "colour"),
    ]
    for body, status, words in cases:
        answer = jobs.http.post(f"{V1}/jobs", json={"model": "tiny-2l-s0", **body})
        assert answer.status_code == status, (body, answer.text)
        assert words in answer.json()["detail"], (body, answer.json())
    assert jobs.broker.sent == []
    stored = jobs.submit(**tuned, tuned_lens={"lens": key})
    assert stored.status_code == 202, stored.text
    assert stored.json()["config"]["options"]["tuned_lens"]["lens"] == key
    trained = jobs.submit(**tuned, tuned_lens={"steps": 5, "train_sequences": 16})
    assert trained.status_code == 202, trained.text
    options = trained.json()["config"]["options"]["tuned_lens"]
    assert (options["steps"], options["train_sequences"], options["lens"]) == (5, 16, None)
    default = jobs.submit(**tuned)
    assert default.status_code == 202, default.text
    assert default.json()["config"]["options"]["tuned_lens"]["steps"] == 250
    assert len({stored.json()["config_hash"], trained.json()["config_hash"],
                default.json()["config_hash"]}) == 3


def test_cancel_a_queued_and_a_running_job(jobs: Jobs) -> None:
    queued = jobs.submit(**SMALL).json()
    cancelled = jobs.http.delete(f"{V1}/jobs/{queued['id']}")
    assert cancelled.status_code == 200
    assert cancelled.json()["state"] == "cancelled"
    again = jobs.http.delete(f"{V1}/jobs/{queued['id']}")
    assert again.status_code == 409
    assert "cancelled" in again.json()["detail"]
    assert jobs.claim(queued["id"], 0).status_code == 409  # its message arrives: not started

    running = jobs.submit(**{**SMALL, "n_sequences": 3}).json()
    config = jobs.claim(running["id"], 0).json()["config"]
    assert jobs.http.delete(f"{V1}/jobs/{running['id']}").json()["state"] == "cancelled"
    assert jobs.heartbeat(running["id"], 0).json()["stop"] is True  # the worker stops
    refused = jobs.deliver(running["id"], config)  # or delivers anyway: refused, not stored
    assert refused.status_code == 409, refused.text
    assert jobs.runs() == []
    # the same configuration can be submitted again: a new job
    resubmitted = jobs.submit(**SMALL)
    assert resubmitted.status_code == 202
    assert resubmitted.json()["id"] != queued["id"]


def test_a_job_for_a_device_the_worker_lacks_fails_plainly(jobs: Jobs) -> None:
    # No worker has spoken, so the API cannot know the devices: the job is queued ...
    job = jobs.submit(**SMALL, device="cuda")
    assert job.status_code == 202, job.text
    # ... and the CPU worker that takes it is refused, and the job fails saying why
    refused = jobs.claim(job.json()["id"], 0, device="cpu")
    assert refused.status_code == 409
    failed = jobs.job(job.json()["id"])
    assert failed["state"] == "failed"
    assert "'cuda'" in failed["error"]
    assert "'cpu'" in failed["error"]
    assert jobs.runs() == []


def test_a_failed_job_keeps_its_reason_and_stores_nothing(jobs: Jobs) -> None:
    job = jobs.submit(**SMALL).json()
    assert jobs.claim(job["id"], 0).status_code == 200
    failed = jobs.http.post(f"{V1}/jobs/{job['id']}/fail", json={
        "dispatch": 0, "worker": "w1", "error": "ComputeError: non-finite logits at layer 1"})
    assert failed.status_code == 200, failed.text
    view = jobs.job(job["id"])
    assert view["state"] == "failed"
    assert "non-finite" in view["error"]
    assert jobs.runs() == []
    # a new submission of the same configuration is a new job (a failure is not a result)
    again = jobs.submit(**SMALL)
    assert again.status_code == 202
    assert again.json()["id"] != job["id"]


def test_a_lost_lease_redispatches_and_the_stale_worker_is_refused(tmp_path: Path) -> None:
    with open_jobs(tmp_path, lease_s=0.3) as jobs:
        job = jobs.submit(**SMALL).json()
        config = jobs.claim(job["id"], 0).json()["config"]
        time.sleep(0.5)  # no heartbeat: the lease runs out
        assert jobs.service.requeue_lost() == [job["id"]]
        requeued = jobs.job(job["id"])
        assert requeued["state"] == "queued"
        assert jobs.broker.sent[-1] == (job["id"], 1, "gpu")
        # the first worker, still alive after all, hears it should stop; its dispatch is stale
        assert jobs.heartbeat(job["id"], 0).json()["stop"] is True
        assert jobs.claim(job["id"], 0).status_code == 409
        # the new dispatch runs and delivers, once
        assert jobs.claim(job["id"], 1, worker="w2").status_code == 200
        assert jobs.deliver(job["id"], config).status_code == 201
        done = jobs.job(job["id"])
        assert (done["state"], done["attempts"], done["worker"]) == ("succeeded", 2, "w2")
        assert len(jobs.runs()) == 1


def test_a_broker_that_refuses_gets_a_503_and_nothing_is_kept(jobs: Jobs) -> None:
    jobs.broker.down = True
    refused = jobs.submit(**SMALL)
    assert refused.status_code == 503, refused.text
    assert "broker" in refused.json()["detail"]
    assert jobs.http.get(f"{V1}/jobs").json()["total"] == 0
    jobs.broker.down = False
    accepted = jobs.submit(**SMALL)
    assert accepted.status_code == 202
    assert jobs.http.get(f"{V1}/jobs").json()["total"] == 1


def test_token_level_runs_of_version_1_are_recomputed_under_version_2(tmp_path: Path) -> None:
    """After the bump to metric version 2 (errors over sequences), a model whose default run
    exists only under version 1 gets it queued again; the old run stays, labelled "token"."""
    assert METRIC_VERSION == "2"
    with open_jobs(tmp_path, reconcile=True, reconcile_interval_s=3600) as jobs:
        stored = jobs.http.post(f"{V1}/runs/ingest", content=old_version_body("1"),
                                headers=ARROW)
        assert stored.status_code == 201, stored.text
        old = jobs.http.get(f"{V1}/runs/{stored.json()['run_id']}").json()
        assert (old["metric_version"], old["stderr_basis"]) == ("1", "token")
        queued = [j for j in jobs.http.post(f"{V1}/jobs/reconcile").json()["queued"]
                  if jobs.job(j)["model"] == "tiny-4l-s0"]
        assert len(queued) == 1, [jobs.job(j) for j in queued]
        job = jobs.job(queued[0])
        assert job["metric_version"] == "2"
        assert job["reason"] == "reconcile"
        assert jobs.http.post(f"{V1}/jobs/reconcile").json()["queued"] == []  # once


def test_reconciliation_queues_the_cheapest_model_first(tmp_path: Path) -> None:
    """Models registered largest first (into the store, as a first start registers the zoo)
    are queued by one reconciliation smallest first: held jobs go out oldest first, so the
    cheapest model's results come first."""
    from service.store.registration import Registration, register

    with open_jobs(tmp_path, reconcile=True, reconcile_interval_s=3600) as jobs:
        # tiny-2l-s0's registration queued its default run in the background: wait for it,
        # so that the reconciliation below is the one that queues the three models
        wait_for("tiny-2l-s0's background reconciliation", lambda: [
            j for j in jobs.http.get(f"{V1}/jobs").json()["items"]
            if j["model"] == "tiny-2l-s0"], timeout=30)
        for source in ("zoo:demo-4l", "zoo:planted-stages", "zoo:tiny-4l-s0"):
            register(jobs.store, Registration(source), checkpoint_roots=[],
                     load_max_mb=1024)
        queued = jobs.service.reconcile()
        models = {m["name"]: m for m in jobs.http.get(f"{V1}/models").json()["items"]}
        order = [jobs.job(j)["model"] for j in sorted(queued)]
        assert sorted(order) == ["demo-4l", "planted-stages", "tiny-4l-s0"]
        cost = [models[m]["n_params"] * models[m]["n_layers"] for m in order]
        assert cost == sorted(cost), list(zip(order, cost, strict=True))
        assert len(set(cost)) == 3  # three different sizes: the order is the rule's


def test_racing_reconciliations_queue_each_model_once(tmp_path: Path) -> None:
    with open_jobs(tmp_path, reconcile=True, reconcile_interval_s=3600) as jobs:
        stored = jobs.http.post(f"{V1}/runs/ingest", content=old_version_body("0"),
                                headers=ARROW)
        assert stored.status_code == 201, stored.text
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: jobs.http.post(f"{V1}/jobs/reconcile"),
                                    range(8)))
        assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
        queued = [j for a in answers for j in a.json()["queued"]]
        assert len(queued) == len(set(queued))
        # one job for each model without a current default run, whoever asked first (the
        # ingest's own background reconciliation among them)
        listed = jobs.http.get(f"{V1}/jobs", params={"limit": 100}).json()["items"]
        assert set(queued) <= {j["id"] for j in listed}
        models = sorted(j["model"] for j in listed)
        assert models == ["tiny-2l-s0", "tiny-4l-s0"]
        assert all(j["reason"] == "reconcile" for j in listed)
        assert jobs.http.post(f"{V1}/jobs/reconcile").json()["queued"] == []
