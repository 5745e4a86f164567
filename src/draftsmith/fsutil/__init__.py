"""File-level utilities below every other package (the file formats and the artifact
store alike): content hashes and atomic writes."""
