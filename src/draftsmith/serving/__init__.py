"""The SGLang serving benchmark: the target alone, then with the exported draft for each k.

- `command`: launch commands and the refusals that keep the numbers honest.
- `metrics`: /generate requests and answers, acceptance length, throughput, speed-up.
- `bench`: server lifetimes, single-stream and concurrent passes, the stage entry point.
"""
