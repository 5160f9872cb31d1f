"""README's examples, as a newcomer would copy them: "Train on your own data" (its JSONL line and its config pass
`rubric-jax validate`, the model replaced by a random one and the path by the copied rows, since neither the
checkpoint nor the data is in the repository), and the synthesis -> train -> eval path, whose commands must
connect (each reads what the one before writes)."""

import json
import re
import shlex
from pathlib import Path

from rubric_jax import cli
from rubric_jax.data.synthesis import SynthesisConfig, plan_synthesis
from rubric_jax.training import run_files
from rubric_jax.training.metrics import SAMPLES_FILE, MetricsWriter
from rubric_jax.training.run_config import RLConfig, resolve_algorithm
from rubric_jax.yaml_config import load_config
from tests.judges.test_records import RECORDS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def section_blocks(title: str) -> dict[str, list[str]]:
    """The fenced code blocks of the README section `title`, by language, in order."""
    text = README.read_text(encoding="utf-8")
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    blocks: dict[str, list[str]] = {}
    for lang, body in re.findall(r"```(\w+)\n(.*?)```", section, re.DOTALL):
        blocks.setdefault(lang, []).append(body)
    return blocks


def test_the_own_data_example_validates(tmp_path, capsys):
    blocks = section_blocks("Train on your own data")
    rows = tmp_path / "train.jsonl"
    rows.write_text(blocks["json"][0] * 3, encoding="utf-8")
    config = tmp_path / "my_data.yaml"
    config.write_text(blocks["yaml"][0], encoding="utf-8")
    assert cli.main(["validate", str(config), f"task.params.path={rows}", "task.params.eval_size=1",
                     "model={init: {max_position_embeddings: 4096}}", "--rows", "1", "--offline"]) == 0
    out = capsys.readouterr().out
    assert "data: 2 training rows, 1 held out, none skipped; longest rubric 2 items" in out
    assert "My knee hurts after running." in out and "[user]\n" in out  # the policy's and the judge's prompts
    # its -5 criterion is counted by the reward it trains with (2 training rows, one penalty each)
    assert ("rubrics: 2 criteria with a negative weight: counted: a met one subtracts its points from the reward "
            "(score: positive_points)") in out.splitlines()
    algorithm_config, _ = resolve_algorithm(load_config(RLConfig, config))
    assert algorithm_config.score == "positive_points"
    assert "rubric-jax validate configs/my_data.yaml && rubric-jax train configs/my_data.yaml" in blocks["bash"][0]


def test_the_own_data_eval_commands_parse():
    [_, evals] = section_blocks("Train on your own data")["bash"]
    commands = [shlex.split(line) for line in evals.replace("\\\n", " ").splitlines() if line.strip()]
    assert len(commands) == 2
    for command in commands:
        args = cli.build_parser().parse_args(command[1:])
        assert command[0] == "rubric-jax" and args.command == "eval" and args.dataset in ("aime25", "healthbench")


def test_the_synthesis_path_commands_parse_and_connect(tmp_path):
    """README's "Synthesize rubrics, then train and evaluate": every command parses, the synthesis writes where the
    paper config reads, and the synthesize command, with the fixture documents and a stand-in generator, plans."""
    [commands_text] = section_blocks("Synthesize rubrics, then train and evaluate")["bash"]
    commands = [shlex.split(line) for line in commands_text.replace("\\\n", " ").splitlines() if line.strip()]
    parsed = [cli.build_parser().parse_args(command[1:]) for command in commands]
    assert [command[0] for command in commands] == ["rubric-jax"] * 4
    assert [args.command for args in parsed] == ["synthesize", "train", "eval", "judge-agreement"]
    synthesize, train, evaluate, agreement = parsed

    overrides = dict(item.split("=", 1) for item in synthesize.overrides)
    run = load_config(RLConfig, ROOT / train.config, train.overrides)
    assert run.task.params["path"] == f"{overrides['output_dir']}/train.jsonl"
    assert run.task.params["eval_path"] == f"{overrides['output_dir']}/validation.jsonl"
    assert run.rollout_log.every_steps > 0
    assert evaluate.model == f"{run.output_dir}/model"
    assert evaluate.data_path == f"{overrides['output_dir']}/test.jsonl" and evaluate.dataset == "rubric_grounded"
    assert agreement.items == f"{run.output_dir}/rollouts"

    config = load_config(SynthesisConfig, ROOT / synthesize.config, [
        *synthesize.overrides, f"output_dir={tmp_path}", f"input.path={ROOT / 'tests/fixtures/synthesis/documents.jsonl'}"])
    assert len(plan_synthesis(config).sources) == 5


def test_the_multihost_launch_commands_parse_and_load():
    """README's "Multi-host": the train command of the TPU pod's ssh and that of the GPU nodes parse, and their
    configs load with their overrides, meshes of 32 and 16 devices."""
    [pod, nodes] = section_blocks("Multi-host: TPU pods and multi-node GPU")["bash"]
    for block, devices in ((pod, 32), (nodes, 16)):
        text = block.replace("\\\n", " ")
        command = shlex.split(text[text.index("rubric-jax train"):].strip().rstrip('"'))
        args = cli.build_parser().parse_args(command[1:])
        mesh = load_config(RLConfig, args.config, args.overrides).learner.mesh
        assert mesh.data * mesh.fsdp * mesh.tensor == devices


def test_the_run_directory_files_are_named_as_written(tmp_path):
    """README's run directory: the first rollout file as `run_files.rollout_log_path` names it, and every field of a
    samples.jsonl line (`MetricsWriter.write_samples` of `run_files.samples_of`, for a judged and a failed rollout) in the
    sentence on samples.jsonl, with both phases."""
    text = README.read_text(encoding="utf-8")
    assert f"`{run_files.rollout_log_path(Path(), 1).as_posix()}`" in text
    with MetricsWriter(tmp_path, tensorboard=False, console=False) as writer:
        writer.write_samples(1, run_files.samples_of(RECORDS[:2], 2))
        writer.write_samples(1, run_files.samples_of(RECORDS[:1], 1), phase="eval")
    lines = [json.loads(line) for line in (tmp_path / SAMPLES_FILE).read_text(encoding="utf-8").splitlines()]
    assert [line["phase"] for line in lines] == ["train", "train", "eval"]
    fields = {key for line in lines for key in line} | {key for line in lines for c in line["criteria"] for key in c}
    described = text.split("`samples.jsonl` holds", 1)[1].split("\n\n", 1)[0]
    assert fields <= set(re.findall(r"`(\w+)`", described)), fields - set(re.findall(r"`(\w+)`", described))
    assert "`train`" in described and "`eval`" in described


def test_the_first_screen_gives_the_quickstart_and_the_ci_test_command():
    """The README's first 25 lines hold the two set-up commands: the quickstart's, as "Set up and run" gives it,
    and the tests', the one `.ci/run` runs; the timings beside them say where they were measured."""
    first_screen = "\n".join(README.read_text(encoding="utf-8").splitlines()[:25])
    [quickstart, tests] = re.findall(r"```bash\n(.*?)\n```", first_screen, re.DOTALL)
    set_up = section_blocks("Set up and run")["bash"]
    assert quickstart + "\n" == set_up[0] and quickstart.endswith("rubric-jax quickstart")
    assert tests + "\n" == set_up[1]
    ci_command = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert tests == ci_command
    assert first_screen.count("2-core") == 2
