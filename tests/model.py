"""Settings of the model-based (Hypothesis stateful) tests.

Deterministic by default: a fixed seed (``SLUICE_MODEL_SEED``, default 14), so CI runs
the same examples every time; ``SLUICE_MODEL_EXAMPLES=N`` runs N examples of up to
``SLUICE_MODEL_STEPS`` steps each (a longer search, e.g. 2000 and 60, before a release;
with ``SLUICE_MODEL_SEED=random`` a new seed each run).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

EXAMPLES = int(os.environ.get("SLUICE_MODEL_EXAMPLES", "60"))
STEPS = int(os.environ.get("SLUICE_MODEL_STEPS", "30"))
EPOCH = datetime(2030, 1, 1, tzinfo=UTC)

MODEL_SETTINGS = settings(
    max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def run_model(machine: type[RuleBasedStateMachine]) -> None:
    """Run ``machine`` with the settings above, seeded unless asked otherwise."""
    chosen = os.environ.get("SLUICE_MODEL_SEED", "14")
    target: Any = machine if chosen == "random" else seed(int(chosen))(machine)
    run_state_machine_as_test(target, settings=MODEL_SETTINGS)
