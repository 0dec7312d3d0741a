"""Turn and episode records for the episode view's tests: a disclosed episode with a refund, a
free retry and a refusal, as the proxy logs them."""

from __future__ import annotations

from typing import Any

from records_support import episode_record


def turn_record(eid: str, turn: int, **fields: Any) -> dict[str, Any]:
    """A charged chat-completions turn of a hidden episode with a budget of 3, unless
    `fields` say otherwise."""
    record: dict[str, Any] = {
        "schema": 1, "type": "turn", "episode_id": eid, "turn": turn, "attempt": 1,
        "ts": f"2026-11-30T10:00:0{turn}.000Z", "latency_s": 0.25, "model": "m",
        "route": "/v1/chat/completions", "stream": False, "status": "ok", "http_status": 200,
        "request_messages": [{"role": "user", "content": f"question {turn}"}],
        "messages_offset": 2 * (turn - 1), "response": {"role": "assistant",
                                                        "content": f"answer {turn}"},
        "finish_reason": "stop", "usage": {"prompt_tokens": 10, "completion_tokens": 5},
        "budget": 3, "remaining": 3 - turn, "charged": True,
        "cumulative": {"turns": turn, "tokens": 15 * turn, "cost": None, "seconds": None},
        "disclosure": {"arm": "hidden", "text": None}, "task_id": "t1", "group": None,
    }  # fmt: skip
    record.update(fields)
    return record


def story(eid: str = "ep-1", task: str = "t1") -> list[dict[str, Any]]:
    """A disclosed episode (3 turns, 100 tokens) in the order the proxy writes it: turn 1;
    turn 2 fails upstream and is refunded; its resend is answered; a byte-identical resend is
    a free retry; turn 3 calls a tool; a fourth call is refused; the episode ends exhausted."""
    said = {"arm": "disclosed"}
    return [
        turn_record(eid, 1, task_id=task, disclosure={**said, "text": "[Budget] 2 turns left."},
                    request_messages=[{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "question 1"}]),
        turn_record(eid, 2, task_id=task, status="upstream_error", http_status=502,
                    charged=False, response=None, remaining=2, usage=None,
                    cumulative={"turns": 1, "tokens": 15, "cost": None, "seconds": None},
                    disclosure={**said, "text": "[Budget] 1 turn left."}),
        turn_record(eid, 2, task_id=task, disclosure={**said, "text": "[Budget] 1 turn left."}),
        turn_record(eid, 2, task_id=task, attempt=2, charged=False,
                    disclosure={**said, "text": "[Budget] 1 turn left."}),
        turn_record(eid, 3, task_id=task, finish_reason="tool_calls",
                    disclosure={**said, "text": "[Budget] last turn."},
                    response={"role": "assistant", "content": None, "tool_calls": [
                        {"id": "c1", "type": "function",
                         "function": {"name": "move", "arguments": '{"direction":"left"}'}}]}),
        turn_record(eid, 4, task_id=task, status="rejected", http_status=403, charged=False,
                    response=None, usage=None, remaining=0, finish_reason=None,
                    cumulative={"turns": 3, "tokens": 45, "cost": None, "seconds": None},
                    disclosure={**said, "text": None},
                    request_messages=[{"role": "tool", "tool_call_id": "c1",
                                       "content": "moved left"}]),
        episode_record(eid, task_id=task, budget=3, max_turns=12, tier="25%",
                       disclosure="disclosed", turns_used=3, end_reason="exhausted",
                       exhausted=True, exhausted_by="turns", token_budget=100, tokens_used=45,
                       tags={"policy": "careful"}),
    ]  # fmt: skip
