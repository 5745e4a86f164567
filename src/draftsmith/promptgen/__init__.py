"""Offline generators of prompt files: training and held-out prompt sets built from the
docstrings (`docstrings`) and source (`long_context`) of installed Python code, and sets in
four styles with provenance (`styles`). Run them as `draftsmith promptgen docstrings|styles|
long-context ...`; the files they write are inputs a config names, so nothing in the
pipeline imports this package (tests/workflow/test_architecture.py checks it)."""
