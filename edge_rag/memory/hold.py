"""Running under a grown plan: a larger store leaves a smaller encoder batch, which every session must then run at.

EdgeRAG re-plans when it adds documents and when another process's commit is about to load (Plan.with_passages);
the sessions it has made were sized by the plan it opened with. A plan and the certified path sized by it change
together under the EdgeRAG's ``plan_lock``: a calibration swapped in while the plan grew was lost (the grown plan
re-installed the old path) or ran at the old plan's batch, past the budget.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..errors import BudgetError

if TYPE_CHECKING:  # types only: the pipeline's modules import memory
    from ..config import Config
    from ..decision.certified import CertifiedPath
    from ..retrieval.encode import Encoder
    from ..storage.stores import PassageStore
    from .plan import Plan


class Planned(Protocol):
    """What runs under a plan (EdgeRAG)."""

    plan: Plan
    config: Config
    certified: CertifiedPath
    encoder: Encoder
    store: PassageStore
    plan_lock: threading.Lock


def hold(rag: Planned, plan: Plan, encoder: Encoder | None = None) -> None:
    """``rag`` runs under ``plan`` from now on: its batch in the config, the certified path (whose reader, if loaded,
    reads in it), the question encoder and ``encoder`` (a second session indexing beside it)."""
    with rag.plan_lock:
        rag.plan = plan
        if plan.encode_batch_tokens != rag.config.encode_batch_tokens:
            rag.config = plan.apply(rag.config)
            rag.certified = rag.certified.planned(rag.config)
            for session in {rag.encoder, encoder or rag.encoder}:
                session.batch_tokens = max(plan.encode_batch_tokens, session.max_seq_len)


def swap(rag: Planned, new: CertifiedPath, calibration: Path) -> None:
    """``rag`` decides by ``new`` (CertifiedPath.swapped from ``calibration``) from now on, at the plan in force: one
    grown since ``new`` was made from the path before it sizes it too. It is made outside the lock (it reads the
    store, whose lock a reload holds while it calls ``admit``)."""
    if new.may_generate and not rag.plan.generator:
        raise BudgetError(f"{calibration} certifies generated answers at {new.config.max_error_rate}, but llama.cpp "
                          "is not in this EdgeRAG's memory plan: open a new EdgeRAG with it")
    with rag.plan_lock:
        new = new.planned(rag.plan.apply(new.config))
        rag.certified, rag.config = new, new.config


def admit(rag: Planned, passages: int) -> None:
    """Another process committed a store of ``passages`` that ``rag`` is about to load: hold it in the plan first, at
    the batch that leaves room for it, or refuse to load it (BudgetError: the question fails, the process stays in
    its budget)."""
    try:
        hold(rag, rag.plan.with_passages(passages, rag.config, rag.encoder.dim))
    except BudgetError as exc:
        raise BudgetError(f"the store at {rag.store.location} grew to {passages} passages (another process added them) "
                          f"past this process's memory plan: {exc}; then open it again") from None


def admitting(rag: Planned) -> Callable[[int], None]:
    """``admit`` for ``rag``'s store to call, holding ``rag`` weakly: the store's callback to it was a cycle, so an
    EdgeRAG dropped without ``close()`` kept its models (and their RSS, which the next one's plan counts) until
    Python's cycle collector happened to run."""
    held = weakref.ref(rag)

    def call(passages: int) -> None:
        if (owner := held()) is not None:
            admit(owner, passages)
    return call
