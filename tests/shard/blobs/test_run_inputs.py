"""A run's inputs as the shard links them (shard/blobs/inputs.py): an A/B job's variant dirs."""

import pytest

from shard.blobs.cache import CacheError
from shard.blobs.inputs import variant_inputs


def test_a_shard_refuses_an_ab_jobs_input_named_variant_as_an_input_problem(tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "variant").symlink_to("/nonexistent/a")
    (inputs / "variant+new").symlink_to("/nonexistent/b")
    with pytest.raises(CacheError, match="input name variant"):
        variant_inputs(inputs, ["base", "new"])
