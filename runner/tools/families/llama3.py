"""Llama 3.1-3.3 and Llama 4.

Llama 3 writes a call as a JSON object, bare at the start of its output or after
<|python_tag|> (which may follow text); several are separated by `;`:

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}

Llama 4 writes a Python list of calls with keyword arguments (its "pythonic" format), bare at the
start or between <|python_start|> and <|python_end|>:

    [get_weather(city='Paris', unit='c'), get_time()]
"""

from ..family import Family, legacy_parse

FAMILY = Family(
    name="llama3",
    description='{"name": ..., "parameters": {...}} or <|python_tag|>{...} (Llama 3.1-3.3); [f(a=1), g()] (Llama 4)',
    parse=legacy_parse("llama3"),
    # Llama 4's template names its tool turns <|header_start|>ipython<|header_end|>.
    fingerprints=(("<|python_tag|>",), ("ipython", "<|start_header_id|>"), ("ipython", "<|header_start|>")),
    markers=("<|python_tag|>", "<|eom_id|>", "<|eot_id|>", "<|python_start|>", "<|python_end|>", "<|eom|>", "<|eot|>"),
    priority=85,
    legacy_format="llama3",
)
