"""Hidden-state extraction: shard plan, the hf backend, and the plan report."""
