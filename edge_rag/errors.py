"""Errors a user can act on: each names the file, component or input at fault."""


class EdgeRAGError(Exception):
    """Base class of every error edge-rag raises on purpose."""


class BundleError(EdgeRAGError):
    """The model bundle is missing a file, or a file is corrupt or truncated."""


class StoreError(EdgeRAGError):
    """The passage store or its vector index is missing, corrupt, or out of step."""


class InputError(EdgeRAGError, ValueError):
    """A question or document that cannot be used (empty, too long, undecodable)."""


class BudgetError(EdgeRAGError):
    """The memory budget cannot hold a component; the message names it and the numbers."""


class ConfigError(EdgeRAGError, ValueError):
    """A Config field holds a value outside what it allows; the message names the field and the allowed values."""
