"""The target model as later stages use it: loading (`load`), the dtype map (`dtypes`),
special tokens (`special_tokens`), aux-layer conventions (`layers`)."""
