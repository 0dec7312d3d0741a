"""The episode view's page builder (view/page.py): what each page says, and that no log
string can become markup."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from records_support import episode_record
from view_support import story, turn_record

from budgetproxy.view import page
from budgetproxy.view.logs import EpisodeLog

TAGS = {"html", "head", "meta", "title", "style", "body", "nav", "a", "h1", "h2", "h3", "h4",
        "p", "table", "tr", "th", "td", "section", "div", "span", "pre", "ul", "li", "code", "i"}


class Page(HTMLParser):
    """The tags, attributes and text of a page."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.chunks: list[str] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.chunks.append(data)

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.chunks).split())

    def hrefs(self) -> list[str]:
        return [a["href"] or "" for t, a in self.tags if t == "a"]


def log_of(records: list[dict[str, Any]]) -> EpisodeLog:
    log = EpisodeLog(records[0]["episode_id"])
    for r in records:
        if r["type"] == "episode":
            log.record = r
        else:
            log.turns.append(r)
    return log


def test_the_episode_page_shows_each_call_as_it_settled() -> None:
    html = page.episode_page(log_of(story()))
    text = Page(html).text
    # one section per logged call, in turn and attempt order
    heads = re.findall(r"<h3>(.*?)</h3>", html)
    assert [re.sub("<[^>]+>", "", h) for h in heads] == [
        "Turn 1 charged", "Turn 2 upstream error, refunded", "Turn 2 charged",
        "Turn 2 attempt 2 free retry", "Turn 3 charged", "Turn 4 refused (not forwarded)"]
    assert "6 calls logged: 3 charged, 1 upstream error, refunded, 1 free retry, " \
        "1 refused (not forwarded); 1 of them retries of a turn" in text
    # the budget text the model saw, per turn; none on the refused call
    assert text.count("[Budget] 1 turn left.") == 3 and "[Budget] last turn." in text
    assert "none placed this turn" in text
    # new messages with their offset, tool results with their call id, the tool call made
    assert "New messages (2, the whole conversation)" in text
    assert "New messages (1, from message 6 on)" in text
    assert "for c1" in text and "moved left" in text
    assert 'move({"direction":"left"})' in text
    assert "none: the proxy refused the call without forwarding it" in text
    # spend after each call, on the axes that have a budget
    assert "spend after it: turns 3 of 3; tokens 45 of 100; 0 turns left" in text
    assert "HTTP 502" in text and "HTTP 403" in text


def test_the_outcome_and_the_spend_against_every_budget() -> None:
    text = Page(page.episode_page(log_of(story()))).text
    assert "Episode ep-1 exhausted" in text
    assert "exhausted by turns" in text and "tier 25%" in text
    assert "turns ← ran out 3 3 100%" in text
    assert "tokens 45 100 45%" in text
    assert "cost" not in text.split("Turns")[0].split("Spend against the budget")[1]
    assert '"policy": "careful"' in text


def test_a_hidden_episode_says_the_model_saw_no_budget() -> None:
    log = log_of([turn_record("h", 1), episode_record("h", budget=3)])
    text = Page(page.episode_page(log)).text
    assert "hidden arm: the model was not told its budget" in text


def test_an_episode_without_its_end_record_reads_from_its_turns() -> None:
    log = log_of([turn_record("r", 1), turn_record("r", 2)])
    text = Page(page.episode_page(log)).text
    assert "no episode record: still running, or its file not given" in text
    assert "turns 2 3 67%" in text and "tokens 30 no cap" in text


def test_responses_and_messages_shapes_render_their_text_and_tool_calls() -> None:
    turn = turn_record("x", 1, route="/v1/messages", request_messages=[
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image", "source": {"data": "AAAA"}}]}],
        response={"content": [{"type": "text", "text": "seen"}],
                  "tool_calls": [{"name": "grep", "input": {"q": "x"}}]})  # fmt: skip
    text = Page(page.episode_page(log_of([turn]))).text
    assert "look" in text and '"source"' in text and "seen" in text
    assert 'grep({"q": "x"})' in text


def test_the_site_links_index_tasks_and_episodes() -> None:
    logs = [log_of(story("ep-1", "t1")), log_of(story("ep-2", "t1")),
            log_of(story("ep-3", "t/2"))]
    pages = page.site(logs, "3 episodes")
    assert set(pages) == {page.INDEX, page.task_page_name("t1"), page.task_page_name("t/2"),
                          *(page.episode_page_name(f"ep-{i}") for i in (1, 2, 3))}
    index = Page(pages[page.INDEX])
    assert index.hrefs() == [page.task_page_name("t/2"), page.task_page_name("t1")]
    assert "t1 2 0 2" in index.text
    task = Page(pages[page.task_page_name("t1")])
    assert task.hrefs() == [page.INDEX, page.episode_page_name("ep-1"),
                            page.episode_page_name("ep-2")]
    assert "policy=careful" in task.text
    episode = Page(pages[page.episode_page_name("ep-3")])
    assert episode.hrefs() == [page.INDEX, page.task_page_name("t/2")]
    for href in [*index.hrefs(), *task.hrefs(), *episode.hrefs()]:
        assert href in pages


def test_page_names_are_safe_file_names_and_tell_ids_apart() -> None:
    names = {page.episode_page_name(i) for i in ("a/b", "a_b", "a?b", "../../etc", "", "é")}
    assert len(names) == 6
    for name in names:
        assert re.fullmatch(r"episode-[A-Za-z0-9_.-]+-[0-9a-f]{10}\.html", name), name
        assert ".." not in name.removesuffix(".html").split("-", 1)[1]
    assert page.task_page_name(None) == "task-none.html"


hostile = st.text(alphabet=st.sampled_from(list("<>&\"'`=/ ascriptonloadx\n\\")) | st.characters(),
                  max_size=40)


@settings(max_examples=60)
@given(eid=hostile, task=hostile, text=hostile, tool=hostile, args=hostile, tag=hostile)
def test_no_log_string_becomes_markup(
    eid: str, task: str, text: str, tool: str, args: str, tag: str
) -> None:
    records = [
        turn_record(eid, 1, task_id=task, model=text, route=text, finish_reason=text,
                    request_messages=[{"role": text, "content": text, "tool_call_id": text},
                                      {"role": "user", "content": [{"type": text, "text": text}]}],
                    response={"content": text, "tool_calls": [
                        {"function": {"name": tool, "arguments": args}}]},
                    disclosure={"arm": text, "text": text}, ts=text),
        episode_record(eid, task_id=task, tags={tag: text}, metadata={text: tag}, model=text,
                       end_reason=text, tier=text),
    ]  # fmt: skip
    log = log_of(records)
    pages = page.site([log])
    for html in pages.values():
        parsed = Page(html)
        assert {t for t, _ in parsed.tags} <= TAGS
        for _, attrs in parsed.tags:
            assert not any(name.startswith("on") for name in attrs)
            assert set(attrs) <= {"charset", "http-equiv", "content", "name", "lang", "href",
                                  "class", "id"}
        for href in parsed.hrefs():
            assert href in pages
    episode = Page(pages[page.episode_page_name(eid)])
    assert text in "".join(episode.chunks)  # shown as it was, not as markup
    assert ("meta", {"http-equiv": "Content-Security-Policy", "content": page.CSP}) in episode.tags
