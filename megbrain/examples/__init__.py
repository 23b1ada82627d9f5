"""Runnable examples (``python -m megbrain.examples.digits``)."""
