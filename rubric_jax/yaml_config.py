"""YAML configs mapped onto frozen dataclasses: strict, validated before any compute, overridable by `key.sub=value`.

Generic (it knows no config of the project), so that both the data layer (a task's `params`) and the trainer
(the run configs) read their configs with it; it imports nothing from the project.

- `config_from_dict(cls, data)` builds a (nested) frozen dataclass from plain data. Every error is a ValueError
  naming the full key (`optimizer.warmup_steps`): an unknown key (with the known ones listed), a missing
  required key, a value of the wrong type, or a combination the dataclass's own `__post_init__` rejects.
- Types read: bool (only true / false), int (not a bool, not 2.5), float (an int is accepted, and so is a
  string in exponent notation such as `3e-6`, which YAML 1.1 reads as a string for want of a dot), str,
  `Optional[T]` (null), `tuple[T, ...]` (a YAML list), `Literal[...]`, nested dataclasses (a YAML mapping), and
  `dict[str, Any]`: free-form parameters (a YAML mapping) validated by their owner, such as an algorithm's
  `params`, which the trainer reads into the algorithm's own config class; and `dict[str, T]` with T a
  dataclass: named sections (a YAML mapping of names to mappings), each read as T under the key `<key>.<name>`.
  Any other annotation is a programmer error (TypeError when the config is read).
- A section given in part keeps, for the keys it leaves out, the values of the field's default: with
  `rollout: RolloutConfig = RolloutConfig(group_size=16)`, the YAML `rollout: {temperature: 0.7}` gives
  group_size 16, not RolloutConfig's own default.
- `apply_overrides(data, ["optimizer.learning_rate=3e-6", ...])` sets nested keys before validation; each
  value is read as YAML (`1e-6`, `true`, `null`, `[1, 2]`, `cosine`), so overrides type-check like the file.
- `load_config(cls, path, overrides)` = read the YAML file, apply the overrides, build (a path that is no file is
  a ValueError too, so that every problem of a config is one); `config_to_dict` and
  `save_config` write the fully resolved config (every field, defaults included) back as YAML, which
  `load_config` reads to the same config.
"""

import dataclasses
import os
import re
import types
import typing
from typing import Any, Mapping, Sequence, TypeVar, Union

import yaml

T = TypeVar("T")

_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _read(annotation: Any, value: Any, key: str) -> Any:
    """`value` as `annotation`, or ValueError naming `key` (module docstring)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if dataclasses.is_dataclass(annotation):
        return config_from_dict(annotation, value, key)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) != 1:
            raise TypeError(f"config key {key}: only Optional[T] unions are supported, got {annotation}")
        return _read(options[0], value, key)
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"config key {key}: expected one of {list(args)}, got {value!r}")
        return value
    if origin is tuple:
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"config key {key}: only tuple[T, ...] is supported, got {annotation}")
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"config key {key}: expected a list, got {value!r}")
        return tuple(_read(args[0], item, f"{key}[{i}]") for i, item in enumerate(value))
    if annotation is dict or origin is dict:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise ValueError(f"config key {key}: expected a mapping with string keys, got {value!r}")
        if len(args) == 2 and dataclasses.is_dataclass(args[1]):
            return {name: config_from_dict(args[1], item, _join(key, name)) for name, item in value.items()}
        # Free-form parameters checked later by their owner (an algorithm's or a task's own config class).
        return _deep_copy(value)
    if annotation is bool:
        if not isinstance(value, bool):
            raise ValueError(f"config key {key}: expected true or false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"config key {key}: expected an int, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"config key {key}: expected a number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ValueError(f"config key {key}: expected a string, got {value!r}")
        return value
    raise TypeError(f"config key {key}: unsupported annotation {_type_name(annotation)}")


def config_from_dict(cls: type[T], data: Any, key: str = "") -> T:
    """The frozen dataclass `cls` from plain data (module docstring); `key` prefixes error messages."""
    where = key or "<root>"
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ValueError(f"config key {where}: expected a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        known = ", ".join(sorted(fields))
        raise ValueError(f"unknown config key {_join(key, str(unknown[0]))} (known keys of {where}: {known})")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, field in fields.items():
        if name in data:
            value = data[name]
            if dataclasses.is_dataclass(field.default) and isinstance(value, Mapping):
                # The keys a section leaves out keep the enclosing default's values, not the section class's.
                value = merged(config_to_dict(field.default), value)
            values[name] = _read(hints[name], value, _join(key, name))
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ValueError(f"missing config key {_join(key, name)}")
    try:
        return cls(**values)
    except ValueError as error:
        raise ValueError(f"config {where}: {error}") from None


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of `data` with each `a.b.c=value` set (value read as YAML); ValueError for a malformed override
    or a key path that runs through a non-mapping value."""
    result = _deep_copy(data)
    for override in overrides:
        path, sep, text = override.partition("=")
        names = path.strip().split(".")
        if not sep or not all(names):
            raise ValueError(f"override {override!r} is not of the form key.sub=value")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise ValueError(f"override {override!r}: the value is not valid YAML: {_yaml_problem(error)}") from None
        node = result
        for i, name in enumerate(names[:-1]):
            child = node.setdefault(name, {})
            if not isinstance(child, dict):
                raise ValueError(f"override {override!r}: {'.'.join(names[:i + 1])} is not a mapping")
            node = child
        node[names[-1]] = value
    return result


def _yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's error in one line: the problem and where (its own message spans several lines)."""
    mark = getattr(error, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{getattr(error, 'problem', None) or error}{where}"


def merged(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `update`'s keys set, mappings merged key by key (a section's defaults under its YAML; a dataset
    preset under the task's params)."""
    result = _deep_copy(base)
    for name, value in update.items():
        if isinstance(value, Mapping) and isinstance(result.get(name), Mapping):
            result[name] = merged(result[name], value)
        else:
            result[name] = value
    return result


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def load_config(cls: type[T], path: Union[str, os.PathLike], overrides: Sequence[str] = ()) -> T:
    """`cls` from the YAML file at `path` with `overrides` applied (module docstring); ValueError when `path` does
    not exist or is a directory."""
    if not os.path.isfile(path):
        raise ValueError(f"config file {path} " + ("is a directory" if os.path.isdir(path) else "does not exist"))
    with open(path, encoding="utf-8") as f:
        try:
            data = yaml.safe_load(f)
        except yaml.YAMLError as error:
            raise ValueError(f"{path}: not valid YAML: {_yaml_problem(error)}") from None
    if data is not None and not isinstance(data, Mapping):
        raise ValueError(f"{path}: the top level must be a mapping of config keys")
    return config_from_dict(cls, apply_overrides(data or {}, overrides))


def config_to_dict(config: Any) -> dict[str, Any]:
    """Every field of a (nested) config dataclass as plain YAML-able data; tuples become lists."""

    def plain(value):
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return plain(config)


def save_config(config: Any, path: Union[str, os.PathLike]) -> None:
    """Writes the fully resolved `config` as YAML (keys in field order)."""
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(config_to_dict(config), f, sort_keys=False)
