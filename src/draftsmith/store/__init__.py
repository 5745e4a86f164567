"""The content-addressed store: stage keys (`keys`), file names and paths (`layout`), the
artifact plan (`plan`), hashing, manifests, journals, staged outputs, verification, migration, gc."""
