"""The content-addressed store: stage keys (`keys`), the artifact plan (`plan`), hashing,
manifests, journals, staged outputs, verification, migration, gc."""
