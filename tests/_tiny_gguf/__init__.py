"""Tiny random-weight GGUFs built at test time with the ``gguf`` package: they prove plumbing, not quality."""
