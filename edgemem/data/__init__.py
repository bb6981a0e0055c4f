"""Offline corpora (`corpora`) and the long-context tasks built from them (`tasks`)."""
