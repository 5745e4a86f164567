"""Stage `serve_bench`: SGLang servers with and without the draft (launch commands and
refusals in `command`, payloads and metrics in `metrics`, the rule's entry in `stage`).

Exported for the evaluator's recommended launch: the algorithm and the launch check."""

from draftsmith.serve_bench.command import EAGLE3, check_launch

__all__ = ["EAGLE3", "check_launch"]
