"""Stage `train`: the training data plan (`data`), the training state with checkpoints and
exact resume (`state`), the loop (`loop`), the data-parallel group (`process_group`) and
its processes (`launch`), the rules' entries (`stage`)."""
