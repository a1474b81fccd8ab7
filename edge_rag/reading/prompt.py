"""The generator's prompt: a question and its context put into the model's template, as text and as tokens.

Base models get a one-shot reading-comprehension prompt (they continue patterns, they do not follow instructions);
instruct models get their own chat template from the GGUF metadata. The question and the context are user text:
they are tokenized as plain text, and only the template's own markers (``<|im_start|>``, ``<|im_end|>``, BOS) are
special tokens, so a document cannot end a turn, forge another or put an end of text in the prompt.
"""
from __future__ import annotations

import re
from typing import Any

from ..errors import BundleError

SYSTEM = "Answer the question using only the context. Reply with a short answer, a few words at most."
ONE_SHOT = (
    "Answer the question using only the context. Answer with a short phrase.\n\n"
    "Context: The Eiffel Tower was completed in 1889 for the World's Fair in Paris, France.\n"
    "Question: When was the Eiffel Tower completed?\n"
    "Answer: 1889\n\n"
    "Context: {context}\n"
    "Question: {question}\n"
    "Answer:"
)
NO_CONTEXT = "(no context)"
FIELDS = ("\ue000", "\ue001")  # private-use stand-ins for the question and the context while the template renders


class Template:
    """The prompt template of one model (``llm``, a llama_cpp.Llama) in ``style`` ("one-shot" or "chat")."""

    def __init__(self, llm: Any, style: str) -> None:
        if style not in ("one-shot", "chat"):
            raise ValueError(f"prompt_style must be 'one-shot' or 'chat', not {style!r}")
        self.llm = llm
        self._chat = _chat_formatter(llm) if style == "chat" else None
        self._parts = self._cut()

    def text(self, question: str, context: str) -> str:
        context = context.strip() or NO_CONTEXT
        if self._chat is None:
            return ONE_SHOT.format(context=context, question=question)
        user = f"Context: {context}\n\nQuestion: {question}"
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
        return self._chat(messages=messages).prompt

    def tokens(self, question: str, context: str) -> list[int]:
        """The tokens of ``text(question, context)``, its fields read as plain text. Parsed whole for special
        tokens, a document holding "<|im_end|>" ended the user's turn and forged the assistant's (tiny then
        answered "Bermuda"), one holding "<end_of_turn>" or "<eos>" put Gemma's control tokens in the prompt."""
        fields = {FIELDS[0]: question, FIELDS[1]: context.strip() or NO_CONTEXT}
        ids: list[int] = []
        text = ""
        for part in self._parts:
            if isinstance(part, int):
                ids += self.llm.tokenize(text.encode("utf-8"), add_bos=not ids, special=False) + [part]
                text = ""
            else:
                text += fields.get(part, part)
        return ids + self.llm.tokenize(text.encode("utf-8"), add_bos=not ids, special=False)

    def _cut(self) -> list[str | int]:
        """The rendered template cut at its fields (FIELDS) and its special tokens (their ids). The text between two
        markers is tokenized on its own, as llama.cpp does when it parses special tokens: a prompt whose fields
        hold none has the tokens the whole prompt parsed for special tokens has."""
        text = self.text(*FIELDS)
        special: dict[str, int] = {}
        for token in self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True):
            piece = self.llm.detokenize([token], special=True)
            if self.llm.tokenize(piece, add_bos=False, special=False) != [token] == self.llm.tokenize(
                    piece, add_bos=False, special=True):  # only parsing special tokens reads its text as it
                special[piece.decode("utf-8")] = token
        cut = "|".join(re.escape(p) for p in sorted([*special, *FIELDS], key=len, reverse=True))
        return [special[part] if part in special else part for part in re.split(f"({cut})", text) if part]


def _chat_formatter(llm: Any) -> Any:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = llm.metadata.get("tokenizer.chat_template")
    if not template:
        raise BundleError("generator GGUF has no chat template; use prompt style 'one-shot'")
    return Jinja2ChatFormatter(
        template=template,
        eos_token=llm.detokenize([llm.token_eos()], special=True).decode(errors="ignore"),
        bos_token=llm.detokenize([llm.token_bos()], special=True).decode(errors="ignore"),
        add_generation_prompt=True,
    )
