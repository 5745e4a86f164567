"""Stage `responses`: the target answers each dataset's prompts through a backend (`hf`,
`openai_api`, `sglang`), journaled and resumable (`stage`)."""
