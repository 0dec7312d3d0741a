"""inspect-ai tasks driven by inspect's own agents (react, basic_agent), for the integration's
tests: nothing in them knows about budgetproxy."""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.agent import react
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import basic_agent
from inspect_ai.tool import Tool, tool


@tool
def lookup() -> Tool:
    async def execute(query: str) -> str:
        """Look a word up.

        Args:
            query: The word to look up.
        """
        return f"no entry for {query}"

    return execute


def _dataset() -> list[Sample]:
    return [Sample(id="q1", input="Which animal purrs?", target="cat")]


@task
def react_agent() -> Task:
    return Task(dataset=_dataset(), solver=react(tools=[lookup()]), scorer=includes(),
                message_limit=40)


@task
def basic_agent_task() -> Task:
    return Task(dataset=_dataset(), solver=basic_agent(tools=[lookup()]), scorer=includes(),
                message_limit=40)
