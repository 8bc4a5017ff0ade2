"""The neutral vocabulary every layer shares: attrs value types, no HTTP, no llama.cpp.

This package imports nothing else from Bubo (``tests/test_architecture.py``).
"""
