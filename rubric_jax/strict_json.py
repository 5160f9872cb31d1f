"""JSON as RFC 8259 defines it: no NaN, Infinity or -Infinity, which Python's `json` writes by default as bare
tokens that strict readers (JavaScript's JSON.parse, jq, most other languages) reject.

Every JSON file and line the project writes (metrics, reports, summaries, records) goes through `json_ready`: a
float that is not finite becomes null, a tuple a list; containers are converted recursively, anything else is
left for `json` to write or refuse (a NumPy float32 is no Python float: convert it first). `dumps` is
`json.dumps` of that with `allow_nan=False`. This module imports nothing from the project, so every layer but
`core` may use it (DESIGN.md's import rule, tests/test_layering.py).
"""

import json
import math
from typing import Any


def json_ready(value: Any) -> Any:
    """`value` with non-finite floats as None and tuples as lists, recursively through dicts, lists and tuples."""
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """`json.dumps(json_ready(value), allow_nan=False, **kwargs)`: strict JSON text (module docstring)."""
    return json.dumps(json_ready(value), allow_nan=False, **kwargs)
