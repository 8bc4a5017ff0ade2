"""Grammar pieces for constrained decoding: GBNF literals, the thinking prefix, schema checks.

Pure: the JSON-schema-to-GBNF conversion itself is llama.cpp's (through the
engine); this package only decides what to constrain and refuses schemas that
conversion would not enforce.
"""

from ._refs import child_schemas as child_schemas
from ._refs import resolve_pointer as resolve_pointer
from .gbnf import MAX_REQUEST_RULES as MAX_REQUEST_RULES
from .gbnf import THINK_BODY as THINK_BODY
from .gbnf import check_request_grammar as check_request_grammar
from .gbnf import literal as literal
from .gbnf import thinking_prefix as thinking_prefix
from .schema import check_schema as check_schema
from .schema import output_grammar as output_grammar
from .schema import path_segment as path_segment
