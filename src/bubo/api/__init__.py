"""The HTTP edge: one subpackage per wire dialect, each translating to and from the domain.

``openai/`` (chat completions, completions, models), ``responses/`` (OpenAI's
Responses API), ``anthropic/`` (Messages, count_tokens), ``llamacpp/``
(llama-server's own endpoints and metrics), ``ollama/`` (Ollama's ``/api/*``);
``ops`` (health and readiness) and ``debug`` (the ``--debug-hooks`` routes)
belong to no dialect.  Dialects never
import each other; what they share lives in the private modules beside them.
"""
