"""The EAGLE-3 draft network shared by training, export and evaluation: the model and its
training-time-test loss (`model`), the TTT attention (`attention`), the draft vocabulary's
d2t/t2d mapping (`vocab`)."""
