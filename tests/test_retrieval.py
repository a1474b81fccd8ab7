"""Paragraph-level retrieval on the SQuAD 2.0 subset: open corpus of all its paragraphs."""
from collections import defaultdict

import numpy as np

from edge_rag.config import Config
from edge_rag.errors import ConfigError
from edge_rag.models import bundle as B
from edge_rag.retrieval.encode import HEAD_CHARS_PER_TOKEN, Encoder


def test_squad_recall_at_5(squad_default_rag):
    """The dense search of the default store (sentence passages): a question's paragraph among the paragraphs of its
    top 5 sentences, overall and for the worst article (measured when written: 0.912 overall, Huguenot 0.765)."""
    rag, items = squad_default_rag
    answerable = [q for q in items if not q.is_impossible]
    vectors = rag.encoder.encode_alone([q.question for q in answerable])  # as `ask` encodes a question
    found: dict[str, list[bool]] = defaultdict(list)
    for q, v in zip(answerable, vectors):
        found[q.group].append(bool({p.doc_id for p in rag.store.search(v, 5)} & q.gold_doc_ids))
    recall = sum(map(sum, found.values())) / len(answerable)
    worst = min(sum(hits) / len(hits) for hits in found.values())
    print(f"SQuAD paragraph Recall@5 = {recall:.3f} over {len(answerable)} answerable questions, worst article {worst:.3f}")
    assert recall >= 0.85 and worst >= 0.70


def test_questions_are_encoded_alone_as_the_pipeline_does(encoder):
    """An int8 model scales its activations per batch, so benchmarks encode questions one by one
    (Encoder.encode_alone): each row is the text's vector on its own, whatever else the list holds."""
    texts = ["What is Big Mary?", "Who?", "How much does an adult ticket cost at the museum on a Sunday in winter?"]
    alone = encoder.encode_alone(texts)
    assert alone.shape == (3, encoder.dim) and encoder.encode_alone([]).shape == (0, encoder.dim)
    for row, text in zip(alone, texts):
        np.testing.assert_array_equal(row, encoder.encode([text])[0])
    np.testing.assert_array_equal(encoder.encode_alone([texts[0], texts[2]])[0], alone[0])


class _Reading:
    """The tokenizer, noting the characters of every text it is given (observes tokenizers, changes nothing)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.chars = tokenizer, []

    def encode_batch(self, texts):
        self.chars += map(len, texts)
        return self.tokenizer.encode_batch(texts)

    def encode(self, text):
        self.chars.append(len(text))
        return self.tokenizer.encode(text)


def test_a_long_text_is_tokenized_from_its_head_into_the_whole_texts_tokens(encoder, monkeypatch):
    """Only max_seq_len tokens of a passage are kept, but the tokenizer read all of it: ~25 ms for a 60k-character
    passage (a file without sentence ends), 32 s for 256 of them under load here, 1.8 s from their heads. The tokens
    are the whole text's, also where a head cannot hold them (no space, a CJK run, one long word)."""
    words = "alpha beta gamma delta harbour museum lighthouse river valley engine copper station garden".split()
    long = [" ".join(words[(i + j) % len(words)] for j in range(9000)) for i in range(8)]  # ~60k characters each
    hard = ["x" * 60000, "中文文本没有空格" * 4000, "ab " * 3000 + "y" * 5000, ("a" * 99 + " ") * 1000, "Who?"]
    whole = [encoder.tokenizer.encode(t) for t in long + hard]
    reading = _Reading(encoder.tokenizer)
    monkeypatch.setattr(encoder, "tokenizer", reading)
    got = encoder._tokenize(long)
    assert sum(reading.chars) <= HEAD_CHARS_PER_TOKEN * encoder.max_seq_len * len(long) < sum(map(len, long)) / 10
    got += encoder._tokenize(hard)
    assert [(list(t.ids), list(t.attention_mask), list(t.type_ids)) for t in got] == [
        (w.ids, w.attention_mask, w.type_ids) for w in whole]


def test_every_max_seq_len_config_accepts_cuts_a_text_to_it(bundle):
    """Config(max_seq_len=1) was accepted, but the tokenizer ignores a truncation shorter than its [CLS] and [SEP]:
    every text was kept whole (302 tokens of a 300-word one), priced by the plan at 1 token, and a passage past the
    model's 512 positions failed indexing with onnxruntime's broadcast error. Each length Config accepts is kept."""
    text = " ".join(["museum"] * 600)
    for seq in (1, 2, 3):
        try:
            Config(max_seq_len=seq)
        except ConfigError:
            continue
        encoder = Encoder(bundle.require(B.ROLE_ENCODER), bundle.require(B.ROLE_TOKENIZER), seq, threads=1)
        assert len(encoder._tokenize([text])[0].ids) <= seq
        assert encoder.encode_one(text).shape == (encoder.dim,)
