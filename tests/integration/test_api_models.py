"""/models and /runs over real HTTP: listing, filters, pagination, lookup, registration (a
write: API key), and the runs' status, configuration and timings."""

from __future__ import annotations

from typing import Any

from tests.integration.api_server import KEY, OTHER_KEY, V1, Api


def register(api: Api, body: dict[str, Any], key: str | None = KEY) -> Any:
    headers = {"X-API-Key": key} if key else {}
    return api.post(f"{V1}/models", json=body, headers=headers)


def test_list_filter_and_paginate(server: Api) -> None:
    every = server.get(f"{V1}/models", params={"limit": 500}).json()
    names = [m["name"] for m in every["items"]]
    assert names == sorted(names)
    assert {"rand-3l", "tiny-2l-s0", "stagey", "line-12", "line-24", "tiny-4l-s0"} <= set(names)
    page = server.get(f"{V1}/models", params={"limit": 2, "offset": 1}).json()
    assert [m["name"] for m in page["items"]] == names[1:3]
    assert page["total"] == every["total"]
    assert page["next_offset"] == 3
    deep = server.get(f"{V1}/models", params={"min_layers": 12}).json()
    assert [m["name"] for m in deep["items"]] == ["line-12", "line-24"]
    shallow = server.get(f"{V1}/models", params={"max_layers": 2, "source": "zoo"}).json()
    assert [m["name"] for m in shallow["items"]] == ["tiny-2l-s0"]
    zoo = server.get(f"{V1}/models", params={"architecture": "gpt2lmheadmodel"}).json()
    assert {m["name"] for m in zoo["items"]} >= {"tiny-2l-s0", "tiny-4l-s0"}
    assert server.get(f"{V1}/models", params={"limit": 0}).status_code == 400
    assert server.get(f"{V1}/models", params={"limit": 501}).status_code == 400
    assert server.get(f"{V1}/models", params={"family": "nope"}).json()["total"] == 0
    # each model says which run the data endpoints read for each family; the same as one model
    listed = {m["name"]: m["current_runs"] for m in every["items"]}
    assert listed["tiny-2l-s0"] == server.get(f"{V1}/models/tiny-2l-s0").json()["current_runs"]
    assert set(listed["tiny-2l-s0"].values()) == {server.runs["tiny-2l-s0"]}
    assert list(every["items"][0])[-2:] == ["current_runs", "current_run_basis"]
    # no model here has a default run (reconciliation is off): each reads its latest, and says so
    assert set(every["items"][0]["current_run_basis"].values()) <= {"latest"}


def test_current_runs_are_the_runs_data_answers_read(server: Api) -> None:
    """`current_runs` names, for every family, the run a data answer reads without `run_id`."""
    model = server.get(f"{V1}/models/tiny-2l-s0").json()
    examples = {"intervention": "intervention.kl", "logit_lens": "logit_lens.kl_to_final",
                "attention": "attention.bos"}
    checked = 0
    for family, run_id in model["current_runs"].items():
        if family in examples:
            metrics = server.get(f"{V1}/models/tiny-2l-s0/metrics",
                                 params={"metric": examples[family]}).json()
            assert metrics["run"]["id"] == run_id
            checked += 1
    assert checked


def test_one_model(server: Api) -> None:
    model = server.get(f"{V1}/models/tiny-2l-s0").json()
    assert model["n_layers"] == 2
    assert model["source"] == "zoo"
    assert model["processing"]["fold_ln"] is True
    assert model["n_runs"] == 1
    assert model["current_run_id"] == server.runs["tiny-2l-s0"]
    run = server.get(f"{V1}/runs/{server.runs['tiny-2l-s0']}").json()
    assert model["current_runs"] == {f: run["id"] for f in run["families"]}
    assert list(model)[-7:] == ["current_runs", "current_run_basis", "n_runs", "current_run_id",
                                "same_name_ids", "default_run_id", "pinned"]
    assert model["registered_at"].endswith("Z") or model["registered_at"].endswith("+00:00")
    missing = server.get(f"{V1}/models/tiny-2l-s1")
    assert missing.status_code == 404
    body = missing.json()
    assert set(body) == {"error", "detail", "status"}
    assert body["status"] == 404
    assert "did you mean" in body["detail"]
    assert "tiny-2l-s0" in body["detail"]
    assert server.get(f"{V1}/models/999999").status_code == 404


def test_registration_needs_a_valid_key(server: Api) -> None:
    body = {"name": "gpt2-small", "source": "gpt2"}
    nokey = register(server, body, key=None)
    assert nokey.status_code == 401
    assert nokey.headers["www-authenticate"].startswith("ApiKey")
    assert register(server, body, key="wrong").status_code == 401
    assert register(server, body, key=KEY[:-1]).status_code == 401
    bearer = server.post(f"{V1}/models", json=body,
                         headers={"Authorization": f"Bearer {OTHER_KEY}"})
    assert bearer.status_code == 201, bearer.text


def test_register_official_names_offline(server: Api) -> None:
    gpt2 = server.get(f"{V1}/models/gpt2-small")
    if gpt2.status_code == 404:  # when this test runs alone
        assert register(server, {"name": "gpt2-small", "source": "gpt2"}).status_code == 201
        gpt2 = server.get(f"{V1}/models/gpt2-small")
    model = gpt2.json()
    assert model["source"] == "transformer_lens"
    assert model["spec"]["name"] == "gpt2"
    assert model["n_params"] is None  # nothing downloaded: numbers stay unknown
    again = register(server, {"name": "gpt2-small", "source": "gpt2"})
    assert again.status_code == 200
    assert again.json()["id"] == model["id"]
    renamed = register(server, {"name": "gpt2-other", "source": "gpt2"})
    assert renamed.status_code == 409
    assert "gpt2-small" in renamed.json()["detail"]
    raw = register(server, {"name": "gpt2-small", "source": "gpt2",
                            "processing": {"fold_ln": False}})
    assert raw.status_code == 201  # other processing: another registration of the name
    llama = register(server, {"name": "llama2-7b", "source": "meta-llama/Llama-2-7b-hf"})
    assert llama.status_code == 201, llama.text
    # TransformerLens 4 keeps no built-in configs: the numbers come from a cached Hugging Face
    # config or stay unknown until the model is loaded
    assert llama.json()["n_layers"] is None
    unknown = register(server, {"name": "nope", "source": "someone/not-a-model"})
    assert unknown.status_code == 422
    assert "unknown model" in unknown.json()["detail"]


def test_register_checkpoints_only_under_a_root(server: Api) -> None:
    inside = register(server, {"name": "mini", "source": str(server.tmp / "checkpoints/mini")})
    assert inside.status_code == 201, inside.text
    model = inside.json()
    assert model["source"] == "hf_dir"
    assert model["n_layers"] == 2
    assert model["n_params"] > 0
    assert model["processing"]["fold_ln"] is True
    assert model["revision"].startswith("sha256:")
    escape = str(server.tmp / "checkpoints/mini/../../checkpoints/../")
    outside = register(server, {"name": "escape", "source": escape})
    assert outside.status_code == 422
    zoo_dir = register(server, {"name": "zoo-by-path",
                                "source": str(server.tmp / "checkpoints" / ".." / "..")})
    assert zoo_dir.status_code == 422


def test_a_missing_checkpoint_is_named_as_missing_only_under_a_root(server: Api) -> None:
    absent = str(server.tmp / "checkpoints" / "absent")
    missing = register(server, {"name": "absent", "source": absent})
    assert missing.status_code == 422
    assert missing.json()["detail"] == (
        f"unknown model {absent!r}: no such file or directory: {absent}")
    # outside the roots, whether a path exists is not told: both are refused for the root
    for outside in (str(server.tmp / "nowhere"), str(server.tmp)):
        refused = register(server, {"name": "outside", "source": outside})
        assert refused.status_code == 422
        assert "STRATA_API__CHECKPOINT_ROOTS" in refused.json()["detail"]
    zoo = register(server, {"name": "tiny-4l", "source": "zoo:tiny-4l-s0"})
    assert zoo.status_code == 409  # registered by the stability run as tiny-4l-s0


def test_a_checkpoint_registered_without_a_name_is_named_after_its_folder(server: Api) -> None:
    import shutil

    folder = server.tmp / "checkpoints" / "second copy"
    shutil.copytree(server.tmp / "checkpoints" / "mini", folder)
    answer = register(server, {"source": str(folder)})
    assert answer.status_code == 201, answer.text
    assert answer.json()["name"] == "second-copy"  # usable in a URL, unlike its path
    assert server.get(f"{V1}/models/second-copy").json()["source"] == "hf_dir"


def test_registration_body_is_checked(server: Api) -> None:
    for body in ({"name": "123", "source": "gpt2"}, {"name": "a/b", "source": "gpt2"},
                 {"name": "", "source": "gpt2"}, {"name": None, "source": 7},
                 {"name": "x", "source": "gpt2", "extra": 1}, {"name": "x", "source": ""}):
        response = register(server, body)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["status"] == 400
    not_json = server.post(f"{V1}/models", content=b"{nope", headers={
        "X-API-Key": KEY, "Content-Type": "application/json"})
    assert not_json.status_code == 400


def test_runs(server: Api) -> None:
    page = server.get(f"{V1}/runs", params={"model": "stagey"}).json()
    assert page["total"] == 1
    run = page["items"][0]
    assert run["id"] == server.runs["stagey"]
    assert run["model"] == "stagey"
    assert run["families"] == ["intervention", "logit_lens", "neurons"]
    assert run["config"]["model"]["name"] == "stagey"
    assert run["timings"]["finished_at"] is not None
    assert run["timings"]["wall_s"] == 0.5
    one = server.get(f"{V1}/runs/{run['id']}").json()
    assert one == run
    versions = server.get(f"{V1}/runs", params={"metric_version": "0"}).json()
    assert [r["id"] for r in versions["items"]] == [server.runs["rand-3l-v0"]]
    heads = server.get(f"{V1}/runs", params={"family": "heads"}).json()
    # The harness seeds rand-3l and tiny-2l-s0 with heads (stagey without); the session's
    # server may also hold runs that other modules' ingest tests added (rand-3l-seq).
    assert all("heads" in r["families"] for r in heads["items"])
    assert {"rand-3l", "tiny-2l-s0"} <= {r["model"] for r in heads["items"]}
    assert "stagey" not in {r["model"] for r in heads["items"]}
    stability = server.get(f"{V1}/runs", params={"family": "stability"}).json()
    assert stability["items"][0]["config"]["refit_family"] == "tiny-4l"
    assert server.get(f"{V1}/runs/999999").status_code == 404
    assert server.get(f"{V1}/runs/abc").status_code == 404
    assert server.get(f"{V1}/runs", params={"status": "done"}).status_code == 400


def test_models_and_runs_carry_their_parity_report(server: Api) -> None:
    """A model loaded from a Hugging Face checkpoint carries the evidence that Strata ran it as
    Hugging Face does: its float32 parity report, served with the model and with each run."""
    model = server.get(f"{V1}/models/tiny-2l-s0").json()
    parity = model["parity"]
    assert parity["reference"] == "huggingface"
    assert parity["passed"] is True
    assert parity["dtype"] == "float32"
    assert 0 <= parity["max_abs_logprob_diff"] <= parity["tolerance"]
    assert 0 <= parity["kl_to_reference"] <= parity["kl_tolerance"]
    assert parity["block_paths"] == ["fast"] * model["n_layers"]
    assert model["n_experts"] == 1
    run = server.get(f"{V1}/runs/{model['current_run_id']}").json()
    assert run["parity"]["max_abs_logprob_diff"] == parity["max_abs_logprob_diff"]
    listed = server.get(f"{V1}/runs", params={"model": "tiny-2l-s0"}).json()["items"]
    assert all(r["parity"] is not None for r in listed)
    # a random-weight model has no Hugging Face original: the report says so, and why
    rand = server.get(f"{V1}/models/rand-3l").json()
    assert rand["parity"]["reference"] is None
    assert "random weights" in rand["parity"]["note"]


def test_an_architecture_strata_cannot_run_exactly_is_refused_at_registration(
        server: Api) -> None:
    """Over HTTP: 422 naming the architecture and the mechanism, nothing stored; an OLMo 3
    (post-norm) checkpoint beside it registers, with its parity and why nothing was folded."""
    import transformers

    from compute.zoo.architectures import CASES_BY_NAME, build_checkpoint, word_level_tokenizer

    phi = server.tmp / "checkpoints" / "phi-qk-norm"
    config = transformers.PhiConfig(**{**CASES_BY_NAME["phi"].settings, "qk_layernorm": True,
                                       "num_hidden_layers": 2})
    config.architectures = ["PhiForCausalLM"]
    transformers.PhiForCausalLM(config).save_pretrained(phi)
    word_level_tokenizer(128).save_pretrained(phi)
    before = server.get(f"{V1}/models", params={"limit": 500}).json()["total"]
    refused = register(server, {"source": str(phi)})
    assert refused.status_code == 422, refused.text
    assert "PhiForCausalLM with qk_layernorm" in refused.json()["detail"]
    assert server.get(f"{V1}/models/phi-qk-norm").status_code == 404
    assert server.get(f"{V1}/models", params={"limit": 500}).json()["total"] == before
    olmo = build_checkpoint(CASES_BY_NAME["olmo-3"], server.tmp / "checkpoints" / "olmo-3")
    accepted = register(server, {"source": str(olmo)})
    assert accepted.status_code == 201, accepted.text
    model = server.get(f"{V1}/models/olmo-3").json()
    assert model["architecture"] == "Olmo3ForCausalLM"
    assert model["processing"]["fold_ln"] is False
    assert any("normalises after each sublayer" in n for n in model["processing"]["notes"])
    assert model["parity"]["passed"] is True
    assert model["parity"]["block_paths"] == ["bridge"] * 3
