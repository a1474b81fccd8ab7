"""edge-rag: retrieval-augmented question answering on the device, inside a memory budget."""
from .config import Config, Tier, TierSpec
from .errors import BudgetError, BundleError, EdgeRAGError, InputError, StoreError
from .pipeline import EdgeRAG
from .types import Answer, Document, Passage, Route

__version__ = "0.1.0"

__all__ = [
    "Answer", "BudgetError", "BundleError", "Config", "Document", "EdgeRAG", "EdgeRAGError",
    "InputError", "Passage", "Route", "StoreError", "Tier", "TierSpec", "__version__",
]
