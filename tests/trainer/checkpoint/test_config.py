"""trainer/checkpoint/config.py: the checkpoint section refuses what would lose or misplace a checkpoint."""

import pytest

from trainer.checkpoint.config import CheckpointConfig


@pytest.mark.parametrize("fields, message", [
    (dict(keep_last=0), r"checkpoint\.keep_last must be >= 1, got 0"),
    (dict(interval_steps=-1), r"checkpoint\.interval_steps must be >= 0, got -1"),
    (dict(mtbf_hours=0.0), r"checkpoint\.mtbf_hours must be > 0"),
    (dict(run_name="a/b"), r"checkpoint\.run_name must be a non-empty name without '/'"),
    (dict(shared_local_dir=False), r"checkpoint\.shared_local_dir = false needs checkpoint\.remote"),
])
def test_a_setting_that_would_lose_a_checkpoint_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        CheckpointConfig(**fields)


def test_ranks_without_a_shared_folder_meet_in_the_remote_store():
    config = CheckpointConfig(shared_local_dir=False, remote="s3://bucket/runs")
    assert (config.remote, config.keep_last, config.resume) == ("s3://bucket/runs", 3, True)
