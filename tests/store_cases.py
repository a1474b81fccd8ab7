"""One check of how a store records the kinds of its passages (stores.passage_kind) that both stores' tests run."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edge_rag.chunk import make_document
from edge_rag.store_db import Part


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
