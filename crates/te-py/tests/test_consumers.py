"""The call patterns of vLLM, SGLang and LMCache on te.mooncake, each role in its own process
(``consumers/scenarios.py``). ``cargo xtask ci`` runs the same scenarios on te and on Mooncake's
wheel and prints the two side by side."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "consumers"))

import scenarios  # noqa: E402


@pytest.mark.parametrize("scenario", scenarios.SCENARIOS, ids=lambda s: s.__name__)
def test_consumer_scenario_on_te(scenario):
    scenario("te")
