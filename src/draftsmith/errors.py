"""Errors a user sees: each names the file, line or field at fault."""

from __future__ import annotations

import os


class DraftsmithError(RuntimeError):
    """Base class: a clear, actionable failure (no traceback needed to understand it)."""


class ConfigError(DraftsmithError, ValueError):
    """A configuration problem, with the key path at fault in the message."""


class DataError(DraftsmithError):
    """Bad data in a file: the message starts with `file:line: field:` where known."""

    def __init__(
        self,
        message: str,
        path: str | os.PathLike | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.path, self.line, self.field = path, line, field
        where = "".join(
            (
                f"{path}" if path is not None else "",
                f":{line}" if line is not None else "",
                ": " if path is not None else "",
                f"{field}: " if field else "",
            )
        )
        super().__init__(where + message)


class DatasetError(DataError):
    pass


class InputChangedError(DraftsmithError):
    """An input's content is not what the job's output key was computed from: the input
    changed after the job was planned (or while it read it). Nothing is written."""


class TokenizeError(DataError):
    pass


class DiskFullError(DraftsmithError):
    """A write ran out of space: names the file and what its file system has left."""


class ModelError(DraftsmithError):
    pass


class GenerationError(DraftsmithError):
    pass


class BudgetReached(GenerationError):
    """The configured spend cap was reached; finished records stay in the journal."""


class ServerError(DraftsmithError):
    """A server a job started failed to come up (or was already taken)."""
