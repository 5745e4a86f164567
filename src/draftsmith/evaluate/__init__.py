"""The built-in evaluator: lossless chain speculative decoding of held-out prompts with
the target and the exported draft (`spec_decode`), the prompt sets and their overlap
check (`prompts`), and the `evaluate` rule's stage (`stage`)."""
