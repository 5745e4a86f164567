"""The EAGLE-3 draft: vocabulary mapping, model and training-time-test loss, training, export."""
