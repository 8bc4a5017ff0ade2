"""GGUF files the tests build at test time with the ``gguf`` package: no model hub, no torch."""
