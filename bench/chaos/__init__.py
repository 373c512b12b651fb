"""Reliability evidence: the kill sweep and fault scenarios behind ``python -m bench chaos``."""
