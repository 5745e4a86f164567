"""Errors a user sees: each names the file, line or field at fault."""


class DraftsmithError(RuntimeError):
    """Base class: a clear, actionable failure (no traceback needed to understand it)."""


class DatasetError(DraftsmithError):
    pass


class ModelError(DraftsmithError):
    pass


class GenerationError(DraftsmithError):
    pass


class BudgetReached(GenerationError):
    """The configured spend cap was reached; finished records stay in the journal."""


class TokenizeError(DraftsmithError):
    pass


class ServerError(DraftsmithError):
    """A server a job started failed to come up (or was already taken)."""
