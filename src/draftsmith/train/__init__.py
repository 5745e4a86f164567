"""Stage `train`: the training data plan (`data`), the loop with checkpoints and exact
resume (`loop`), the rules' entries (`stage`)."""
