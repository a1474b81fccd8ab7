"""edge-rag: retrieval-augmented question answering on the device, inside a memory budget."""
import os
from typing import TYPE_CHECKING

# onnxruntime 1.32 on Linux writes a device id into ~/.cache and sends usage events to Microsoft
# unless this is set before it loads; the device runs offline and keeps nothing of its own. "0" keeps it on.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

from .config import Config, Tier, TierSpec
from .errors import (
    BudgetError,
    BundleError,
    ConfigError,
    DiskFullError,
    EdgeRAGError,
    InputError,
    StoreBusy,
    StoreError,
    StoreUnavailable,
)
from .types import Answer, Document, Passage, Route

if TYPE_CHECKING:  # what mypy and IDEs see: without it, EdgeRAG was Any to them, and a call's mistakes went unchecked
    from .pipeline import EdgeRAG

__version__ = "0.1.0"


def __getattr__(name: str):
    """``EdgeRAG`` is imported on first use: the light commands (``models verify``/``install``) then load
    no hnswlib or llama.cpp, whose source builds may use this build host's SIMD extensions."""
    if name == "EdgeRAG":
        from .pipeline import EdgeRAG

        return EdgeRAG
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "Answer", "BudgetError", "BundleError", "Config", "ConfigError", "DiskFullError", "Document", "EdgeRAG",
    "EdgeRAGError", "InputError", "Passage", "Route", "StoreBusy", "StoreError", "StoreUnavailable", "Tier",
    "TierSpec", "__version__",
]
