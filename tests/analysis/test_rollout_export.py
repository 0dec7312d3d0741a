"""`budgetproxy export`: one row per episode from a real proxy's logs, read back by pandas
and `datasets` without glue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import Proxy, ProxyFactory, WatchedUpstream, new_id

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
