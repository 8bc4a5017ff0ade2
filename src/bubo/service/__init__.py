"""Use cases: render and count prompts, admit generations, shape their output.

Below the HTTP edge and above the engine: nothing here knows a wire dialect.
"""
