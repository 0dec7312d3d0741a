"""One dialect per model-call API, behind one Protocol (base.Dialect), by route."""

from __future__ import annotations

from budgetproxy.proxy.dialects.base import Dialect, Reply
from budgetproxy.proxy.dialects.chat import ChatDialect
from budgetproxy.proxy.dialects.completions import CompletionsDialect
from budgetproxy.proxy.dialects.messages import MessagesDialect
from budgetproxy.proxy.dialects.responses import ResponsesDialect

__all__ = ["DIALECTS", "Dialect", "Reply"]

DIALECTS: dict[str, Dialect] = {
    "/v1/chat/completions": ChatDialect(),
    "/v1/completions": CompletionsDialect(),
    "/v1/responses": ResponsesDialect(),
    "/v1/messages": MessagesDialect(),
}
