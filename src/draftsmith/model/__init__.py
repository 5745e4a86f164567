"""Stage `model`: fetching and converting the target (`source`), recording its shapes and
special tokens (`stage`)."""
