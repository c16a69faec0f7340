"""Tool calling: the types, the formats models write calls in, their parsers and grammars.

Below the engine's request handling and above nothing of the HTTP layer: the engine renders
a request's tools into its prompt, constrains its calls with a grammar, and parses what the
model wrote into calls; the three APIs only translate at their doors.
"""

from .family import Family, ParseContext
from .reading import output_parser, read_output
from .types import (ArgumentsDelta, ChoiceMode, Delta, ParsedOutput, ReasoningDelta, TextDelta, Tool, ToolCall,
                    ToolCallStart, ToolChoice, ToolFormat)

__all__ = ["ArgumentsDelta", "ChoiceMode", "Delta", "Family", "ParseContext", "ParsedOutput", "ReasoningDelta",
           "TextDelta", "Tool", "ToolCall", "ToolCallStart", "ToolChoice", "ToolFormat",
           "output_parser", "read_output"]
