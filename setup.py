"""rubric_jax: a pure-JAX framework for rubric-based reinforcement learning of LLMs."""

from setuptools import find_packages, setup

setup(
    name="rubric_jax",
    version="0.1.0",
    description="Pure-JAX reference framework for rubric-based RL of LLMs (SRaR, RLCER, EvoRubric, RGR-GRPO, rubric-grounded GRPO)",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["rubric_jax", "rubric_jax.*"]),
    install_requires=[
        "jax>=0.5.0",
        "flax>=0.10.4",
        "optax>=0.2.4",
        "orbax-checkpoint>=0.11.0",
        "chex>=0.1.89",
        # transformers is used for tokenizers and configs only; it does not pull torch.
        "transformers>=4.51.0",
        # chat templates (transformers renders them with jinja2 but does not require it)
        "jinja2>=3.1",
        "tensorstore>=0.1.71",
        "numpy>=1.26",
        # read and written directly by rubric_jax.models.safetensors_io (bfloat16 through ml_dtypes)
        "safetensors>=0.4.3",
        "ml_dtypes>=0.5.0",
        # rollout and judge HTTP clients (rubric_jax.inference, rubric_jax.judges); the test stand-in server too
        "aiohttp>=3.9",
        # outcome verification of \boxed{} answers (rubric_jax.judges.outcome); the extra brings its LaTeX parser
        "math-verify[antlr4_13_2]>=0.7",
        # dataset tasks over local files (rubric_jax.data.dataset): JSONL, JSON, Parquet, CSV and save_to_disk
        # directories as memory-mapped Arrow tables; it does not pull torch.
        "datasets>=3.0",
        # YAML configs (rubric_jax.yaml_config)
        "pyyaml>=6.0",
        # the trainer's metrics: TensorBoard event files and PNG plots (rubric_jax.training.metrics)
        "tensorboardX>=2.6",
        "matplotlib>=3.8",
        # rubric synthesis (rubric_jax.data.synthesis): the papers' output schemas as pydantic models, which
        # validate every generated record and give the JSON schema sent as response_format
        "pydantic>=2.6",
        # judge-agreement statistics (rubric_jax.judges.agreement): Cohen's kappa and confusion matrices from
        # scikit-learn, correlations from scipy
        "scikit-learn>=1.3",
        "scipy>=1.10",
        # the progress bars of evaluation and synthesis
        "tqdm>=4.66",
    ],
    entry_points={"console_scripts": ["rubric-jax=rubric_jax.cli:main"]},
    extras_require={
        "test": [
            "pytest>=8.0",
            "pytest-xdist>=3.5",
            "hypothesis>=6.100",
            "nbclient>=0.10",
            "nbformat>=5.10",
            "ipykernel>=6.29",
            # Parity tests against transformers only. Pinned: this version has a local CPU build here, and any
            # other version or an open range would pull a CUDA build (several GB).
            "torch==2.13.0",
            # tests/judges/test_real_server.py: the LLM judges against `transformers serve` (its API as of 5.6), on CPU
            "transformers[serving]>=5.6",
            # tests/training/test_plan.py compiles for TPU topologies on CPU: libtpu adds ~6 s to the install and
            # ~0.6 s to each process's first `jax.devices()` (docs/scale.md)
            "jax[tpu]==0.10.2",
        ],
        # `rubric-jax plan` (ahead-of-time compilation for a TPU topology on any host), and TPU hosts: libtpu at
        # the jax version the project is tested with
        "tpu": ["jax[tpu]==0.10.2"],
        # GPU/TPU hosts only: sglang pulls a CUDA build of torch.
        "sglang": ["sglang>=0.5.23"],
    },
)
