"""bench/gpu/lora_overhead.py's summary: each part's medians, set against the reference call
of the same rounds."""

import pytest

from bench.gpu import lora_overhead


def test_each_part_is_its_median_against_the_reference_median():
    times = {"reference": [1.0, 3.0, 2.0], "step": [2.0, 5.0, 4.0]}
    tokens = {"reference": [100, 300, 100], "step": [200, 200, 200]}
    rows = lora_overhead.summary(times, tokens)
    assert rows["reference"]["x_reference"] == 1.0
    assert rows["step"]["median_s"] == 4.0
    assert rows["step"]["x_reference"] == 2.0
    # tokens/s is the median of each round's rate, not total tokens over total time
    assert rows["reference"]["tokens_per_s"] == 100.0
    assert rows["step"]["tokens_per_s"] == pytest.approx(50.0)
    assert rows["step"]["seconds"] == [2.0, 5.0, 4.0]
