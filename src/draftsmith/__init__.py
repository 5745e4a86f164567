"""draftsmith: a Make-style build system for EAGLE-3 draft models."""

__version__ = "0.1.0"
