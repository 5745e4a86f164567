"""Stage `vocab`: the draft vocabulary from the supervised tokens of the training split."""
