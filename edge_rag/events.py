"""What ``EdgeRAG.ask_stream`` yields, in order: the route, answer text pieces, the final Answer.

The route comes first and early (after retrieval and the gate, milliseconds) so a kiosk can show
"thinking…" only when llama.cpp is about to run; token pieces follow only on the GPT route. The same
objects are sent as Server-Sent Events by ``edge-rag serve`` (``name`` is the SSE event name,
``data()`` its JSON payload).
"""
from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TypeAlias

from .config import Tier
from .types import Answer, Route


@dataclass(frozen=True)
class RouteDecided:
    """Confidence-Gated Routing chose: RAG (extractive, no LLM), GPT (generation follows) or REFUSE."""

    route: Route
    tier: Tier
    cache_hit: bool = False
    name = "route"

    def data(self) -> dict:
        return {"route": self.route.value, "tier": self.tier.value, "cache_hit": self.cache_hit}


@dataclass(frozen=True)
class Token:
    """New answer text from llama.cpp; all pieces joined are a prefix of the final answer."""

    text: str
    name = "token"

    def data(self) -> dict:
        return {"text": self.text}


@dataclass(frozen=True)
class Final:
    """The finished Answer, the same one ``ask`` returns."""

    answer: Answer
    name = "answer"

    def data(self) -> dict:
        return self.answer.to_dict()


Event = RouteDecided | Token | Final
EventStream: TypeAlias = Generator[Event, None, None]  # one question's events; close() ends it early
