"""Tool-call parsers, one module per wire format (see ``parsers/registry.py``)."""
