import os

# Tests run on the CPU; a multi-device mesh is simulated where a test needs one.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import HealthCheck, settings

# JIT compilation makes the first example slow: no deadline. The budget keeps the suite inside CI's time on
# 2 cores; run with HYPOTHESIS_PROFILE=thorough for a longer search.
settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("thorough", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
