"""Stage `serve_bench`: SGLang servers with and without the draft (launch commands and
refusals in `command`, payloads and metrics in `metrics`, the rule's entry in `stage`)."""
