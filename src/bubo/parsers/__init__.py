"""Streaming output parsers: reasoning (``<think>``) and tool-call wire formats.

Each parser is a sans-IO state machine: ``feed(text)`` returns the output
events the text completes, ``finish()`` flushes what is held back.  Feeding an
output whole or one character at a time yields the same events, once adjacent
deltas of the same kind are joined (a property test checks it).
"""

from .base import ParserConfig as ParserConfig
from .base import StreamParser as StreamParser
from .reasoning.think import ThinkParser as ThinkParser
from .registry import available_tool_parsers as available_tool_parsers
from .registry import make_tool_parser as make_tool_parser
