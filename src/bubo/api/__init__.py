"""The HTTP edge: one subpackage per wire dialect, each translating to and from the domain.

``openai/`` (chat, completions, models), ``llamacpp/`` (llama-server's own
endpoints and metrics), ``ops`` (health and readiness).  Dialects never import
each other; what they share lives in the private modules beside them.
"""
