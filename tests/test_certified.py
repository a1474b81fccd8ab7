"""The certified decision path end to end on the real bundle, the shipped calibration and the SQuAD corpus."""
import json
import math
import random
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import data, splits
from edge_rag.config import Config, Tier
from edge_rag.decision.certify import CALIBRATION_ASSET, PGVECTOR_CALIBRATION_ASSET, Calibration
from edge_rag.decision.kind import Kind
from edge_rag.pipeline import EdgeRAG
from edge_rag.serve.health import decision
from edge_rag.types import Route

ALPHAS = (0.1, 0.5, 0.7, 0.8, 0.9)
SHIPPED = (CALIBRATION_ASSET, PGVECTOR_CALIBRATION_ASSET)  # one per kind of store
FAST = Config(temperature=0.0, certified=True, reader="rules")  # the property is the reader's; the rule extractor is ~1 ms


@pytest.fixture(scope="module")
def questions(squad_default_rag):
    """60 calibration-split questions (the test split stays for the benchmark)."""
    _, items = squad_default_rag
    return random.Random(0).sample(splits.select(items, "calibration"), 60)


@pytest.fixture(scope="module")
def by_alpha(squad_default_rag, questions):
    rag, _ = squad_default_rag
    out = {}
    for alpha in ALPHAS:
        with EdgeRAG(rag.store.folder, bundle=rag.bundle.root,
                     config=FAST.with_(max_error_rate=alpha)) as r:
            out[alpha] = [r.decide(q.question) for q in questions]
    return out


@pytest.mark.parametrize("asset", SHIPPED, ids=lambda p: p.name)
def test_shipped_calibrations_cover_the_default_reader_and_certify_the_default_alpha(asset):
    """One calibration per kind of store (a PostgreSQL store's full-text half ranks otherwise), each certifying
    Config()'s alpha on its own counts."""
    cal = Calibration.load(asset)
    rc = cal.reader(Config().reader)
    assert rc.table.n_cal > 1000 and 0.0 < rc.ood_distance < 4.0
    assert list(rc.table.thresholds) == sorted(rc.table.thresholds, reverse=True)  # strict → permissive
    cert = rc.table.choose(Config().max_error_rate, Config().delta)
    assert cert.n_answered > 0 and cert.upper <= Config().max_error_rate
    assert cal.source.get("backend", "embedded") == ("pgvector" if asset == PGVECTOR_CALIBRATION_ASSET else "embedded")


def test_lower_alpha_answers_a_subset(by_alpha):
    """The certified threshold only loosens as alpha grows, so the answered questions are nested."""
    answered = [{i for i, a in enumerate(by_alpha[alpha]) if a.route is Route.RAG} for alpha in ALPHAS]
    for low, high in zip(answered, answered[1:]):
        assert low <= high
    assert answered[-1], "alpha 0.9 should answer some calibration questions"


def test_answers_carry_the_certificate(by_alpha):
    """Each answer carries the certificate of its kind of question (edge_rag.decision.kind)."""
    rc = Calibration.load(CALIBRATION_ASSET).reader(FAST.reader)
    for alpha, answers in by_alpha.items():
        for a in answers:
            assert a.alpha == alpha and a.delta == FAST.delta and a.n_cal == rc.table_of(Kind(a.kind)).n_cal
            assert "read" in a.timings_ms and "certify" in a.timings_ms
            if a.route is Route.RAG:
                assert a.answer == a.candidate and a.score >= a.score_threshold
                assert 0.0 < a.cal_coverage <= 1.0 and 0.0 <= a.cal_error <= alpha
            else:
                assert a.answer is None and a.refusal_reason
            d = a.to_dict()
            assert {"score", "alpha", "delta", "score_threshold", "n_cal", "cal_coverage", "cal_error", "kind"} <= set(d)
            assert all(not (isinstance(v, float) and math.isnan(v)) for v in d.values())


def test_ood_test_questions_are_refused_on_the_dev_corpus(squad_default_rag):
    """Questions about articles absent from the corpus (OOD-test, never used for the floor) are refused."""
    rag, _ = squad_default_rag
    ood = random.Random(1).sample(splits.ood_questions("test", data.OOD_FILE), 40)
    with EdgeRAG(rag.store.folder, bundle=rag.bundle.root, config=Config(temperature=0.0, certified=True)) as r:
        refused = [r.decide(q.question).route is Route.REFUSE for q in ood]
    assert sum(refused) / len(refused) >= 0.9


def test_off_topic_questions_are_refused_on_the_sample_corpus(sample_rag):
    """Those beyond the out-of-domain floor are refused before the reader reads: no candidate, no reader call."""
    from tests.test_decision import OOD

    answers = [sample_rag.decide(q) for q in OOD]
    assert sum(a.route is Route.REFUSE for a in answers) / len(answers) >= 0.95
    assert all(a.refusal_reason for a in answers if a.route is Route.REFUSE)
    beyond = [a for a in answers if (a.refusal_reason or "").startswith("out of domain")]
    assert beyond and all(a.candidate is None and a.features["span_score"] == 0.0 for a in beyond)


def test_a_negated_question_is_refused_and_the_rule_extractors_score_reads_the_cue(sample_rag):
    """The rule extractor answers "who never X?" as "who X?": its shipped combiner scores the same evidence lower with
    the cue. The neural reader, trained on SQuAD-2's real unanswerables (many written with a negation), reads the cue
    itself: its combiner's weight on it is whatever validation fitted (calibration.json), not asserted here."""
    cal = Calibration.load(CALIBRATION_ASSET)
    a = sample_rag.decide("Who founded the Harbourlight Science Museum?")
    assert a.features["negated"] == 0.0 and a.route is Route.RAG
    negated = sample_rag.decide("Who never founded the Harbourlight Science Museum?")
    assert negated.features["negated"] == 1.0
    assert negated.route is Route.REFUSE and "negation" in negated.refusal_reason
    combiner = cal.reader("rules").combiner
    assert combiner({**a.features, "negated": 1.0}) < combiner(a.features)


def test_reader_reads_the_paragraph_around_a_sentence_hit(sample_rag):
    """A sentence hit is widened to its document neighbours (same doc only, in order) for the reader."""
    from edge_rag.reading.read import paragraphs

    window = sample_rag.config.reader_window
    question = "When is the museum open on Sundays?"
    hits = sample_rag.store.search(sample_rag.encoder.encode_one(question), 5)
    wide = paragraphs(question, hits, sample_rag.store, limit=2, window=window)
    assert 1 <= len(wide) <= 2 and wide[0].id == hits[0].id and wide[0].score == hits[0].score
    ids = [hits[0].id + k for k in range(-window, window + 1)]
    same_doc = [p for p in sample_rag.store.passages(ids) if p.doc_id == hits[0].doc_id]
    assert wide[0].text == " ".join(p.text for p in same_doc) and hits[0].text in wide[0].text
    assert all(h.id not in {p.id for p in same_doc} for h in wide[1:])  # no window read twice


def test_a_hit_without_sentence_ends_is_read_within_a_bounded_context(bundle_dir, tmp_path):
    """A document without a sentence end (a PDF's table run, minified text) was cut into 64 KB passages, and the reader
    read a hit with its neighbours whole: 222 windows, 11-20 s a question. It reads the hit, then whole neighbours
    nearest first, within READ_MAX_CHARS; the hit's own words first."""
    from edge_rag.reading.read import READ_MAX_CHARS, paragraphs

    words = [f"room{k} holds exhibit{k} from hall{k % 7}" for k in range(6000)]  # ~190 KB, no "." anywhere
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=Config(temperature=0.0)) as rag:
        rag.add_documents([", ".join(words)])
        question = "Which hall holds exhibit 12?"  # "holds" is in every part: the hit's beginning is read
        hits = rag.store.search(rag.encoder.encode_one(question), 5)
        assert max(len(h.text) for h in hits) > READ_MAX_CHARS  # a passage (chunk.MAX_UNIT_CHARS) is longer
        wide = paragraphs(question, hits, rag.store, limit=1, window=rag.config.reader_window)
    assert len(wide) == 1 and wide[0].id == hits[0].id
    assert len(wide[0].text) <= READ_MAX_CHARS and hits[0].text.startswith(wide[0].text)
    assert hits[0].text[len(wide[0].text)] == " "  # cut at a word's end


def test_a_wide_reader_window_fetches_only_what_can_be_read(bundle_dir, tmp_path):
    """Config(reader_window=1000) listed 2,001 passage ids around each hit and fetched them all (a store of 16 KB
    passages: 3 MB a question) for the READ_MAX_CHARS read. The same passages are read, and none is fetched more
    than twice as far from the hit as the farthest one read."""
    from edge_rag.reading.read import paragraphs, within

    text = " ".join(f"Room {k} of the east wing holds the brass exhibit number {k}." for k in range(400))
    question = "Which room holds the brass exhibit number 200?"
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=Config(temperature=0.0)) as rag:
        rag.add_documents([text])
        hit = next(h for h in rag.store.search(rag.encoder.encode_one(question), rag.store.count)
                   if "number 200." in h.text)
        fetched: list[int] = []

        class Counted:
            def passages(self, ids):
                fetched.extend(ids)
                return rag.store.passages(ids)

        wide = paragraphs(question, [hit], Counted(), limit=1, window=1000)
        ids = [hit.id + k for k in range(-1000, 1001) if hit.position + k >= 0]
        read = within([p for p in rag.store.passages(ids) if p.doc_id == hit.doc_id], hit, question)
    assert [wide[0].text] == [" ".join(p.text for p in read)] and 0 < read[0].position and read[-1].position < 399
    farthest = max(abs(p.id - hit.id) for p in read)
    assert max(abs(i - hit.id) for i in fetched) <= 2 * farthest


def test_a_long_hit_is_read_where_it_holds_the_questions_words(bundle_dir, tmp_path):
    """The lexical search indexes a whole passage (up to chunk.MAX_UNIT_CHARS), so a question finds a 16 KB passage
    by words in its second half; the reader read its first READ_MAX_CHARS and never saw them. It reads the part
    that holds the question's terms, cut at word ends."""
    from edge_rag.reading.read import READ_MAX_CHARS, paragraphs

    fact = "the night keeper Oswin Tamberlake feeds the harbour gulls at noon"
    words = [f"lot{k} stored crate{k} near dock{k % 5}" for k in range(700)]
    words.insert(380, fact)  # ~12 KB into a ~20 KB text without a sentence end
    question = "When does Oswin Tamberlake feed the gulls?"
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=Config(temperature=0.0)) as rag:
        rag.add_documents([", ".join(words)])
        hit = next(h for h in rag.store.search(rag.encoder.encode_one(question), rag.store.count) if fact in h.text)
        assert hit.text.index(fact) > READ_MAX_CHARS  # past what the hit's beginning holds
        wide = paragraphs(question, [hit], rag.store, limit=1, window=rag.config.reader_window)
    assert len(wide) == 1 and fact in wide[0].text and len(wide[0].text) <= READ_MAX_CHARS
    start = hit.text.index(wide[0].text)  # one part of the hit, from a word's start to a word's end
    assert hit.text[start - 1] == " " and hit.text[start + len(wide[0].text)] == " "


@pytest.mark.parametrize("asset", SHIPPED, ids=lambda p: p.name)
def test_calibration_is_for_the_shipped_reader(asset):
    """A new reader.onnx needs `make calibrate` (both backends): the certificate is about the model it was measured with."""
    import hashlib

    from edge_rag.reading.reader import READER_ASSET

    raw = json.loads(asset.read_text(encoding="utf-8"))["readers"]
    if "neural" not in raw or not READER_ASSET.is_file():
        pytest.skip("no neural reader shipped or calibrated yet")
    assert raw["neural"]["model_sha256"] == hashlib.sha256(READER_ASSET.read_bytes()).hexdigest()



def _edited_calibration(tmp_path: Path, edit: Callable[[dict], None]) -> Path:
    """A copy of the shipped calibration with ``edit`` applied to its parsed JSON."""
    raw = json.loads(CALIBRATION_ASSET.read_text(encoding="utf-8"))
    edit(raw)
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    return path


def test_a_reader_the_calibration_was_not_made_with_refuses_every_question(sample_rag, tmp_path):
    """Retrained reader, old calibration: the risk table says nothing about the new model's mistakes, so
    the certified path refuses everything and says why, instead of answering under a stale certificate."""
    from edge_rag.decision.certified import CertifiedPath
    from edge_rag.reading.read import Candidate

    raw = json.loads(CALIBRATION_ASSET.read_text(encoding="utf-8"))
    if raw["readers"].get("neural", {}).get("model_sha256") is None:
        pytest.skip("no neural calibration shipped yet")
    config = Config(temperature=0.0, certified=True, reader="neural")
    assert CertifiedPath(sample_rag.bundle, config).certificate is not None  # the shipped pair matches

    stale = _edited_calibration(tmp_path, lambda raw: raw["readers"]["neural"].update(model_sha256="0" * 64))
    path = CertifiedPath(sample_rag.bundle, config, stale)
    confident = Candidate("Ada Lovelace", 0, 30.0, -30.0, 60.0)
    verdict = path.decide("Who founded it?", 0.1, confident, sample_rag.store.passages([0, 1]))
    assert path.certificate is None and verdict.route is Route.REFUSE
    assert "reader model" in verdict.reason and "make calibrate" in verdict.reason
    unrecorded = CertifiedPath(sample_rag.bundle, config, _edited_calibration(  # any reader's counts: it cannot say
        tmp_path, lambda raw: raw["readers"]["neural"].pop("model_sha256")))
    assert unrecorded.certificate is None and "records no reader model" in unrecorded.uncertified


def test_a_calibration_measured_with_another_encoder_refuses_every_question(sample_rag, tmp_path):
    """Another encoder model gives every cosine, the fused list and the out-of-domain distance another meaning:
    a calibration measured with one certifies nothing with the bundle's, and the reason names both."""
    from edge_rag.decision.certified import CertifiedPath
    from edge_rag.reading.read import Candidate

    config = Config(temperature=0.0)
    assert CertifiedPath(sample_rag.bundle, config).uncertified is None  # the shipped file: this bundle's encoder
    other = _edited_calibration(tmp_path, lambda raw: raw["source"]["encoder"].update(
        name="sentence-transformers/all-mpnet-base-v2", dim=768))
    path = CertifiedPath(sample_rag.bundle, config, other)
    verdict = path.decide("Who founded it?", 0.1, Candidate("Ada Lovelace", 0, 30.0, -30.0, 60.0),
                          sample_rag.store.passages([0, 1]))
    assert path.certificate is None and verdict.route is Route.REFUSE and verdict.reason == path.uncertified
    assert verdict.reason.startswith("not calibrated for this bundle's encoder (name: calibrated "
                                     "'sentence-transformers/all-mpnet-base-v2', now 'sentence-transformers/all-MiniLM-L6-v2'; "
                                     "dim: calibrated 768, now 384)")
    unreadable = _edited_calibration(tmp_path, lambda raw: raw["source"].update(encoder="MiniLM"))
    assert CertifiedPath(sample_rag.bundle, config, unreadable).uncertified.startswith(
        "the encoder the calibration was measured with cannot be read ('MiniLM')")


def test_a_store_whose_passages_were_cut_otherwise_is_not_certified(sample_rag, bundle_dir, tmp_path):
    """The Config check sees how the asking Config would cut documents; the store records how its own were cut. A
    store indexed as paragraphs and asked under the default Config is refused, naming both kinds; the default's
    store is certified."""
    assert sample_rag.store.passage_kinds == {"sentence:20"} and sample_rag.certified.certificate is not None
    db, text = tmp_path / "db", "The Harbourlight Science Museum was founded in 1887 by Ada Lovelace. It opens at nine."
    with EdgeRAG(db, bundle=bundle_dir, config=Config(temperature=0.0, passage_mode="paragraph")) as paragraphs:
        paragraphs.add_documents([text])
        assert paragraphs.certified.certificate is None  # passage_mode is a decision input
    with EdgeRAG(db, bundle=bundle_dir, config=Config(temperature=0.0)) as asked:
        a = asked.decide("Who founded the Harbourlight Science Museum?")
        assert asked.store.passage_kinds == {"paragraph:20"} and asked.certified.certificate is None
        assert a.route is Route.REFUSE and a.refusal_reason == asked.certified.uncertified
        assert a.refusal_reason.startswith("not calibrated for this store's passages (cut as paragraph:20; the "
                                           "calibration measured sentence:20")


def test_passages_another_process_adds_to_an_open_store_are_checked_at_the_next_question(bundle_dir, tmp_path):
    """A kiosk's server keeps its store open while another process (an upload, `edge-rag index`) adds documents,
    perhaps cut under another Config: the store's record is read again when its version moves, so the next question
    is refused naming the new kind, and the health block the kiosk page shows says so too."""
    db, question = tmp_path / "db", "Who founded the Harbourlight Science Museum?"
    with EdgeRAG(db, bundle=bundle_dir, config=Config(temperature=0.0)) as kiosk:
        kiosk.add_documents(["The Harbourlight Science Museum was founded in 1887 by Ada Lovelace."])
        kiosk.decide(question)
        assert kiosk.certified.certificate is not None and decision(kiosk)["certified"]
        with EdgeRAG(db, bundle=bundle_dir, config=Config(temperature=0.0, passage_mode="paragraph")) as other:
            other.add_documents(["The museum's café opens at nine. It closes at five."])
        a = kiosk.decide(question)
        assert kiosk.store.passage_kinds == {"paragraph:20", "sentence:20"} and kiosk.certified.certificate is None
        assert a.route is Route.REFUSE and a.refusal_reason == kiosk.certified.uncertified
        assert a.refusal_reason.startswith("not calibrated for this store's passages (cut as paragraph:20;")
        assert decision(kiosk)["certified"] is False and decision(kiosk)["reason"] == a.refusal_reason


class _HeldAfterItsKinds:
    """A store whose passage kinds, once read, are held until ``go`` is set (``read`` says when): a check of the
    store's version paused between reading the kinds and recording what they certify."""

    def __init__(self, store) -> None:
        self.store, self.read, self.go = store, threading.Event(), threading.Event()

    @property
    def version(self) -> int:
        return self.store.version

    @property
    def stamp(self) -> tuple[str, int]:
        return self.store.stamp

    @property
    def passage_kinds(self) -> frozenset[str]:
        kinds = self.store.passage_kinds
        self.read.set()
        assert self.go.wait(300)
        return kinds


def test_a_check_of_an_older_version_never_writes_last(bundle_dir, tmp_path):
    """check_store recorded the state of whichever check wrote last: a question's check that read the kinds of the
    store's last version before another process added passages of another kind, and wrote after a later question's
    check had seen them, left the path certifying a store it does not certify (certified at version 3, whose
    paragraph passages it never measured, after the later check had refused). The newest version checked wins now."""
    db = tmp_path / "db"
    with EdgeRAG(db, bundle=bundle_dir, config=Config(temperature=0.0)) as kiosk:
        kiosk.add_documents(["The Harbourlight Science Museum was founded in 1887 by Ada Lovelace."])
        path, held = kiosk.certified, _HeldAfterItsKinds(kiosk.store)
        older = threading.Thread(target=path.check_store, args=(held,))
        older.start()
        assert held.read.wait(300)  # it has the kinds of the version before the other process's commit
        with EdgeRAG(db, bundle=bundle_dir, config=Config(temperature=0.0, passage_mode="paragraph")) as other:
            other.add_documents(["The museum's café opens at nine. It closes at five."])
        path.check_store(kiosk.store)  # the next question's check: another kind, nothing certified
        assert path.certificate is None
        held.go.set()
        older.join(300)
        assert path.certificate is None and path.uncertified.startswith("not calibrated for this store's passages")


def test_a_check_of_a_store_made_again_since_never_writes_last(bundle_dir, tmp_path):
    """A store made again at the same place restarts its versions at 1, under another identity: check_store takes the
    new store's state at its first version (it waited for the old one's version before), and a check that read the
    old store, writing after it, never brings the old store's state back."""
    with EdgeRAG(tmp_path / "old", bundle=bundle_dir, config=Config(temperature=0.0)) as kiosk:
        for year in (1887, 1888):
            kiosk.add_documents([f"The Harbourlight Science Museum was founded in {year} by Ada Lovelace."])
        path, held = kiosk.certified, _HeldAfterItsKinds(kiosk.store)
        older = threading.Thread(target=path.check_store, args=(held,))
        older.start()
        assert held.read.wait(300)  # it has the old store's kinds, certified
        with EdgeRAG(tmp_path / "new", bundle=bundle_dir, config=Config(temperature=0.0, passage_mode="paragraph")) as new:
            new.add_documents(["The museum's café opens at nine. It closes at five."])
            assert new.store.version < kiosk.store.version
            path.check_store(new.store)  # the next question's check, on the store made again
            assert path.certificate is None and path.uncertified.startswith("not calibrated for this store's passages")
            held.go.set()
            older.join(300)
            assert path.certificate is None and path.uncertified.startswith("not calibrated for this store's passages")


def test_generated_answers_are_certified_only_with_the_generator_they_came_from(sample_rag, tmp_path):
    """The GPT route's counts were measured on one generator's answers: with another (the tiny profile's SmolLM2
    against gemma's counts) generation is not certified at any alpha, while the reader's certificate stands."""
    from edge_rag.decision.certified import CertifiedPath
    from edge_rag.reading.read import Candidate

    config, question = Config(temperature=0.0, max_error_rate=0.99), "Why is the museum called Harbourlight?"
    assert CertifiedPath(sample_rag.bundle, config).gpt_allowed  # gemma's counts, gemma's bundle

    def smollm(raw: dict) -> None:
        for entry in raw["readers"].values():
            entry["gpt"]["generator"] = "HuggingFaceTB/SmolLM2-135M-Instruct"
    path = CertifiedPath(sample_rag.bundle, config, _edited_calibration(tmp_path, smollm))
    verdict = path.decide(question, 0.0, Candidate(None, None, 0.0, 0.0, 0.0), [])
    assert path.certificate is not None and not path.gpt_allowed
    assert verdict.route is Route.REFUSE and "generated answers are not certified for this generator" in verdict.reason
    assert "the calibration counted HuggingFaceTB/SmolLM2-135M-Instruct's" in path.gpt_refused


def test_a_config_the_shipped_calibration_was_not_measured_with_refuses_every_question(sample_rag):
    """The shipped table counts the hybrid search's and the +-3-sentence reader's mistakes: under dense retrieval the
    certified path refuses every question and says which field differs, as for a stale reader; the default is
    certified, and so is another alpha."""
    question = "Who founded the Harbourlight Science Museum?"
    assert sample_rag.decide(question).route is Route.RAG
    with EdgeRAG(sample_rag.store.folder, bundle=sample_rag.bundle.root,
                 config=Config(temperature=0.0, retrieval="dense")) as dense:
        a = dense.decide(question)
        assert dense.certified.certificate is None and a.route is Route.REFUSE and a.candidate
        assert a.refusal_reason == dense.certified.uncertified
        assert "retrieval: calibrated 'hybrid', now 'dense'" in a.refusal_reason and "calibrate again" in a.refusal_reason
    with EdgeRAG(sample_rag.store.folder, bundle=sample_rag.bundle.root,
                 config=Config(temperature=0.0, max_error_rate=0.5)) as lenient:
        assert lenient.certified.uncertified is None and lenient.decide(question).route is Route.RAG


def test_the_kiosk_footer_says_the_shipped_bound_is_not_measured_on_its_questions(sample_rag):
    """The shipped certificate holds for SQuAD-2 and HotpotQA questions (14 of the shipped 1,247 are HotpotQA's): the
    kiosk's one-line summary says so, not more."""
    from edge_rag.serve.health import decision

    d = decision(sample_rag)
    assert d["certified"] and not d["own_calibration"] and not d["generation_certified"]  # alpha 0.4: see below
    assert d["generation_reason"] == "generated answers are not certified at alpha 0.4"
    assert d["summary"] == (f"Answers certified: error ≤ {sample_rag.config.max_error_rate * 100:g}% among answered "
                            f"(δ {sample_rag.config.delta:g}), measured on {d['calibration_questions']:,} SQuAD-2 and "
                            "HotpotQA questions (the shipped calibration), not on this kiosk's questions")
    with EdgeRAG(sample_rag.store.folder, bundle=sample_rag.bundle.root,
                 config=Config(temperature=0.0, max_error_rate=0.99)) as lenient:
        assert decision(lenient)["generation_certified"] and decision(lenient)["generation_reason"] is None


def test_why_questions_are_generated_only_at_an_alpha_that_certifies_generation(sample_rag):
    """The GPT route answers a why question the reader cannot only if the calibration's generated answers meet alpha
    themselves: the shipped ones (most of them wrong) do not at the default alpha, and do at 0.99."""
    from edge_rag.decision.certified import CertifiedPath
    from edge_rag.reading.read import Candidate

    question, nothing = "Why is the museum called Harbourlight?", Candidate(None, None, 0.0, 0.0, 0.0)
    default = CertifiedPath(sample_rag.bundle, Config(temperature=0.0)).decide(question, 0.0, nothing, [])
    assert default.route is Route.REFUSE and "generated answers are not certified" in default.reason
    lenient = CertifiedPath(sample_rag.bundle, Config(temperature=0.0, max_error_rate=0.99))
    assert lenient.decide(question, 0.0, nothing, []).route is Route.GPT
    assert lenient.decide("Who founded the museum?", 0.0, nothing, []).route is Route.REFUSE  # not a why question


def test_generated_answers_are_certified_only_as_they_were_generated(sample_rag):
    """The shipped GPT counts are of greedy answers: sampled at the default temperature, or from longer contexts, a
    why question is refused at an alpha those counts meet, saying which setting differs; the reader's certificate
    and its answers stand."""
    from edge_rag.decision.certified import CertifiedPath
    from edge_rag.reading.read import Candidate

    question, nothing = "Why is the museum called Harbourlight?", Candidate(None, None, 0.0, 0.0, 0.0)
    greedy = Config(temperature=0.0, max_error_rate=0.99)
    longer = {**greedy.tiers, Tier.HARD: replace(greedy.tiers[Tier.HARD], context_chars=1200)}
    for config, named in ((Config(max_error_rate=0.99), "temperature: calibrated 0.0, now 0.4"),
                          (greedy.with_(tiers=longer), "900, 128, True)], now [")):
        path = CertifiedPath(sample_rag.bundle, config)
        verdict = path.decide(question, 0.0, nothing, [])
        assert path.certificate is not None and path.uncertified is None and not path.may_generate
        assert verdict.route is Route.REFUSE and named in verdict.reason and path.gpt_refused in verdict.reason
    with EdgeRAG(sample_rag.store.folder, bundle=sample_rag.bundle.root, config=Config(max_error_rate=0.99)) as rag:
        assert rag.decide("Who founded the Harbourlight Science Museum?").route is Route.RAG
        assert not rag.plan.generator  # nothing certified to generate: llama.cpp is not planned or loaded


def test_the_reader_is_loaded_once_when_the_first_questions_arrive_together(sample_rag, monkeypatch):
    """A kiosk's first visitors ask at once, on the server's threads: one reader is loaded (the memory plan counts
    one), and every thread reads with it."""
    import threading

    from edge_rag.decision import certified

    loads = []

    class Counted(certified.NeuralReader):
        def __init__(self, *args, **kwargs):
            loads.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(certified, "NeuralReader", Counted)
    path = certified.CertifiedPath(sample_rag.bundle, Config(temperature=0.0))
    passages, start, spans = sample_rag.store.passages([0, 1]), threading.Barrier(6), []

    def ask() -> None:
        start.wait()
        spans.append(path.read("Who founded the Harbourlight Science Museum?", passages, passages, sample_rag.store, 0.0))
    threads = [threading.Thread(target=ask) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(loads) == 1 and len(spans) == 6 and len({s.text for s in spans}) == 1


def test_the_planned_path_keeps_its_certificate_and_keys_answers_by_the_planned_config(sample_rag):
    """EdgeRAG builds its certified path before the memory plan (whether it may generate decides the plan) and then
    hands it the planned config: the certificate stays, the answer cache's key follows the config, and a config that
    changes a decision input is refused rather than certified by a certificate chosen for another."""
    path = sample_rag.certified
    smaller = path.planned(path.config.with_(encode_batch_tokens=256, n_ctx=2048))
    assert smaller.certificate == path.certificate and smaller.may_generate == path.may_generate
    assert smaller.cache_version(sample_rag.store) != path.cache_version(sample_rag.store)
    assert path.planned(path.config).cache_version(sample_rag.store) == path.cache_version(sample_rag.store)
    with pytest.raises(ValueError, match="only in n_ctx and encode_batch_tokens"):
        path.planned(path.config.with_(max_error_rate=0.5))


def test_the_certificates_share_delta_so_the_error_among_all_answered_questions_holds(bundle, tmp_path):
    """The promise is about every answered question, and the path answers by three certificates: the single-hop
    threshold, the multi-hop one and the GPT route's count. When every answer of every kind is wrong with probability
    p just above alpha, anything the path answers is an error rate above alpha, so the chance that any of the three
    certifies must be <= delta. Exactly, by binomial sums over the counts a calibration of the shipped sizes (1,247
    single-hop and 95 multi-hop questions, 40 generated answers) can draw, each decided by CertifiedPath itself: each
    certificate chosen at the whole delta made that chance 0.103 (0.038, 0.034 and 0.034), twice the promise."""
    from edge_rag.decision.calibrated_config import backend, encoder_identity
    from edge_rag.decision.certified import CertifiedPath, reader_sha256
    from edge_rag.decision.certify import FEATURES, binom_cdf
    from edge_rag.decision.kind import FORM
    from edge_rag.reading.read import Candidate

    config = Config(temperature=0.0)  # generated as the counted answers were: the GPT route may answer
    p, sizes = config.max_error_rate + 0.001, {"single": 1247, "multi": 95, "gpt": 40}  # wrong just above alpha
    short, long = "Who founded it?", "Who founded the museum that the city beside the river of the old county built?"

    def combiner(features: tuple[str, ...], weights: list[float], mean: list[float]) -> dict:
        return {"features": list(features), "weights": weights, "bias": 0.0, "mean": mean, "scale": [1.0] * len(features)}

    def table(n: int, errors: int) -> dict:  # one threshold, 0: every question answered
        return {"thresholds": [0.0], "n_answered": [n], "n_errors": [errors], "n_cal": n}

    def answers(part: str, errors: int) -> bool:
        counts = {**sizes, part: errors}
        kinds = {"model": combiner(FORM, [1.0] + [0.0] * (len(FORM) - 1), [10.0] * len(FORM)),  # > 10 words: multi-hop
                 "cut": 0.5, "tables": {"multi-hop": table(sizes["multi"], counts["multi"])}}
        raw = {"readers": {"neural": {
            "combiner": combiner(FEATURES, [0.0] * len(FEATURES), [0.0] * len(FEATURES)),
            "table": table(sizes["single"], counts["single"]), "ood_distance": 1.0, "kinds": kinds,
            "gpt": {"n": sizes["gpt"], "errors": counts["gpt"]}, "model_sha256": reader_sha256(bundle)}},
            "source": {"config": repr(config), "encoder": encoder_identity(bundle), "backend": backend(False)}}
        (tmp_path / "calibration.json").write_text(json.dumps(raw), encoding="utf-8")
        path = CertifiedPath(bundle, config, tmp_path / "calibration.json")
        if part == "gpt":
            return path.gpt_allowed
        verdict = path.decide(short if part == "single" else long, 0.0, Candidate("Ada", 0, 1.0, 0.0, 1.0), [])
        assert verdict.fields["kind"] == ("single-hop" if part == "single" else "multi-hop")
        return verdict.route is Route.RAG

    certified = {}
    for part, n in sizes.items():  # fewer errors never certify less: the most errors certified, by bisection
        low, high = -1, n  # answers(low) or low = -1; not answers(high)
        assert not answers(part, n)
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if answers(part, mid) else (low, mid)
        certified[part] = binom_cdf(low, n, p)  # P(errors <= low): the chance this certificate answers
    anything = 1 - math.prod(1 - q for q in certified.values())
    assert anything <= config.delta, certified


def test_a_calibration_counted_on_another_kind_of_store_certifies_nothing(bundle):
    """A PostgreSQL store ranks its full-text half otherwise, so its decisions differ from the embedded store's: each
    shipped calibration certifies the kind of store it counted on, and refuses the other's (given as ``calibration``,
    the embedded one's certified a PostgreSQL store, and the PostgreSQL one's an embedded store)."""
    from edge_rag.decision.certified import CertifiedPath

    config = Config(temperature=0.0)
    for remote, mine, other, counted in ((False, CALIBRATION_ASSET, PGVECTOR_CALIBRATION_ASSET, "pgvector"),
                                         (True, PGVECTOR_CALIBRATION_ASSET, CALIBRATION_ASSET, "embedded")):
        assert CertifiedPath(bundle, config, remote=remote).uncertified is None  # the shipped one of its kind
        assert CertifiedPath(bundle, config, mine, remote=remote).uncertified is None  # the same, given
        path = CertifiedPath(bundle, config, other, remote=remote)
        assert path.certificate is None
        assert path.uncertified.startswith(f"not calibrated for this kind of store (calibrated on a '{counted}' store")


def test_answers_cached_under_other_certificates_are_not_served(sample_rag, monkeypatch):
    """A persisted answer cache outlives an upgrade of edge-rag, and the rule that chooses a certificate from the same
    calibration file may change with it (sharing delta moved the default threshold 0.481 -> 0.499): the cache's key
    was the config and the file's hash only, so answers decided by the old threshold were served under the new one."""
    from edge_rag.decision.certified import CertifiedPath
    from edge_rag.decision.certify import ReaderCalibration

    config = Config(temperature=0.0)
    now = CertifiedPath(sample_rag.bundle, config)
    with monkeypatch.context() as older:  # the rule of an earlier edge-rag: each certificate at the whole delta
        older.setattr(ReaderCalibration, "tests", property(lambda self: 1))
        before = CertifiedPath(sample_rag.bundle, config)
    assert before.calibration_sha256 == now.calibration_sha256 and before.config == now.config
    assert before.certificate.threshold < now.certificate.threshold
    assert before.cache_version(sample_rag.store) != now.cache_version(sample_rag.store)
    same = CertifiedPath(sample_rag.bundle, config)  # the key is stable for the same certificates
    assert same.cache_version(sample_rag.store) == now.cache_version(sample_rag.store)
