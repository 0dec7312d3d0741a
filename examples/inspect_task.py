"""An inspect-ai task whose samples are budgetproxy episodes, with no change to the task.

With `pip install 'budgetproxy[inspect]'` and BUDGETPROXY_URL set, each sample x epoch of any
eval becomes an episode on the proxy (task id = the sample id) and its score is reported as
the episode's outcome; `budgetproxy analyze` then gives Pass@(K,T) with K up to the epochs:

    budgetproxy serve --upstream http://127.0.0.1:8000/v1 &
    BUDGETPROXY_URL=http://127.0.0.1:8080 OPENAI_API_KEY=unused \\
        inspect eval examples/inspect_task.py --model openai/my-model \\
        --model-base-url http://127.0.0.1:8080/v1 --epochs 4
    budgetproxy analyze ./trajectories --k 1,2,4 --turns 2,4,6,8

The task: guess a word; after each wrong guess the user reveals one more letter of it. The
more letters a model needs, the more turns it takes, so success depends on the turn budget.
The only budgetproxy-specific lines are the `budgetproxy_*` metadata keys (optional: without
them an episode gets the proxy's default budget); `--metadata budgetproxy_budget=4` on the
command line sets them for a run.
"""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ChatMessageUser
from inspect_ai.scorer import includes
from inspect_ai.solver import Generate, Solver, TaskState, solver

WORDS = {
    "ox": "a large animal that pulls a plough",
    "cat": "a small animal that purrs",
    "lemon": "a sour yellow fruit",
    "avocado": "a green fruit with a large stone",
}
MAX_TURNS = 8  # a word of n letters is revealed whole by turn n + 1


@solver
def guess_with_hints() -> Solver:
    """Ask for the word; after each wrong guess reveal one more letter, until it is said."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        word = state.target.text
        for shown in range(1, len(word) + 2):
            state = await generate(state)
            if word in state.output.completion.lower() or shown > len(word):
                break
            state.messages.append(ChatMessageUser(
                content=f"Not yet. The word starts with {word[:shown]!r}. Guess again."))
        return state

    return solve


@task
def guess_the_word() -> Task:
    return Task(
        dataset=[
            Sample(id=word, input=f"Guess the word I am thinking of: {clue}. "
                                  "Answer with the word.", target=word)
            for word, clue in WORDS.items()
        ],
        solver=guess_with_hints(),
        scorer=includes(),
        metadata={"budgetproxy_max_turns": MAX_TURNS},
    )
