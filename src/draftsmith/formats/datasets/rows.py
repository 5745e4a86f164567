"""What a dataset row becomes: a `Prompt` or a `BadRow`; the `LoadedDataset`."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Prompt:
    id: str
    index: int
    line: int | None
    messages: list[dict]
    tools: list[dict] | None = None  # function schemas the chat template and the backend see


@dataclass
class BadRow:
    index: int
    line: int | None
    field: str | None
    reason: str
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class LoadedDataset:
    name: str
    prompts: list[Prompt]
    bad_rows: list[BadRow]
    total_rows: int
    skipped_over_cap: int


class Bad(Exception):
    """A row that cannot become a prompt; caught per row and turned into a BadRow."""

    def __init__(self, reason: str, field: str | None, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.field, self.detail = reason, field, detail
