"""Stage `evaluate`: lossless chain speculative decoding of held-out prompts with the
target and the exported draft (`spec_decode`), and the rule's entry (`stage`)."""
