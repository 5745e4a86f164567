"""Load prompt datasets declared in config, validating every row.

Sources are a JSONL file (`.jsonl`/`.json`, one object per line), a Parquet
file, or a directory written by `datasets`' `save_to_disk`. Rows become chat
prompts (a message list ending with a user turn); every row that cannot become
one is reported as a `BadRow`, never dropped silently. A dataset whose share of
bad rows exceeds `max_bad_fraction` is a `DatasetError`.

The modules, each importing only those before it here:

- `rows`: what a row becomes, `Prompt` or `BadRow`, the `LoadedDataset` and `Bad`
  (raised for a row that cannot become a prompt);
- `sources`: opening JSONL, Parquet and `save_to_disk` sources, the bound on a JSONL
  line, a raw row as an object;
- `conversations`: the three row formats as chat messages (roles and their order,
  tool calls, tool turns, reasoning, `tools`), and `structured_calls` for backends;
- `load`: `load_prompts`: lengths, bad-row accounting and the source hash check.
"""
