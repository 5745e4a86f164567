"""The file formats stages share: dataset sources, the response record, the held-out split
of the merged data, the hidden-state shard, prompt sets, Markdown tables."""
