"""Reasoning parsers."""
