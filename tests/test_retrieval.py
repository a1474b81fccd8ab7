"""Paragraph-level retrieval on the SQuAD 2.0 subset: open corpus of all its paragraphs."""


def test_squad_recall_at_5(squad_rag):
    rag, items = squad_rag
    answerable = [q for q in items if not q.is_impossible]
    vectors = rag.encoder.encode([q.question for q in answerable])
    hits = 0
    for q, v in zip(answerable, vectors):
        docs = {p.doc_id for p in rag.store.search(v, 5)}
        hits += bool(docs & q.gold_doc_ids)
    recall = hits / len(answerable)
    print(f"SQuAD paragraph Recall@5 = {recall:.3f} over {len(answerable)} answerable questions")
    assert recall >= 0.80
