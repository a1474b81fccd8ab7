"""Answer generation with llama.cpp (llama-cpp-python) on a GGUF model.

The prompt asks for a short answer from the evidence only (``prompt``: the question and context stay plain text).
Decoding is our own short loop over ``Llama.generate`` so we can count tokens exactly and stop degenerate output with
a sliding-window n-gram repetition detector (EverydayGPT §4.3).

One llama.cpp context serves every thread: decoding holds a lock (two threads decoding on one context crash
llama.cpp) on a thread of its own, never the stream reader's, and each question starts from a fresh sampler and a
KV cache that holds only the prompt template's fixed prefix (the instructions, the one-shot example: the same tokens
at the same positions for every question, evaluated on their own once), so the same question at temperature 0 gives
the same answer whatever was generated before it.
"""
from __future__ import annotations

import os
import queue
import re
import threading
from collections import abc, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..config import Config, default_threads
from ..documents.text import whole_sentences
from ..errors import BundleError, ConfigError, InputError, check_str
from .llama_log import errors_only, interrupts_after
from .prompt import Template

# End-of-turn pieces of the common chat templates (Gemma, ChatML, Llama 3, GPT-2 style): a bundle's profile may add
# its own (manifest generator "stop"); they end an answer like the vocabulary's EOS.
END_OF_TURN = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|endoftext|>")
Ended = tuple[bool, BaseException | None]  # a decode thread's last item: the answer was cut off; what it raised


@dataclass(frozen=True)
class Generation:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cut: bool = False  # cut off (budget, repetition) and trimmed to its whole sentences


class RepetitionDetector:
    """Flags degenerate output: the newest n-gram already occurred within the last ``window`` tokens."""

    def __init__(self, n: int = 3, window: int = 48) -> None:
        self.n = n
        self.tokens: deque[int] = deque(maxlen=window)

    def push(self, token: int) -> bool:
        self.tokens.append(token)
        if len(self.tokens) < self.n + 1:
            return False
        seq = list(self.tokens)
        last = tuple(seq[-self.n :])
        return any(tuple(seq[i : i + self.n]) == last for i in range(len(seq) - self.n))


# Tokens n_ctx must leave the evidence, and as many the question: at n_ctx 100 Gemma's prompt held "Context: The
# Normans" and "Question: When", and it answered "1066" from its own knowledge, or "1889" from the one-shot example.
MIN_EVIDENCE = 64


def room(n_ctx: int, fixed: int, max_new_tokens: int) -> tuple[int, int]:
    """(the answer's budget, the tokens ``n_ctx`` leaves beside it and a template of ``fixed`` tokens for the question
    and the evidence: at least 2 * MIN_EVIDENCE, or no answer is generated)."""
    answer = min(max_new_tokens, n_ctx // 4)  # the room the evidence never takes
    return answer, n_ctx - max(1, answer) - fixed


# The prompt template's own tokens by model file (path, mtime) and prompt style, known once it was loaded.
_FIXED: dict[tuple[Path, int, str], int] = {}


def _check_room(config: Config, fixed: int) -> None:
    answer, left = room(config.n_ctx, fixed, max(spec.max_new_tokens for spec in config.tiers.values()))
    if left < 2 * MIN_EVIDENCE:
        raise ConfigError(f"n_ctx {config.n_ctx} cannot hold the generator's prompt template ({fixed} tokens), an "
                          f"answer ({max(1, answer)}) and {2 * MIN_EVIDENCE} tokens of question and evidence: set "
                          "Config(n_ctx) higher (default 1024)")


class Generator:
    """A GGUF model loaded once; ``generate`` answers a question from a context."""

    def __init__(self, gguf_path: str | Path, prompt_style: str = "one-shot", n_ctx: int = 1024,
                 threads: int = 0, seed: int = 0, stop: tuple[str, ...] = ()) -> None:
        # llama.cpp's OpenMP workers spin while they wait for work; beside the encoder's threads (answers
        # run in parallel) or any other busy process they starve each other: one 16-token answer took
        # 26 s instead of 0.9 s on a busy 2-core box. Passive waiting must be set before libgomp loads.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        from llama_cpp import Llama  # imported here: the RAG route never needs llama.cpp

        errors_only()
        path = Path(gguf_path)
        if not path.is_file():
            raise BundleError(f"generator model missing: {path}")
        try:
            # flash attention (llama.cpp's own default; llama-cpp-python turns it off unless asked): without it a
            # token's attention holds and reads scores against every earlier position, so a long prompt costs more
            # time and memory the further it goes (docs/decisions/flash-attention.md)
            with interrupts_after():  # Ctrl-C in llama.cpp's log callback, which ctypes swallowed
                self.llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads or default_threads(),
                                 n_batch=min(512, n_ctx), flash_attn=True, seed=seed, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise BundleError(f"llama.cpp cannot load {path}: {exc}") from exc
        self.prompt_style, self.template = prompt_style, Template(self.llm, prompt_style)
        self.path, self.n_ctx = path.resolve(), n_ctx  # what another EdgeRAG checks before using this model
        self.stop = frozenset(END_OF_TURN + tuple(stop))
        self._stop_text = re.compile("|".join(re.escape(piece) for piece in self.stop))
        # the template's tokens before the first field: two prompts that differ in every field share exactly these
        a, b = self.template.tokens("a", "a"), self.template.tokens("b", "b")
        self.prefix = a[: next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)]
        self.fixed = len(self.template.tokens("", ""))  # the template's own tokens, with no question nor evidence
        self._prefix_cached = False  # the KV cache holds the prefix as evaluated alone
        self._lock = threading.Lock()  # one decode at a time on the one context

    @classmethod
    def of(cls, gguf: Path, facts: dict, config: Config) -> Generator:
        """The bundle's model at ``gguf`` (``facts``: the bundle's generator entry) at ``config``'s n_ctx, threads, seed;
        ConfigError if that n_ctx cannot hold its prompt template, a tier's answer and evidence: every generation
        would fail so (an InputError at each question, as if the visitor's); the template's length is known once loaded,
        and kept: asked again, that n_ctx is refused before the model is loaded again."""
        style, path = facts.get("prompt_style", "one-shot"), Path(gguf)
        known = (path.resolve(), path.stat().st_mtime_ns if path.is_file() else 0, style)  # missing: cls says so
        if known in _FIXED:  # refused before loading it again: each question reloaded it (0.75 s) to fail so
            _check_room(config, _FIXED[known])
        generator = cls(gguf, style, config.n_ctx, config.threads, config.seed, tuple(facts.get("stop", ())))
        _FIXED[known] = generator.fixed
        _check_room(config, generator.fixed)
        return generator

    def serves(self, gguf: Path | None, n_ctx: int) -> bool:
        """Whether this is the model at ``gguf`` loaded for ``n_ctx`` (so an EdgeRAG planned for it may use it)."""
        return gguf is not None and self.path == Path(gguf).resolve() and self.n_ctx == n_ctx

    def generate(self, question: str, context: str, max_new_tokens: int = 64, temperature: float = 0.4,
                 top_k: int = 50, seed: int = 0, repeat_ngram: int = 3, repeat_window: int = 48) -> Generation:
        *_, gen = self.stream(question, context, max_new_tokens, temperature, top_k, seed, repeat_ngram,
                              repeat_window)
        assert isinstance(gen, Generation)  # stream's last item, after the text pieces
        return gen

    def stream(self, question: str, context: str, max_new_tokens: int = 64, temperature: float = 0.4,
               top_k: int = 50, seed: int = 0, repeat_ngram: int = 3, repeat_window: int = 48,
               stopped: Callable[[], bool] = lambda: False) -> Iterator[str | Generation]:
        """``generate`` as it happens: answer text pieces, then the Generation. A piece is sent once its
        sentence has ended (the rest when the model ends the answer itself), so a visitor never sees a
        fragment the answer then drops: the pieces joined are always a prefix of the final text and equal
        to it at the end. An answer cut off (token budget, repetition) keeps only its whole sentences.
        ``stopped`` (its caller closed) ends the decoding at the next token, or before it begins: a RuntimeError."""
        prompt, max_new_tokens = self.fit(question, context, max_new_tokens)
        out: list[int] = []
        shown = ""
        decoding = self.tokens(prompt, max_new_tokens, temperature, top_k, seed, repeat_ngram, repeat_window, stopped)
        while True:
            try:
                out.append(next(decoding))
            except StopIteration as end:
                cut: bool = end.value
                break
            ready = whole_sentences(self.text(out))
            if len(ready) > len(shown) and ready.startswith(shown):
                yield ready[len(shown):]
                shown = ready
        text = whole_sentences(self.text(out), finished=True) if cut else self.text(out)
        if len(text) > len(shown):
            yield text[len(shown):]
        yield Generation(text, len(prompt), len(out), cut)

    def tokens(self, prompt: list[int], max_new_tokens: int, temperature: float = 0.4, top_k: int = 50,
               seed: int = 0, repeat_ngram: int = 3, repeat_window: int = 48,
               stopped: Callable[[], bool] = lambda: False) -> abc.Generator[int, None, bool]:
        """The answer's tokens as they are decoded; returns whether it was cut off (budget, repetition rule).

        A thread decodes holding the context at its own pace, not the consumer's: a stream paused (or kept unread)
        holds no other question up, nor deadlocks the next one on its thread; closing or dropping it ends the
        decoding at the next token. A token is yielded once the repetition rule can no longer take it back (it
        drops the last ``repeat_ngram`` tokens of a repeat): a stream never shows what the answer will not contain."""
        found: queue.SimpleQueue[int | Ended] = queue.SimpleQueue()  # at most max_new_tokens + 1 items
        cancel, decoding = threading.Event(), threading.Event()

        def decode() -> bool:
            self._keep_prefix(prompt)
            self.llm.set_seed(seed)
            out: list[int] = []
            sent, cut = 0, False
            detector = RepetitionDetector(repeat_ngram, repeat_window)
            for token in self.llm.generate(prompt, top_k=top_k, top_p=1.0, min_p=0.0, temp=temperature,
                                           repeat_penalty=1.0, reset=True):
                if cancel.is_set() or stopped() or self.llm.token_eos() == token or self._is_end_of_turn(token):
                    break
                out.append(token)
                if self._stops(out):
                    break
                if detector.push(token):
                    del out[-repeat_ngram:]
                    cut = True
                    break
                if len(out) >= max_new_tokens:
                    cut = True
                    break
                while sent < len(out) - repeat_ngram:
                    found.put(out[sent])
                    sent += 1
            for token in out[sent:]:
                found.put(token)
            return cut

        def run() -> None:
            try:
                with self._lock:
                    decoding.set()
                    try:
                        cut = not cancel.is_set() and not stopped() and decode()  # not if dropped while it waited
                    finally:  # generate()'s sampler holds a vocabulary of candidates (3 MB for Gemma's) in a reference
                        sampler, self.llm._sampler = self.llm._sampler, None  # cycle: freed now, not at a full gc
                        if sampler is not None:
                            sampler.close()
                if stopped():  # a closed EdgeRAG's: the questions queued for the context wasted it for seconds each
                    raise RuntimeError("the generation was stopped: its EdgeRAG was closed")
                found.put((cut, None))  # once the lock is released: a stream read to its end leaves the context free
            except BaseException as exc:  # noqa: BLE001 - raised again in the consumer's thread
                found.put((False, exc))

        worker = threading.Thread(target=run, name="edge-rag-decode")
        worker.start()
        try:
            while isinstance(item := found.get(), int):
                yield item
        finally:
            cancel.set()
            if decoding.is_set() and worker is not threading.current_thread():
                worker.join()  # a closed stream's decoding has ended (within one token) when close() returns
        if item[1] is not None:
            raise item[1]
        return item[0]

    def fit(self, question: str, context: str, max_new_tokens: int) -> tuple[list[int], int]:
        """Prompt tokens and the answer length that fit in n_ctx: a question longer than half the room is
        cut (characters the encoder ignores can still cost the GPT 4 tokens each), then the context is
        shortened until the answer has its budget, or a quarter of n_ctx if that is less (the evidence is
        never dropped for a budget n_ctx cannot hold: it was, and the model answered from the one-shot
        example); InputError for a budget below 1, text that is not valid Unicode (a lone surrogate raised
        UnicodeEncodeError), or if n_ctx leaves no room for an answer and MIN_EVIDENCE."""
        if max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be at least 1, not {max_new_tokens}")
        question, context = check_str(question, "the question"), check_str(context, "the context")
        q_tokens = self.llm.tokenize(question.encode("utf-8"), add_bos=False, special=False)
        answer, left = room(self.n_ctx, self.fixed, max_new_tokens)
        if left < 2 * MIN_EVIDENCE:
            raise InputError(f"n_ctx {self.n_ctx} cannot hold the prompt template ({self.fixed} tokens), an answer "
                             f"({max(1, answer)}) and {2 * MIN_EVIDENCE} tokens of question and evidence")
        if len(q_tokens) > left // 2:  # keep at least half of the room for evidence
            question = self.llm.detokenize(q_tokens[: left // 2]).decode("utf-8", errors="ignore")
        bare = len(self.template.tokens(question, ""))
        while True:
            tokens = self.template.tokens(question, context)
            if len(tokens) + answer <= self.n_ctx or not context:
                return tokens, min(max_new_tokens, self.n_ctx - len(tokens))
            # a fifth off, or at once the share of the context's tokens that is too many: 20% at a time, a 655K
            # context (ten 64K paragraphs, compression off) was tokenized 27 times over
            over = (len(tokens) + answer - self.n_ctx) / max(1, len(tokens) - bare)
            context = context[: int(len(context) * min(0.8, 1 - over))]

    # -- internals -----------------------------------------------------------------------------
    def _keep_prefix(self, prompt: list[int]) -> None:
        """Forget the previous question but the template's prefix, if this prompt starts with it too.

        The prefix is evaluated on its own, once: llama.cpp's numbers for a token depend a little on the batch it
        was in, so a prefix kept from whichever prompt came first would tie the answer to that prompt, and the same
        question must get the same logits whatever came before. ``Llama.generate`` then evaluates only the rest
        (it reuses the KV cache up to ``n_tokens`` and drops what follows)."""
        n = len(self.prefix)
        if len(prompt) <= n or prompt[:n] != self.prefix:
            self.llm.n_tokens = 0  # evaluated from scratch, prefix included
            self._prefix_cached = False
            return
        if not self._prefix_cached:
            self.llm.reset()
            self.llm.eval(self.prefix)
            self._prefix_cached = True
        self.llm.n_tokens = n

    def text(self, tokens: list[int]) -> str:
        """The answer in ``tokens``: the first line, stripped, up to an end-of-turn piece written as plain text
        (from a document holding "<|im_end|>", tiny answered "Bombilla<|im_end|>")."""
        line = self.llm.detokenize(tokens).decode("utf-8", errors="ignore").split("\n")[0]
        return self._stop_text.split(line, maxsplit=1)[0].strip()

    def _stops(self, out: list[int]) -> bool:
        """An answer is one line: stop at the first newline after some text."""
        text = self.llm.detokenize(out[-2:]).decode("utf-8", errors="ignore")
        return "\n" in text and len(out) > 1

    def _is_end_of_turn(self, token: int) -> bool:
        piece = self.llm.detokenize([token], special=True).decode("utf-8", errors="ignore")
        return piece in self.stop
