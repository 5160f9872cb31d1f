"""`rubric_jax.strict_json`: every JSON the project writes is strict JSON, NaN and infinities as null."""

import json
import math

import numpy as np
import pytest

from rubric_jax import strict_json


def strict_loads(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_floats_become_null_at_any_depth():
    value = {"a": math.nan, "b": [math.inf, (1.5, -math.inf)], "c": {"d": np.float64("nan"), "e": "NaN"}, "f": 2}
    text = strict_json.dumps(value)
    assert strict_loads(text) == {"a": None, "b": [None, [1.5, None]], "c": {"d": None, "e": "NaN"}, "f": 2}
    assert strict_json.json_ready((1, math.nan)) == [1, None]
    with pytest.raises(ValueError, match="not JSON"):
        strict_loads(json.dumps(value))  # what json.dumps alone writes

