"""Recipes by name: `register(name)` on an `Algorithm` subclass; `algorithm_class(name)` for a config's
`algorithm.name` (the trainer validates `algorithm.params` into the class's `config_class`)."""

from rubric_jax.algorithms.base import Algorithm

_ALGORITHMS: dict[str, type[Algorithm]] = {}


def register(name: str):
    """Class decorator registering an Algorithm subclass under `name` (ValueError if taken)."""

    def decorate(cls: type[Algorithm]) -> type[Algorithm]:
        if name in _ALGORITHMS:
            raise ValueError(f"an algorithm named {name!r} is already registered")
        if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
            raise ValueError(f"algorithm {name!r} must be an Algorithm subclass, got {cls!r}")
        _ALGORITHMS[name] = cls
        return cls

    return decorate


def names() -> list[str]:
    return sorted(_ALGORITHMS)


def algorithm_class(name: str) -> type[Algorithm]:
    if name not in _ALGORITHMS:
        raise ValueError(f"config key algorithm.name: unknown algorithm {name!r}; registered: {names()}")
    return _ALGORITHMS[name]

