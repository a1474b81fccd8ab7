"""Checks both stores' tests run: how a store records the kinds of its passages (stores.passage_kind), and the
titles it lists."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edge_rag.documents.chunk import make_document
from edge_rag.storage.store_db import Part


def check_the_kinds_of_passages_are_recorded(open_as: Callable[[str], object], dim: int) -> None:
    """``open_as(kind)`` opens one store, adding passages of ``kind``. Each commit that adds passages records its
    kind beside those before; a removal changes nothing; passages of no stated kind make the record unknown for
    good (empty, like a store from before the record), since what else it holds can no longer be told."""
    def add(store, tag: str) -> str:
        doc = make_document(f"The {tag} gallery opens at nine.", tag)
        vector = np.random.default_rng(len(tag)).normal(size=(1, dim)).astype(np.float32)
        store.add([Part(doc, 0, [doc.text], last=True, sha=doc.doc_id)], vector / np.linalg.norm(vector))
        return doc.doc_id

    stores = [open_as(kind) for kind in ("paragraph:20", "sentence:20", "", "sentence:20")]
    paragraph, sentence, unstated, later = stores
    assert paragraph.passage_kinds == frozenset()  # nothing stored yet
    first = add(paragraph, "east")
    assert paragraph.passage_kinds == {"paragraph:20"}
    add(sentence, "west")
    assert sentence.passage_kinds == paragraph.passage_kinds == {"paragraph:20", "sentence:20"}
    sentence.remove([first])
    assert sentence.passage_kinds == {"paragraph:20", "sentence:20"}  # what the store held is not re-read
    add(unstated, "north")
    add(later, "south")
    assert unstated.passage_kinds == later.passage_kinds == frozenset()
    for store in stores:
        store.close()


def check_titles_in_the_order_added(store, dim: int) -> None:
    """``titles(n)``: the first n titled documents' titles in the order they were added (what the kiosk suggests
    questions from), the untitled left out; a document edited since moves to the end (it was added again)."""
    def add(title: str, texts: list[str]) -> None:
        doc = make_document(" ".join(texts), title, doc_id=title or "untitled")
        vectors = np.random.default_rng(len(texts)).normal(size=(len(texts), dim)).astype(np.float32)
        store.add([Part(doc, 0, texts, last=True, sha=doc.text)], vectors / np.linalg.norm(vectors, axis=1)[:, None],
                  remove=[doc.doc_id] if store.document(doc.doc_id) else [])

    assert store.titles(5) == []
    add("Zebra house", ["The zebras live in the east paddock.", "They are fed at noon."])
    add("", ["A note without a title."])
    add("Aquarium", ["The aquarium opens at ten."])
    add("Bird hall", ["Owls sleep by day.", "Parrots talk.", "Kestrels hover."])
    assert store.titles(5) == ["Zebra house", "Aquarium", "Bird hall"] and store.titles(2) == ["Zebra house", "Aquarium"]
    add("Zebra house", ["The zebras moved to the west paddock."])
    assert store.titles(5) == ["Aquarium", "Bird hall", "Zebra house"]
