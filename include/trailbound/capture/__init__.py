"""Capture (Extract): transaction assembly, the commit-ordered trail, checkpoints."""
