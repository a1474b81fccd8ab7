"""What both stores check in their meta before using it: the vectors' dimension and the encoder that made them."""
from __future__ import annotations

from ..errors import StoreError


def check_meta(meta: dict[str, str], dim: int, encoder_id: str, where: str, redo: str) -> None:
    """StoreError unless the store ``where`` holds ``dim``-d vectors of encoder ``encoder_id`` (or nothing yet);
    ``redo``: where to re-index instead."""
    if "dim" in meta and int(meta["dim"]) != dim:
        raise StoreError(f"store {where} holds {meta['dim']}-d vectors, the encoder makes {dim}-d")
    if encoder_id and meta.get("encoder") and meta["encoder"] != encoder_id:
        raise StoreError(f"store {where} was indexed with another encoder ({meta['encoder'][:12]}…); "
                         f"re-index into a new {redo}")
