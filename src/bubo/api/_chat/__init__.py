"""The OpenAI chat-completions request, which three routes read: its wire model and its translation.

``/v1/chat/completions`` (OpenAI), ``/apply-template`` (llama-server) and ``/debug/prompt``.
"""
