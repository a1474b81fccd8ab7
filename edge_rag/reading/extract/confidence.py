"""Eq. 1 of EverydayGPT, the extractive answer's confidence, computed on the supporting sentence.

c = min(1, min(|w|/25, 1)·0.3 + ovlp(q, ·)·0.4 + η·0.3). On the span itself a 2-word answer has
ovlp(q, span) ≈ 0 by construction and |w|/25 ≈ 0.1, so c < τ = 0.5 for ~94% of questions whatever their
quality; hence the sentence. |w|/25 is capped at 1 so a long sentence cannot buy confidence. η = 1.5 when
the answer has the shape its type asks for (date, number, name, cue clause, option, yes/no); 1.0 when
the sentence carries the type's evidence but the span fell back to an open phrase; 0.3 otherwise,
including open "what ...?" factoids, which have no shape to check — that is what makes c rank answers
(AUC 0.68 for F1 >= 0.5 on SQuAD; 0.65 if open factoids got 1.0).
"""
from __future__ import annotations

from .cues import WORD
from .rank import Sentence

# Eq. 1: c = min(1, min(|w|/25, 1)·0.3 + ovlp·0.4 + η·0.3) on the supporting sentence.
CONF_WORDS, CONF_W_LEN, CONF_W_OVLP, CONF_W_ETA = 25, 0.3, 0.4, 0.3
ETA_TYPED, ETA_PARTIAL, ETA_NONE = 1.5, 1.0, 0.3


def confidence(sentence: Sentence, q_stems: set[str], eta: float) -> float:
    """Eq. 1 on the supporting sentence: a 2-word span would overlap the question by ~0 by design."""
    n_words = len(WORD.findall(sentence.text))
    ovlp = len(q_stems & sentence.stems) / len(q_stems)
    return min(1.0, min(n_words / CONF_WORDS, 1.0) * CONF_W_LEN + ovlp * CONF_W_OVLP + eta * CONF_W_ETA)

