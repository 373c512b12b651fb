"""Text helpers of the app, used by its topic handler."""

from __future__ import annotations


def welcome(name: str) -> str:
    return f"Welcome aboard, {name}!"
