"""A speculative-decoding setting: chain or tree, its label, its file-name slug, its check,
and the name of the target alone.

A setting is SGLang's (num_steps, topk, num_draft_tokens): draft steps per verify step,
drafts kept per step, tokens verified per step (the root included). topk 1 is a chain of
k = num_steps, which verifies num_steps + 1 tokens: SGLang replaces any other
num_draft_tokens by that with only a warning, so a setting asking for another is refused
rather than reported under a shape it does not have. Every report names a setting by its
`label` ("k=3", "tree 3/2/6"); file names use its `slug` ("k3", "tree3-2-6").

No torch here: config validation and the report import this module.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

BASELINE = "baseline"  # the label (and slug) of the target alone, without a draft


def max_draft_tokens(num_steps: int, topk: int) -> int:
    """The most nodes a tree round can verify, root included: topk children of the root,
    then at each further step the topk children of each of the topk frontier nodes."""
    return 1 + topk + (num_steps - 1) * topk * topk


@dataclass(frozen=True)
class Speculation:
    """A speculative setting as SGLang's launch flags name it (`check` says whether it is valid)."""

    num_steps: int
    topk: int
    num_draft_tokens: int

    @classmethod
    def chain(cls, num_steps: int) -> Speculation:
        """The chain of k = `num_steps` draft tokens."""
        return cls(num_steps, 1, num_steps + 1)

    @classmethod
    def of(cls, entry: dict) -> Speculation:
        """The setting of a config entry or a report row (its other fields ignored)."""
        return cls(entry["num_steps"], entry["topk"], entry["num_draft_tokens"])

    @property
    def is_chain(self) -> bool:
        return self.topk == 1

    @property
    def shape(self) -> str:
        """num_steps/topk/num_draft_tokens, as tables show a tree."""
        return f"{self.num_steps}/{self.topk}/{self.num_draft_tokens}"

    @property
    def label(self) -> str:
        """The setting's name in every report: "k=3" for a chain, "tree 3/2/6" for a tree."""
        return f"k={self.num_steps}" if self.is_chain else f"tree {self.shape}"

    @property
    def slug(self) -> str:
        """The setting's name in file names: "k3", "tree3-2-6"."""
        if self.is_chain:
            return f"k{self.num_steps}"
        return f"tree{self.num_steps}-{self.topk}-{self.num_draft_tokens}"

    def as_json(self) -> dict[str, int]:
        return asdict(self)

    def check(self) -> None:
        """Raise ValueError unless a tree of this shape can be built and SGLang runs it as given."""
        if self.topk < 1:
            raise ValueError(f"topk must be >= 1, got {self.topk}")
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if self.is_chain and self.num_draft_tokens != self.num_steps + 1:
            raise ValueError(
                f"topk 1 is a chain, which SGLang runs with num_draft_tokens = num_steps + 1 "
                f"({self.num_steps + 1}), not {self.num_draft_tokens}"
            )
        most = max_draft_tokens(self.num_steps, self.topk)
        if not 2 <= self.num_draft_tokens <= most:
            raise ValueError(
                f"num_draft_tokens must be between 2 and {most} (the root plus the nodes a tree of "
                f"num_steps={self.num_steps}, topk={self.topk} generates), got {self.num_draft_tokens}"
            )
