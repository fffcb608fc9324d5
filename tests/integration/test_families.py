"""Refit families as objects of the API, and their stability as a job, in one process: the real
app through Litestar's TestClient, a real `JobService` on a real DuckDB file and a fake broker
that keeps what it was sent (as test_job_states.py). The worker's side is driven over HTTP, its
computation the worker's own (`service.worker.stability.stability_body`, which calls the same
`compute.refits.stability_of` as `strata stability`); real worker processes, the crash and beat
are in test_family_jobs.py.

What is checked: making, growing and shrinking a family and what is refused (4xx naming what to
fix, nothing stored); a stability job queued, claimed, heartbeating, delivered and served, one
job per configuration; a person's job before reconciliation's; reconciliation queueing a grown
family again, and following a member's new weights; cancellation storing nothing; the importance
join reading the anchor's heads run as soon as it lands."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compute.zoo.paths import zoo_path
from service.store import families
from service.worker.cache import ModelCache
from service.worker.stability import stability_body
from tests.integration.test_job_states import ARROW, V1, Jobs, open_jobs
from tests.serving import wait_for

# A small comparison: seconds on a CPU.
SETTINGS = {"n_prompts": 4, "prompt_len": 16, "n_null": 1, "cka_tokens": 32}


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    with open_jobs(tmp_path) as opened:
        for source in ("zoo:tiny-4l-s0", "zoo:tiny-4l-s1", "zoo:fam4l-adamw-s0"):
            answer = opened.http.post(f"{V1}/models", json={"source": source})
            assert answer.status_code == 201, answer.text
        yield opened


def refit_copy(tmp_path: Path, name: str, of: str = "tiny-4l-s1") -> str:
    """A third refit: a copy of a zoo checkpoint under another folder name."""
    target = tmp_path / name
    shutil.copytree(zoo_path(of), target)
    return str(target)


def work(jobs: Jobs, job: dict[str, Any], worker: str = "w1") -> Any:
    """Claim a job and do what a worker does with a stability configuration: compute it with
    progress sent as heartbeats, and deliver it."""
    claimed = jobs.claim(job["id"], job.get("dispatch", 0), worker=worker)
    assert claimed.status_code == 200, claimed.text
    config = claimed.json()["config"]
    assert config["kind"] == "stability"
    beats: list[tuple[int, int]] = []

    def progress(p: Any) -> None:
        beats.append((p.done, p.total))
        answer = jobs.heartbeat(job["id"], 0, worker, done=p.done, total=p.total,
                                tokens_per_s=p.tokens_per_s, elapsed_s=p.elapsed_s)
        assert answer.json()["stop"] is False

    from compute.models import load_model

    body, _ = stability_body(config, settings=jobs.service.settings, device="cpu",
                             cache=ModelCache(4, load_model), progress=progress)
    assert beats[-1][0] == beats[-1][1]
    assert len(beats) == beats[-1][1]
    return jobs.http.post(f"{V1}/runs/ingest", content=body, params={"job_id": job["id"]},
                          headers=ARROW)


def make(jobs: Jobs, **body: Any) -> Any:
    return jobs.http.post(f"{V1}/families", json={**SETTINGS, **body})


def stored_counts(jobs: Jobs) -> tuple[int, int]:
    return len(jobs.http.get(f"{V1}/families").json()), len(jobs.http.get(f"{V1}/models")
                                                             .json()["items"])


def test_bad_families_are_refused_with_what_to_fix_and_nothing_is_stored(jobs: Jobs) -> None:
    before = stored_counts(jobs)
    cases = [
        ({"name": "mixed", "members": ["tiny-4l-s0", "fam4l-adamw-s0"]}, 422,
         "not a refit of 'tiny-4l-s0''s architecture (d_model 128 vs 64)"),
        ({"name": "alone", "members": ["tiny-4l-s0"]}, 422, "at least two distinct members"),
        ({"name": "twice", "members": ["tiny-4l-s0", "tiny-4l-s0"]}, 422,
         "at least two distinct members"),
        ({"name": "ghost", "members": ["tiny-4l-s0", "no-such-model"]}, 422,
         "not registered: 'no-such-model'; register each member first"),
        ({"name": "adrift", "members": ["tiny-4l-s0", "tiny-4l-s1"], "anchor": "fam4l-adamw-s0"},
         422, "the anchor 'fam4l-adamw-s0' is not one of the members"),
        ({"name": "123", "members": ["tiny-4l-s0", "tiny-4l-s1"]}, 422, "not all digits"),
        ({"name": "x y", "members": ["tiny-4l-s0", "tiny-4l-s1"]}, 400, "name"),
        ({"name": "neg", "members": ["tiny-4l-s0", "tiny-4l-s1"], "n_null": -1}, 400, "n_null"),
        ({"name": "extra", "members": ["tiny-4l-s0", "tiny-4l-s1"], "colour": "red"}, 400,
         "colour"),
        # the zoo's tiny models have a 256-token context: prompts longer fail every job
        ({"name": "long", "members": ["tiny-4l-s0", "tiny-4l-s1"], "prompt_len": 1000}, 422,
         "exceeds the members' context"),
        # a member id beyond any BIGINT, and a digit that is not ASCII: unknown models, not 500s
        ({"name": "huge", "members": ["tiny-4l-s0", "9" * 40]}, 422, "not registered"),
        ({"name": "super", "members": ["tiny-4l-s0", "\u00b2"]}, 422, "not registered"),
    ]
    for body, status, words in cases:
        answer = make(jobs, **body)
        assert answer.status_code == status, (body, answer.text)
        assert words in answer.json()["detail"], (body, answer.json())
    no_key = jobs.http.post(f"{V1}/families", json={"name": "k", "members": ["a", "b"]},
                            headers={"X-API-Key": "wrong"})
    assert no_key.status_code == 401
    assert stored_counts(jobs) == before
    assert jobs.http.get(f"{V1}/families/mixed").status_code == 404
    assert jobs.broker.sent == []

    made = make(jobs, name="t4", members=["tiny-4l-s0", "tiny-4l-s1"])
    assert made.status_code == 201, made.text
    taken = make(jobs, name="t4", members=["tiny-4l-s0", "tiny-4l-s1"])
    assert taken.status_code == 409
    assert "exists already" in taken.json()["detail"]
    for answer, status, words in [
        (jobs.http.post(f"{V1}/families/t4/members", json={"members": ["fam4l-adamw-s0"]}),
         422, "not a refit"),
        (jobs.http.post(f"{V1}/families/t4/members", json={"members": ["nope"]}), 422,
         "not registered"),
        (jobs.http.post(f"{V1}/families/none/members", json={"members": ["tiny-4l-s1"]}), 404,
         "no refit family 'none' (known: t4)"),
        (jobs.http.delete(f"{V1}/families/t4/members/tiny-4l-s0"), 422, "is the anchor"),
        (jobs.http.delete(f"{V1}/families/t4/members/tiny-4l-s1"), 422, "has two members"),
        (jobs.http.delete(f"{V1}/families/t4/members/fam4l-adamw-s0"), 422, "not a member"),
        (jobs.http.post(f"{V1}/families/none/stability", json={}), 404, "no refit family"),
    ]:
        assert answer.status_code == status, answer.text
        assert words in answer.json()["detail"], answer.json()
    family = jobs.http.get(f"{V1}/families/t4").json()
    assert [m["name"] for m in family["members"]] == ["tiny-4l-s0", "tiny-4l-s1"]
    assert jobs.broker.sent == []


def test_a_family_is_made_grown_computed_as_a_job_and_served(jobs: Jobs, tmp_path: Path
                                                              ) -> None:
    made = make(jobs, name="t4", members=["tiny-4l-s0", "tiny-4l-s1"], anchor="tiny-4l-s0",
                description="two seeds")
    assert made.status_code == 201, made.text
    family = made.json()
    assert family["anchor"]["name"] == "tiny-4l-s0"
    assert family["settings"] == {**SETTINGS, "seed": 0}
    assert family["origin"] == "api"
    assert [(m["model"]["name"], m["anchor"], m["state"]) for m in family["member_states"]] == [
        ("tiny-4l-s0", True, "pending"), ("tiny-4l-s1", False, "pending")]
    assert family["stability_run_id"] is None
    assert family["job"] is None
    assert [f["name"] for f in jobs.http.get(f"{V1}/families").json()] == ["t4"]

    submitted = jobs.http.post(f"{V1}/families/t4/stability", json={})
    assert submitted.status_code == 202, submitted.text
    job = submitted.json()
    assert (job["state"], job["model"], job["families"]) == ("queued", "tiny-4l-s0",
                                                             ["stability"])
    assert job["config"]["refit_family"] == "t4"
    assert len(job["config"]["members"]) == 2
    assert jobs.broker.sent == [(job["id"], 0, "gpu")]  # a person's job: sent at once
    again = jobs.http.post(f"{V1}/families/t4/stability")
    assert again.status_code == 200
    assert again.json()["id"] == job["id"]

    delivered = work(jobs, job)
    assert delivered.status_code == 201, delivered.text
    done = jobs.job(job["id"])
    assert done["state"] == "succeeded"
    assert done["run_id"] == delivered.json()["run_id"]
    family = jobs.http.get(f"{V1}/families/t4").json()
    assert family["stability_run_id"] == done["run_id"]
    assert family["job"] == {"id": job["id"], "state": "succeeded", "reason": "api",
                             "run_id": done["run_id"]}
    assert {m["state"] for m in family["member_states"]} == {"current"}
    layers = jobs.http.get(f"{V1}/families/t4/stability",
                           params={"metric": "heads.stability"}).json()
    assert layers["run"]["id"] == done["run_id"]
    assert [r["layer"] for r in layers["rows"]] == [0, 1, 2, 3]
    assert all(0 < r["value"] <= 1 for r in layers["rows"])
    nulls = jobs.http.get(f"{V1}/families/t4/stability",
                          params={"metric": "heads.stability_null"}).json()["rows"]
    assert len(nulls) == 4
    heads = jobs.http.get(f"{V1}/families/t4/stability",
                          params={"metric": "heads.stability", "per_head": True}).json()["rows"]
    assert len([r for r in heads if r["head"] is not None]) == 4 * 4
    # the same configuration again: the succeeded job, nothing computed
    assert jobs.http.post(f"{V1}/families/t4/stability").json()["id"] == job["id"]

    # grow: a third refit, registered, then added
    third = jobs.http.post(f"{V1}/models", json={"source": refit_copy(tmp_path, "tiny-4l-s2")})
    assert third.status_code == 201, third.text
    grown = jobs.http.post(f"{V1}/families/t4/members",
                           json={"members": ["tiny-4l-s2", "tiny-4l-s1"]})
    assert grown.status_code == 200, grown.text
    states = {m["model"]["name"]: m["state"] for m in grown.json()["member_states"]}
    assert states == {"tiny-4l-s0": "current", "tiny-4l-s1": "current",
                      "tiny-4l-s2": "pending"}
    second = jobs.http.post(f"{V1}/families/t4/stability").json()
    assert second["id"] != job["id"]
    assert len(second["config"]["members"]) == 3
    assert work(jobs, second).status_code == 201
    family = jobs.http.get(f"{V1}/families/t4").json()
    assert {m["state"] for m in family["member_states"]} == {"current"}
    assert family["stability_run_id"] == jobs.job(second["id"])["run_id"]
    rows = jobs.http.get(f"{V1}/families/t4/stability",
                         params={"metric": "heads.stability", "per_head": True}).json()["rows"]
    assert {r["n"] for r in rows if r["head"] is not None} == {2}  # two refits now

    # shrink: the copy leaves; the family's configuration is the first one again: its job
    shrunk = jobs.http.delete(f"{V1}/families/t4/members/tiny-4l-s2")
    assert shrunk.status_code == 200, shrunk.text
    assert [m["name"] for m in shrunk.json()["members"]] == ["tiny-4l-s0", "tiny-4l-s1"]
    assert jobs.http.post(f"{V1}/families/t4/stability").json()["id"] == job["id"]


def test_a_cancelled_stability_job_stores_nothing(jobs: Jobs) -> None:
    assert make(jobs, name="t4", members=["tiny-4l-s0", "tiny-4l-s1"]).status_code == 201
    job = jobs.http.post(f"{V1}/families/t4/stability").json()
    claimed = jobs.claim(job["id"], 0)
    assert claimed.status_code == 200
    assert jobs.heartbeat(job["id"], 0, done=1, total=5).json()["stop"] is False
    assert jobs.job(job["id"])["progress"]["fraction"] == pytest.approx(0.2)
    assert jobs.http.delete(f"{V1}/jobs/{job['id']}").json()["state"] == "cancelled"
    assert jobs.heartbeat(job["id"], 0).json()["stop"] is True  # the worker is told to stop
    from compute.models import load_model

    body, _ = stability_body(claimed.json()["config"], settings=jobs.service.settings,
                             device="cpu", cache=ModelCache(2, load_model), progress=lambda p: None)
    late = jobs.http.post(f"{V1}/runs/ingest", content=body, params={"job_id": job["id"]},
                          headers=ARROW)
    assert late.status_code == 409, late.text
    assert jobs.runs() == []
    assert jobs.http.get(f"{V1}/families/t4").json()["stability_run_id"] is None


def test_reconciliation_queues_a_family_once_behind_people_and_again_when_it_grows(
        tmp_path: Path) -> None:
    with open_jobs(tmp_path, reconcile=True, reconcile_interval_s=3600,
                   family_settle_s=0) as jobs:
        jobs.worker_alive("cpu")
        for source in ("zoo:tiny-4l-s0", "zoo:tiny-4l-s1"):
            jobs.http.post(f"{V1}/models", json={"source": source})
        made = make(jobs, name="t4", members=["tiny-4l-s0", "tiny-4l-s1"])
        assert made.status_code == 201
        # serialised with the reconciliations the writes started in the background: after
        # it, everything is queued
        jobs.service.reconcile()
        listed = jobs.http.get(f"{V1}/jobs", params={"limit": 100}).json()["items"]
        stability = [j for j in listed if j["families"] == ["stability"]]
        assert len(stability) == 1
        assert stability[0]["reason"] == "reconcile"
        first = stability[0]
        assert first["config"]["refit_family"] == "t4"
        assert jobs.service.reconcile() == []  # once
        # a person's job submitted now is next in the broker, whatever the backlog
        backlog = len(jobs.broker.sent)
        person = jobs.submit("tiny-2l-s0", metrics=["norms"], n_sequences=1, seq_len=8).json()
        assert jobs.broker.sent[backlog][0] == person["id"]
        # grown: reconciliation queues the new configuration
        copy = jobs.http.post(f"{V1}/models",
                              json={"source": refit_copy(tmp_path, "tiny-4l-s2")})
        assert copy.status_code == 201
        assert jobs.http.post(f"{V1}/families/t4/members",
                              json={"members": ["tiny-4l-s2"]}).status_code == 200
        jobs.service.reconcile()
        latest = jobs.http.get(f"{V1}/families/t4").json()["job"]
        assert latest["id"] != first["id"]
        assert latest["reason"] == "reconcile"
        assert len(jobs.job(latest["id"])["config"]["members"]) == 3


def test_a_member_whose_weights_change_is_followed_and_recomputed(tmp_path: Path) -> None:
    import safetensors.torch as st

    with open_jobs(tmp_path, reconcile=True, reconcile_interval_s=3600,
                   family_settle_s=0) as jobs:
        folder = Path(refit_copy(tmp_path, "tiny-4l-s2"))
        for source in ("zoo:tiny-4l-s0", str(folder)):
            assert jobs.http.post(f"{V1}/models", json={"source": source}).status_code == 201
        assert make(jobs, name="t4", members=["tiny-4l-s0", "tiny-4l-s2"]).status_code == 201
        jobs.service.reconcile()
        before = jobs.http.get(f"{V1}/families/t4").json()
        # the checkpoint is retrained in place: new weights, and registered again (the watch
        # folder or `strata models add` does this), the same name
        weights = st.load_file(folder / "model.safetensors")
        first = sorted(weights)[0]
        weights[first] = weights[first] * 1.01
        st.save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
        again = jobs.http.post(f"{V1}/models", json={"source": str(folder)})
        assert again.status_code == 201, again.text
        new_id = again.json()["id"]
        jobs.service.reconcile()
        after = jobs.http.get(f"{V1}/families/t4").json()
        assert [m["id"] for m in after["members"]] == [before["members"][0]["id"], new_id]
        assert after["job"]["id"] != before["job"]["id"]
        revisions = {m["revision"] for m in jobs.job(after["job"]["id"])["config"]["members"]}
        assert len(revisions) == 2


def test_the_importance_join_reads_the_anchors_heads_run_once_it_lands(jobs: Jobs) -> None:
    assert make(jobs, name="t4", members=["tiny-4l-s0", "tiny-4l-s1"]).status_code == 201
    assert work(jobs, jobs.http.post(f"{V1}/families/t4/stability").json()).status_code == 201
    url = f"{V1}/families/t4/stability-importance"
    missing = jobs.http.get(url)
    assert missing.status_code == 404
    assert "no heads run" in missing.json()["detail"]
    heads = jobs.submit("tiny-4l-s0", metrics=["heads"], n_sequences=2, seq_len=16).json()
    config = jobs.claim(heads["id"], 0).json()["config"]
    assert jobs.deliver(heads["id"], config).status_code == 201
    joined = jobs.http.get(url)
    assert joined.status_code == 200, joined.text
    assert joined.json()["importance_run"]["id"] == jobs.job(heads["id"])["run_id"]
    assert [r["layer"] for r in joined.json()["rows"]] == [0, 1, 2, 3]


def family_jobs(jobs: Jobs, family: str) -> list[dict[str, Any]]:
    """The family's stability jobs, newest first."""
    listed = jobs.http.get(f"{V1}/jobs", params={"limit": 100}).json()["items"]
    return [j for j in listed if j["config"].get("refit_family") == family]


def member_names(job: dict[str, Any], jobs: Jobs) -> list[str]:
    names = {m["spec"]["name"]: m["name"]
             for m in jobs.http.get(f"{V1}/models", params={"limit": 100}).json()["items"]}
    return sorted(names.get(m["name"], m["name"]) for m in job["config"]["members"])


def test_an_edit_landing_while_a_reconciliation_plans_queues_nothing_for_the_old_members(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race behind a job for members a family no longer had (seen once in the suite): a
    reconciliation read the family and planned its job just before an edit landed. It queues
    nothing for the members before the edit; the next reconciliation queues the members after
    it."""
    with open_jobs(tmp_path, family_settle_s=0) as jobs:
        jobs.worker_alive("cpu")
        for source in ("zoo:tiny-4l-s0", "zoo:tiny-4l-s1",
                       refit_copy(tmp_path, "tiny-4l-s2")):
            assert jobs.http.post(f"{V1}/models", json={"source": source}).status_code == 201
        assert make(jobs, name="t4", members=["tiny-4l-s0", "tiny-4l-s1"]).status_code == 201
        owner = jobs.service.families
        plan = owner.plan

        def plan_then_edit(name: str) -> Any:
            planned = plan(name)
            monkeypatch.setattr(owner, "plan", plan)  # once
            families.add_members(jobs.store, name, ["tiny-4l-s2"])  # lands now
            return planned

        monkeypatch.setattr(owner, "plan", plan_then_edit)
        # the families' part of a reconciliation (JobService.reconcile's, with reconciling on)
        owner.reconcile("reconcile")
        assert [j["state"] for j in family_jobs(jobs, "t4")] == []
        owner.reconcile("reconcile")
        [job] = family_jobs(jobs, "t4")
        assert job["state"] == "queued"
        assert member_names(job, jobs) == ["tiny-4l-s0", "tiny-4l-s1", "tiny-4l-s2"]


def test_edits_coalesce_into_one_job_per_settled_membership_and_supersede_queued_ones(
        tmp_path: Path) -> None:
    """create -> add -> remove in a row queue nothing while the family is being edited, and one
    stability job, for the members it is left with, once it has settled (the reconciliation
    each edit schedules for the end of the window queues it). A job no worker has started is
    cancelled at once when the members change; a running one finishes; a family that returns
    to an earlier membership is queued for it again."""
    with open_jobs(tmp_path, reconcile=True, reconcile_interval_s=3600,
                   family_settle_s=3) as jobs:
        jobs.worker_alive("cpu")
        for source in ("zoo:tiny-4l-s0", "zoo:tiny-4l-s1",
                       refit_copy(tmp_path, "tiny-4l-s2")):
            assert jobs.http.post(f"{V1}/models", json={"source": source}).status_code == 201
        assert make(jobs, name="t4", members=["tiny-4l-s0", "tiny-4l-s1"]).status_code == 201
        assert jobs.http.post(f"{V1}/families/t4/members",
                              json={"members": ["tiny-4l-s2"]}).status_code == 200
        assert jobs.http.delete(f"{V1}/families/t4/members/tiny-4l-s1").status_code == 200
        jobs.service.reconcile()  # within the window: nothing for the family yet
        assert family_jobs(jobs, "t4") == []

        def queued() -> list[dict[str, Any]]:
            return [j for j in family_jobs(jobs, "t4") if j["state"] == "queued"]

        [first] = wait_for("the settled family's stability job", queued, timeout=60)
        assert first["reason"] == "reconcile"
        assert member_names(first, jobs) == ["tiny-4l-s0", "tiny-4l-s2"]

        # grown again: the queued job is cancelled at once, a new one queued once settled
        assert jobs.http.post(f"{V1}/families/t4/members",
                              json={"members": ["tiny-4l-s1"]}).status_code == 200
        cancelled = jobs.job(first["id"])
        assert cancelled["state"] == "cancelled"
        assert "superseded" in cancelled["error"]
        [second] = wait_for("the grown family's job", queued, timeout=60)
        assert member_names(second, jobs) == ["tiny-4l-s0", "tiny-4l-s1", "tiny-4l-s2"]

        # claimed by a worker: running, so it stays when the members change again; the
        # first membership, back again, is queued again
        assert jobs.claim(second["id"], 0).status_code == 200
        assert jobs.http.delete(f"{V1}/families/t4/members/tiny-4l-s1").status_code == 200
        [third] = wait_for("the shrunk family's job", queued, timeout=60)
        assert third["config_hash"] == first["config_hash"]
        assert jobs.job(second["id"])["state"] == "running"
        jobs.service.reconcile()
        assert [(j["id"], j["state"]) for j in family_jobs(jobs, "t4")] == [
            (third["id"], "queued"), (second["id"], "running"), (first["id"], "cancelled")]
