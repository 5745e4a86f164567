"""Stage `hidden`: the shard assignment (`assign`), the disk and time estimate
(`estimate`), extraction with transformers (`hf`) or SGLang (`sglang`), the rules' entries
(`stage`)."""
