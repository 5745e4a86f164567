"""Response generation: one output per dataset, resumable through a journal.

`records` defines the response record every backend produces; `stage` drives a
dataset through a backend; the backends live in `hf`, `openai_api` and `sglang`.
"""
