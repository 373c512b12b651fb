"""Thin Lambda entry points; everything that decides anything lives in shared/."""
