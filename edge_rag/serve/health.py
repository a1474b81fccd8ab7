"""What ``/api/health`` reports, and the decision block the kiosk page shows: which certificate decides the
answers (the shipped calibration or one of ``edge-rag calibrate``), or why none does."""
from __future__ import annotations

import math

from ..decision.certified import CertifiedPath
from ..decision.certify import PGVECTOR_CALIBRATION_ASSET
from ..errors import StoreError, store_damage_is_an_error
from ..memory import peak_rss_mb, rss_mb
from ..pipeline import EdgeRAG
from ..storage.stores import Stamped


def health_report(rag: EdgeRAG, waiting: int) -> dict:
    """What an operator checks first: bundle, corpus, memory plan and use, generations waiting, the decision. A store
    found damaged (its files as the next reader finds them: ``PassageStore.check``) makes ``status`` "error", with
    ``error`` saying why, in place of the corpus and the decision: questions fail on it, or restarting would.
    ``waiting``: generations in line (``Lanes.waiting``, read on the event loop). Runs on the health lane and reads the
    store's last commit as a new reader would, never under its search lock: the lock is held through the reload of
    another process's commit (seconds at 200,000 passages), so a watchdog polling health restarted a healthy kiosk;
    ``corpus.loading`` says a question is (or the next will be) loading it."""
    plan = rag.plan
    report: dict = {
        "status": "ok",
        "bundle": {"path": str(rag.bundle.root), "profile": rag.bundle.manifest.get("profile"),
                   "encoder": rag.bundle.encoder.get("name"), "generator": rag.bundle.generator.get("name")},
        "plan": {"budget_mb": plan.budget_mb, "total_mb": round(plan.total_mb, 1), "n_ctx": plan.n_ctx,
                 "text": str(plan)},
        "memory": {"rss_mb": round(rss_mb(), 1), "peak_rss_mb": round(peak_rss_mb(), 1),
                   "budget_mb": rag.config.memory_budget_mb},
        "generation": {"waiting": waiting},
    }
    try:
        with store_damage_is_an_error(rag.store.location):  # a page its own connection reads damaged, as a question's
            last = rag.store.check()
            report["corpus"] = {"passages": last.passages, "version": last.version, "loading": last.loaded != last.version}
            report["decision"] = decision(rag, last)
    except StoreError as exc:
        report.update(status="error", error=str(exc))
    return report


def decision(rag: EdgeRAG, store: Stamped | None = None) -> dict:
    """Whether the answers are certified and by what: alpha, delta, the calibration file, its questions and the
    threshold it certifies (shown also when the seeds' decision runs: the certificate it would use), whether
    generated answers are too (``generation_reason`` when not), ``reason`` when they are not certified, and ``summary``, one line saying so for the
    kiosk page's footer. As of ``store`` (default: ``rag.store``, followed to its last commit), as the next question
    would be decided."""
    path = rag.certified  # one snapshot: the operator may apply another meanwhile
    path.check_store(rag.store if store is None else store)
    cert, c = path.certificate, path.config
    reason: str | None  # None: certified
    if not c.cgr:
        reason = "no answer/refuse decision: every question is generated for (Config(cgr=False))"
    elif not c.certified:
        reason = "the seeds' decision answers (--seed-decision, Config(certified=False))"
    else:
        reason = path.uncertified
    threshold = cert.threshold if cert and math.isfinite(cert.threshold) else None
    shipped = "the shipped pgvector calibration" if path.calibration_path == PGVECTOR_CALIBRATION_ASSET else \
        "the shipped calibration"
    source = certificate_source(path, (rag.store if store is None else store).stamp)
    if source["source"] == "operator":
        which = f"questions asked at this kiosk, labelled by its operator (last label {str(source['labelled'])[:10]})"
    elif path.own:
        which = f"questions of an own calibration ({path.calibration_path.name})"
    else:
        sets = "SQuAD-2 and HotpotQA" if path.calibration and path.calibration.source.get("n_hotpotqa_calibration") \
            else "SQuAD-2"  # the shipped ones: 14 of their 1,247 single-hop questions are HotpotQA's
        which = f"{sets} questions ({shipped}), not on this kiosk's questions"
    if source["documents_changed"]:
        which += ", measured before the documents last changed: calibrate again"
    return {"certified": reason is None, "reason": reason, "max_error_rate": c.max_error_rate, "delta": c.delta,
            "certificate": source,
            "calibration": str(path.calibration_path), "own_calibration": path.own,
            "calibration_questions": cert.n_cal if cert else 0, "threshold": threshold,
            # the GPT route answers only if the calibration's generated answers, from this generator and generated as
            # this config generates, meet alpha too; why not, when the answers are certified but generation is not
            "generation_certified": reason is None and path.gpt_allowed,
            "generation_reason": path.gpt_refused if reason is None else reason,
            "summary": _summary(reason, c.max_error_rate, c.delta, cert.n_cal if cert else 0, threshold, which)}


def certificate_source(path: CertifiedPath, stamp: tuple[str, int]) -> dict:
    """Whose certificate is in force: "shipped", "operator" (applied from /admin: when its questions were last
    labelled, when it was applied) or "file" (--calibration), on how many questions, and whether the documents
    changed since an own one was measured: it stays in force, but its answers may no longer be true (None: not
    known: not recorded, as by `edge-rag calibrate` before it recorded the store's stamp, or a file measured on
    another store, perhaps another kiosk's with the same documents). ``stamp``: the store's, as the next question
    is decided."""
    cal = path.calibration
    operator = cal.source.get("operator") if cal is not None and path.own else None
    source = "operator" if isinstance(operator, dict) else "file" if path.own else "shipped"
    n = cal.reader(path.config.reader).table.n_cal if cal is not None and path.config.reader in cal.readers else 0
    made = operator if operator else cal.source if cal is not None and path.own else {}
    measured = (made.get("store_id"), made.get("store_version"))
    known = None not in measured and (operator or measured[0] == stamp[0])
    return {"source": source, "questions": n, "labelled": operator.get("labelled") if operator else None,
            "applied": operator.get("applied") if operator else None,
            "documents_changed": measured != tuple(stamp) if known else None}


def _summary(reason: str | None, alpha: float, delta: float, n_cal: int, threshold: float | None,
             which: str) -> str:
    """The decision in one line a visitor can read, naming the questions the bound was measured on: the shipped
    certificate holds for SQuAD-2 and HotpotQA questions, which is not a claim about what this kiosk's visitors ask."""
    if reason is not None:
        return f"Answers not certified: {reason}"
    if threshold is None:
        return (f"Every question is refused: no threshold certifies error ≤ {alpha * 100:g}% (δ {delta:g}) on "
                f"{n_cal:,} {which}")
    return f"Answers certified: error ≤ {alpha * 100:g}% among answered (δ {delta:g}), measured on {n_cal:,} {which}"
