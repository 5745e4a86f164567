"""What every style's module shares: the row a style proposes (`Candidate`), the name math
and chat rows record as their generator, and the held-out shares of chat and prose."""

from __future__ import annotations

from dataclasses import dataclass

# A larger share than the module split's: chat and prose have a few hundred split keys,
# and a held-out set should still span several subjects or distributions.
CHAT_HELDOUT_SHARE = 0.08
PROSE_HELDOUT_SHARE = 0.1
# The generator's recorded name in math and chat rows (not __name__): the module's name
# before it moved to promptgen, kept so that files it wrote stay byte-identical.
GENERATOR = "draftsmith.style_prompts"


@dataclass(frozen=True)
class Candidate:
    held: bool
    row: dict
