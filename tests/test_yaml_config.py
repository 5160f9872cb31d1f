"""Configs: YAML onto frozen dataclasses, each kind of bad config a clear error, overrides, resolved round trip."""

import dataclasses
from typing import Literal, Optional

import pytest

from rubric_jax.training.optim import OptimizerConfig
from rubric_jax.yaml_config import (
    apply_overrides,
    config_from_dict,
    config_to_dict,
    load_config,
    save_config,
)


@dataclasses.dataclass(frozen=True)
class Rollout:
    group_size: int = 8
    temperature: float = 1.0
    stop: tuple[str, ...] = ()
    engine: Literal["embedded", "sglang"] = "embedded"
    server_url: Optional[str] = None
    greedy_eval: bool = False


@dataclasses.dataclass(frozen=True)
class Run:
    name: str
    seed: int = 0
    rollout: Rollout = Rollout()
    optimizer: OptimizerConfig = OptimizerConfig()


YAML = """
name: srar-tiny
seed: 3
rollout:
  group_size: 4
  temperature: 1   # an int where a float is expected is fine
  stop: ["</answer>", "\\n\\n"]
  engine: sglang
  server_url: http://127.0.0.1:30000
optimizer:
  learning_rate: 1e-6   # YAML 1.1 reads this as a string; a float field takes it
  schedule: cosine
  warmup_steps: 2
  total_steps: 20
"""


def write(tmp_path, text, name="run.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_yaml_maps_onto_nested_frozen_dataclasses(tmp_path):
    run = load_config(Run, write(tmp_path, YAML))
    assert run == Run(
        name="srar-tiny",
        seed=3,
        rollout=Rollout(group_size=4, temperature=1.0, stop=("</answer>", "\n\n"), engine="sglang",
                        server_url="http://127.0.0.1:30000"),
        optimizer=OptimizerConfig(learning_rate=1e-6, schedule="cosine", warmup_steps=2, total_steps=20),
    )
    assert isinstance(run.rollout.temperature, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.seed = 4


def test_overrides_are_typed_like_the_file(tmp_path):
    run = load_config(Run, write(tmp_path, YAML), ["seed=7", "rollout.engine=embedded", "rollout.server_url=null",
                                                   "optimizer.learning_rate=3e-6", "rollout.stop=[x]"])
    assert (run.seed, run.rollout.engine, run.rollout.server_url) == (7, "embedded", None)
    assert run.optimizer.learning_rate == 3e-6 and run.rollout.stop == ("x",)
    with pytest.raises(ValueError, match="config key seed: expected an int, got 'seven'"):
        load_config(Run, write(tmp_path, YAML), ["seed=seven"])


def test_resolved_config_round_trips(tmp_path):
    run = load_config(Run, write(tmp_path, "name: x\n"))
    save_config(run, tmp_path / "resolved.yaml")
    assert load_config(Run, tmp_path / "resolved.yaml") == run
    resolved = config_to_dict(run)
    assert resolved["optimizer"]["max_grad_norm"] == 1.0 and resolved["rollout"]["stop"] == []  # defaults written


@pytest.mark.parametrize(
    "text, message",
    [
        ("name: x\nsede: 1\n", r"unknown config key sede \(known keys of <root>: name, optimizer, rollout, seed\)"),
        ("name: x\nrollout: {group_sise: 4}\n", "unknown config key rollout.group_sise"),
        ("seed: 1\n", "missing config key name"),
        ("name: x\nseed: 1.5\n", "config key seed: expected an int, got 1.5"),
        ("name: x\nseed: 1e3\n", "config key seed: expected an int, got '1e3'"),
        ("name: x\nrollout: {temperature: warm}\n", "config key rollout.temperature: expected a number, got 'warm'"),
        ("name: x\nseed: true\n", "config key seed: expected an int, got True"),
        ("name: 3\n", "config key name: expected a string, got 3"),
        ("name: x\nrollout: {greedy_eval: 'yes'}\n", "config key rollout.greedy_eval: expected true or false"),
        ("name: x\nrollout: {engine: vllm}\n", r"config key rollout.engine: expected one of \['embedded', 'sglang'\]"),
        ("name: x\nrollout: {stop: '</a>'}\n", "config key rollout.stop: expected a list"),
        ("name: x\nrollout: [1, 2]\n", "config key rollout: expected a mapping"),
        ("name: x\noptimizer: {schedule: cosine}\n", "config optimizer: optimizer.total_steps must be an int >"),
        ("name: x\noptimizer: {learning_rate: -1}\n", "config optimizer: optimizer.learning_rate must be"),
        ("- just\n- a list\n", "the top level must be a mapping"),
        ("name: [unclosed\n", "not valid YAML"),
    ],
)
def test_each_kind_of_bad_config_is_a_clear_error(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        load_config(Run, write(tmp_path, text))


def test_invalid_yaml_is_one_line_naming_where(tmp_path):
    # PyYAML's own message spans several lines; line 2 holds the tab
    with pytest.raises(ValueError) as error:
        load_config(Run, write(tmp_path, "name: x\n\tseed: 1\n"))
    assert str(error.value) == (f"{tmp_path / 'run.yaml'}: not valid YAML: found character '\\t' that cannot "
                                "start any token at line 2, column 1")


@pytest.mark.parametrize("override, message", [("seed", "not of the form"), ("=3", "not of the form"),
                                               ("a..b=1", "not of the form"), ("name.sub=1", "name is not a mapping"),
                                               ("seed=[1", "not valid YAML")])
def test_malformed_overrides(override, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides({"name": "x"}, [override])


def test_overrides_do_not_mutate_the_input():
    data = {"rollout": {"group_size": 2}}
    assert apply_overrides(data, ["rollout.group_size=4"]) == {"rollout": {"group_size": 4}}
    assert data == {"rollout": {"group_size": 2}}


def test_unsupported_annotation_is_a_programmer_error():
    @dataclasses.dataclass(frozen=True)
    class Bad:
        table: set = dataclasses.field(default_factory=set)

    with pytest.raises(TypeError, match="unsupported annotation"):
        config_from_dict(Bad, {"table": [1]})


def test_free_form_parameters_are_a_copied_mapping_with_string_keys():
    @dataclasses.dataclass(frozen=True)
    class Spec:
        params: dict = dataclasses.field(default_factory=dict)

    data = {"params": {"a": {"b": 1}}}
    spec = config_from_dict(Spec, data)
    assert spec.params == {"a": {"b": 1}} and spec.params["a"] is not data["params"]["a"]
    with pytest.raises(ValueError, match="config key params: expected a mapping with string keys"):
        config_from_dict(Spec, {"params": [1]})
    assert config_to_dict(spec) == data


def test_named_sections_are_read_each_as_its_dataclass(tmp_path):
    @dataclasses.dataclass(frozen=True)
    class Fleet:
        rollouts: dict[str, Rollout] = dataclasses.field(default_factory=dict)

    fleet = load_config(Fleet, write(tmp_path, "rollouts: {fast: {group_size: 2}, slow: {}}"),
                        ["rollouts.slow.engine=sglang"])
    assert fleet.rollouts == {"fast": Rollout(group_size=2), "slow": Rollout(engine="sglang")}
    assert config_from_dict(Fleet, config_to_dict(fleet)) == fleet
    with pytest.raises(ValueError, match="unknown config key rollouts.fast.group_sise"):
        config_from_dict(Fleet, {"rollouts": {"fast": {"group_sise": 2}}})
    with pytest.raises(ValueError, match="config key rollouts.slow: expected a mapping"):
        config_from_dict(Fleet, {"rollouts": {"slow": 3}})
    with pytest.raises(ValueError, match="config key rollouts: expected a mapping with string keys"):
        config_from_dict(Fleet, {"rollouts": [{"group_size": 2}]})


@dataclasses.dataclass(frozen=True)
class Stage:
    rollout: Rollout = Rollout(group_size=16, temperature=0.7)
    optimizer: OptimizerConfig = OptimizerConfig(learning_rate=3e-3, warmup_steps=5)


def test_a_partial_section_keeps_the_enclosing_defaults_for_the_keys_it_leaves_out():
    stage = config_from_dict(Stage, apply_overrides({}, ["rollout.stop=[x]", "optimizer.weight_decay=0.5"]))
    assert stage.rollout == Rollout(group_size=16, temperature=0.7, stop=("x",))
    assert stage.optimizer == OptimizerConfig(learning_rate=3e-3, warmup_steps=5, weight_decay=0.5)
    assert config_from_dict(Stage, {}) == Stage()
