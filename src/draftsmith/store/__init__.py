"""The content-addressed store: stage keys (`keys`), the artifact plan (`plan`), hashing,
atomic writes, manifests, journals, staged outputs, verification, migration, gc."""
