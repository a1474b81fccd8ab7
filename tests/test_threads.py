"""One EdgeRAG, many threads: answers identical to serial ones, no crash, deterministic at temperature 0.

Before the generation lock, 8 threads x 25 asks with GPT-route questions killed the process (SIGABRT
in ggml / SIGSEGV in the sampler) every time."""
import gc
import json
import os
import pickle
import signal
import threading
import time

import pytest

from edge_rag.config import Config
from edge_rag.errors import StoreError
from edge_rag.pipeline import EdgeRAG
from edge_rag.types import Route

# Sample-corpus questions that route to generation (found with rag.decide; re-found when retrieval changes) and ones
# answered extractively.
GPT_QUESTIONS = ["Describe the harbour.", "What can children do at the museum?", "Describe the Engine Hall."]
RAG_QUESTIONS = ["Who founded the Harbourlight Science Museum?", "What is Big Mary?",
                 "How much does an adult ticket cost?"]
QUESTIONS = GPT_QUESTIONS + RAG_QUESTIONS


def _open(sample_rag, bundle_dir, **config):
    # the seeds' decision: it generates for GPT_QUESTIONS (the certified default only where generation is certified)
    return EdgeRAG(sample_rag.store.folder, bundle=bundle_dir, config=Config(temperature=0.0, certified=False, **config),
                   create=False)


@pytest.fixture(scope="module")
def serial(sample_rag, bundle_dir):
    """Reference answers, one at a time, cache off."""
    with _open(sample_rag, bundle_dir, cache_size=0) as rag:
        yield {q: rag.ask(q) for q in QUESTIONS}, rag


def _key(answer):
    return answer.route, answer.answer, [p.id for p in answer.passages]


def _hammer(fn, threads: int, per_thread: int) -> tuple[list, list]:
    results, errors = [], []
    start = threading.Barrier(threads)

    def work(t: int) -> None:
        start.wait()
        for i in range(per_thread):
            q = QUESTIONS[(t + i) % len(QUESTIONS)]
            try:
                results.append((q, fn(q)))
            except Exception as exc:  # noqa: BLE001 — any exception is a failure we want to see
                errors.append(repr(exc))

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return results, errors


def test_the_gpt_questions_route_to_generation(serial):
    answers, _ = serial
    assert [answers[q].route for q in GPT_QUESTIONS] == [Route.GPT] * len(GPT_QUESTIONS)
    assert all(answers[q].answer for q in GPT_QUESTIONS)


def test_temperature_zero_answers_do_not_depend_on_earlier_generations(serial):
    answers, rag = serial
    for q in reversed(GPT_QUESTIONS):  # other generations ran in between, in another order
        assert rag.ask(q).answer == answers[q].answer


def test_eight_threads_ask_at_once(serial, sample_rag, bundle_dir):
    """A fresh EdgeRAG (generator not loaded: the lazy load races too), 8 threads x 25 asks."""
    answers, _ = serial
    with _open(sample_rag, bundle_dir) as rag:
        results, errors = _hammer(rag.ask, threads=8, per_thread=25)
    assert errors == [] and len(results) == 200
    assert all(_key(a) == _key(answers[q]) for q, a in results)


def test_eight_threads_decide_at_once(serial):
    answers, rag = serial
    results, errors = _hammer(rag.decide, threads=8, per_thread=25)
    assert errors == [] and len(results) == 200
    assert all(a.route is answers[q].route and [p.id for p in a.passages] == [p.id for p in answers[q].passages]
               for q, a in results)


def test_an_edgerag_used_in_a_forked_child_says_so(serial):
    """An EdgeRAG used after os.fork() (a multiprocessing pool, gunicorn --preload) holds its parent's locks, threads
    and SQLite connections: forked while another thread of the parent generated, 4 children of 4 hung for good on the
    generator's lock (3 of 6 while it answered extractively, one of them aborted in C++); a child whose parent closed
    its EdgeRAG answered from passages removed since ('Margaret Hollins', 468 passages at version 1 for a store of 2 at
    version 3); one closing it hung for good if a question of the parent held the store's lock at the fork (1 of 8).
    Every call in a child, and a stream opened before the fork, is a StoreError saying what to do; close() returns."""
    answers, rag = serial
    question = RAG_QUESTIONS[0]
    stream = rag.ask_stream(question)
    searching, forked = threading.Event(), threading.Event()

    def search() -> None:  # a question of the parent's holds the store's lock while the process forks
        with rag.store._lock:
            searching.set()
            forked.wait(120)

    holder = threading.Thread(target=search)
    holder.start()
    searching.wait(60)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports, then leaves without returning into pytest
        try:
            signal.alarm(30)  # a child that hangs is killed: its pipe closes, the parent reads what it wrote
            said = []
            for call in (lambda: rag.decide(question), lambda: rag.ask(question), lambda: next(stream)):
                try:
                    call()
                    said.append("answered")
                except StoreError as exc:
                    said.append(str(exc))
            rag.close()
            os.write(write, json.dumps([*said, "closed"]).encode())
        finally:
            os._exit(0)
    forked.set()
    holder.join(60)
    os.close(write)
    with os.fdopen(read) as child:
        said = child.read()
    os.waitpid(pid, 0)
    assert said and json.loads(said)[-1] == "closed" and all("before a fork" in s for s in json.loads(said)[:-1]), said
    stream.close()
    assert _key(rag.ask(question)) == _key(answers[question])  # the parent's is unchanged


def test_an_edgerag_sent_to_another_process_says_to_open_one_there(serial):
    """pool.map(rag.ask, questions) pickles the EdgeRAG: it failed on whichever attribute came first, an AttributeError
    "Can't pickle local object 'plan.<locals>.price'" (fork and spawn pools alike), naming nothing the caller wrote."""
    _, rag = serial
    with pytest.raises(TypeError, match="EdgeRAG cannot be pickled .* open one in each process"):
        pickle.dumps(rag.ask)


def test_a_forked_child_that_drops_its_inherited_edgerag_exits(sample_rag, bundle_dir):
    """Freeing an onnxruntime session joins its thread pool's workers, which in a forked child are its parent's
    threads: a child that dropped the EdgeRAG it inherited, closed it and exited, or only exited (sys.exit, as a
    gunicorn worker does), hung for good (3 of 3 each, the default Config; killed by an alarm after 30 s). The child
    keeps the sessions it inherited and exits."""
    rag = EdgeRAG(sample_rag.store.folder, bundle=bundle_dir, config=Config(threads=2), create=False)
    rag.ask(RAG_QUESTIONS[0])  # its sessions have run: their workers are started
    pid = os.fork()
    if pid == 0:
        try:
            signal.alarm(30)  # a child that hangs is killed
            del rag
            gc.collect()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    rag.close()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the child was killed by signal {os.WTERMSIG(status)}"


def test_a_question_waiting_for_the_generator_when_its_edgerag_closes_is_not_generated(serial, sample_rag, bundle_dir):
    """close() stopped no generation: questions queued for the one llama.cpp context each generated in turn after it
    (4 GPT questions asked at once, closed 0.5 s in: 3 generations began after close(), the last answer came 9.0 s after
    it, every thread 'answered'). Decoding now ends with the EdgeRAG: a queued question never starts (a StoreError
    saying it was closed, all 4 within 0.06 s), and the generator it shares with another EdgeRAG answers on there."""
    answers, other = serial
    rag = EdgeRAG(sample_rag.store.folder, bundle=bundle_dir, config=Config(temperature=0.0, certified=False,
                  cache_size=0), create=False, generator=other.generator)
    outcome: list[object] = []

    def ask() -> None:
        try:
            outcome.append(rag.ask(GPT_QUESTIONS[0]))
        except StoreError as exc:
            outcome.append(exc)

    asking = threading.Thread(target=ask)
    with other.generator._lock:  # another question decodes on the context the two EdgeRAGs share
        asking.start()
        deadline = time.monotonic() + 60
        while not any(t.name == "edge-rag-decode" for t in threading.enumerate()) and time.monotonic() < deadline:
            time.sleep(0.01)  # until the question waits for the context (its decoding thread started)
        rag.close()
    asking.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], StoreError) and "closed" in str(outcome[0]), outcome
    assert _key(other.ask(GPT_QUESTIONS[0])) == _key(answers[GPT_QUESTIONS[0]])
