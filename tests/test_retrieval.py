"""Paragraph-level retrieval on the SQuAD 2.0 subset: open corpus of all its paragraphs."""
from collections import defaultdict

import numpy as np


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
