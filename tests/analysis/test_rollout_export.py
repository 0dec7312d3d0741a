"""`budgetproxy export`: one row per episode from a real proxy's logs, read back by pandas
and `datasets` without glue."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
from conftest import Proxy, ProxyFactory, WatchedUpstream, new_id

from budgetproxy.analysis.rollout_export import COLUMNS
from budgetproxy.cli import main
from budgetproxy.testing import fake_tokens

pd = pytest.importorskip("pandas", reason="the round trip needs pandas (pip install pandas)")
datasets = pytest.importorskip("datasets", reason="the round trip needs datasets")

TEMPLATE = "[Turn budget] Turn {turn} of {total}."


def _rollouts(proxy: ProxyFactory, upstream: WatchedUpstream) -> tuple[Proxy, str, list[str]]:
    p = proxy({"upstreams": [{"name": "main", "base_url": upstream.base_url,
                              "capture_tokens": True}],
               "disclosure": {"mode": "disclosed", "template": TEMPLATE}}, fresh=True)
    client = p.client(default_headers={"X-Fake-Token-Server": "vllm"})
    task = new_id("task")
    ids = [new_id() for _ in range(3)]
    for n, eid in enumerate(ids):
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {n}"}]
        for i in range(2):
            out = client.chat.completions.with_raw_response.create(
                model="m1", messages=messages,  # type: ignore[arg-type]
                extra_headers={"X-Episode-Id": eid, "X-Episode-Task": task,
                               "X-Episode-Group": "g", "X-Episode-Budget": "2"})
            reply = out.parse().choices[0].message
            messages += [{"role": "assistant", "content": reply.content},
                         {"role": "user", "content": f"obs {i}"}]
    p.http().post(f"/v1/episodes/{ids[0]}/outcome", json={"success": True, "reward": 1.0})
    p.http().post(f"/v1/episodes/{ids[1]}/outcome", json={"success": False, "reward": 0.4})
    p.http().post(f"/v1/episodes/{ids[2]}/outcome", json={"success": True, "success_turn": 1})
    assert len(p.wait_records(3, type="episode", task_id=task)) == 3
    return p, task, ids


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_export_round_trip(proxy: ProxyFactory, upstream: WatchedUpstream, tmp_path: Path,
                           fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    p, task, ids = _rollouts(proxy, upstream)
    out = tmp_path / "out"
    assert main(["export", str(p.log_dir), "--out", str(out), "--format", fmt,
                 "--on-exhausted", "zero"]) == 0
    path = out / f"episodes.{fmt}"
    assert f"3 episodes -> {path}" in capsys.readouterr().out
    df = (pd.read_parquet(path) if fmt == "parquet"
          else pd.read_json(path, lines=True, precise_float=True))
    assert list(df["episode_id"]) == ids
    by_id = {r["episode_id"]: r for r in df.to_dict("records")}
    # ids[1] used its 2 turns and reported a failure: exhausted, so reward 0 under the rule
    assert by_id[ids[1]]["end_reason"] == "exhausted" and by_id[ids[1]]["reward"] == 0.0
    assert by_id[ids[1]]["reported_reward"] == 0.4
    assert by_id[ids[0]]["reward"] == 1.0 and by_id[ids[2]]["reward"] == 1.0
    assert [by_id[i]["advantage"] for i in ids] == pytest.approx([1 / 3, -2 / 3, 1 / 3])
    row = by_id[ids[0]]
    assert row["task_id"] == task and row["group"] == "g" and row["budget"] == 2
    assert row["disclosure"] == "disclosed" and row["tier"] == "n/a"
    messages = list(row["messages"])
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[0]["content"] == "task 0\n\n[Turn budget] Turn 1 of 2."
    assert messages[2]["content"] == "obs 0\n\n[Turn budget] Turn 2 of 2."
    # the rebuilt conversation is what the fake tokenized: prompt ids match exactly
    assert list(row["turn_prompt_token_ids"][1]) == fake_tokens.prompt_ids(
        [{"role": m["role"], "content": m["content"]} for m in messages[:3]])
    assert bool(row["append_only"]) is True
    ids_, mask = list(row["token_ids"]), list(row["loss_mask"])
    sampled = [t for t, m in zip(ids_, mask, strict=True) if m == 1]
    assert sampled == [*row["turn_completion_token_ids"][0], *row["turn_completion_token_ids"][1]]
    assert [lp for lp, m in zip(row["logprobs"], mask, strict=True) if m == 1] == [
        fake_tokens.logprob(t) for t in sampled]

    kind = "parquet" if fmt == "parquet" else "json"
    ds = datasets.load_dataset(kind, data_files=str(path), split="train",
                               cache_dir=str(tmp_path / "hf"))
    assert ds.num_rows == 3 and ds[0]["episode_id"] == ids[0]
    assert ds[0]["messages"][0]["role"] == "user"
    assert ds[0]["loss_mask"] == mask


def test_export_without_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["export", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) != 0


def _same(field: str, exported: Any, logged: Any) -> bool:
    """An exported value against the episode record's, as each file type stores it."""
    if field in ("tags", "metadata"):
        return json.loads(exported) == logged
    if field in ("started_at", "ended_at"):
        return pd.Timestamp(exported) == pd.Timestamp(logged)
    if logged is None:
        return exported is None or (isinstance(exported, float) and math.isnan(exported))
    if isinstance(logged, float):
        return exported == pytest.approx(logged)
    return bool(exported == logged)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_export_carries_every_episode_field(
    proxy: ProxyFactory, tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    p = proxy({"budget": {"default_turns": 5}}, fresh=True)
    http = p.http()
    made = []
    for n, (tokens, seconds) in enumerate([(10_000, None), (None, 600.0), (5, None)]):
        body = {"task_id": "t-export", "group": "g1", "budget": 2, "max_turns": 4,
                "disclosure": "hidden", "tags": {"policy": f"p{n}", "seed": n},
                "token_budget": tokens, "time_budget_s": seconds}
        r = http.post("/v1/episodes", json={k: v for k, v in body.items() if v is not None})
        assert r.status_code == 201, r.text
        made.append(r.json()["episode_id"])
    client = p.client()
    for eid in made:
        for i in range(2):
            try:
                client.chat.completions.create(
                    model="m1", messages=[{"role": "user", "content": f"go {i}"}],
                    extra_headers={"X-Episode-Id": eid})
            except openai.PermissionDeniedError:  # the 5-token episode ran out
                break
    http.post(f"/v1/episodes/{made[0]}/outcome",
              json={"success": True, "reward": 1.0, "success_turn": 1,
                    "metadata": {"judge": "exact", "score": 1}})
    http.post(f"/v1/episodes/{made[1]}/outcome", json={"success": False})
    http.post(f"/v1/episodes/{made[2]}/end")
    logged = {r["episode_id"]: r for r in p.wait_records(3, type="episode",
                                                         task_id="t-export")}
    assert len(logged) == 3 and logged[made[2]]["exhausted_by"] == "tokens"

    out = tmp_path / "out"
    assert main(["export", str(p.log_dir), "--out", str(out), "--format", fmt]) == 0
    capsys.readouterr()
    path = out / f"episodes.{fmt}"
    frame = (pd.read_parquet(path) if fmt == "parquet"
             else pd.read_json(path, lines=True, precise_float=True))
    kind = "parquet" if fmt == "parquet" else "json"
    ds = datasets.load_dataset(kind, data_files=str(path), split="train",
                               cache_dir=str(tmp_path / "hf"))
    for rows in (frame.to_dict("records"), list(ds)):
        by_id = {r["episode_id"]: r for r in rows}
        for eid in made:
            record, row = logged[eid], by_id[eid]
            # (the record's reward is the export's reported_reward: reward is after the rule)
            column = {f: "reported_reward" if f == "reward" else f
                      for f in set(record) - {"schema", "type"}}
            assert set(column.values()) <= set(row), sorted(set(column.values()) - set(row))
            wrong = {f: (row[c], record[f]) for f, c in sorted(column.items())
                     if not _same(f, row[c], record[f])}
            assert not wrong, wrong
        row = by_id[made[0]]
        assert json.loads(row["tags"])["policy"] == "p0" and row["success_turn"] == 1
        assert row["duration_s"] == pytest.approx(
            (pd.Timestamp(row["ended_at"]) - pd.Timestamp(row["started_at"])).total_seconds(),
            abs=1e-3)
    assert list(frame.columns) == list(COLUMNS)  # the documented order


def test_export_without_duckdb_names_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "logs").mkdir()
    monkeypatch.setitem(sys.modules, "duckdb", None)  # import duckdb raises ImportError
    assert main(["export", str(tmp_path / "logs"), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == (
        "budgetproxy export: export needs DuckDB: pip install 'budgetproxy[analyze]'")


def test_the_documented_schema_is_the_exported_one() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "rollouts.md").read_text()
    section = page[page.index("## Export for trainers"):page.index("## An example loop")]
    documented = [name.strip() for cells in re.findall(r"^\| `([^|]+)` \|", section, re.M)
                  for name in cells.replace("`", "").split(",")]
    assert documented == list(COLUMNS)
