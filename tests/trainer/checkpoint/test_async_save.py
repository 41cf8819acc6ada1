"""trainer.checkpoint.async_save: files written and marked, the commit's wait, a failed write never silent."""

import pytest
import torch

from trainer.checkpoint.async_save import (BackgroundWriter, WriteFailed, mark_failed, mark_written, state_bytes,
                                wait_written, write_files)


def test_files_written_then_marked_then_waited_for(tmp_path):
    write_files([(tmp_path / "a.pt", {"w": torch.ones(3)}), (tmp_path / "b.pt", [1, 2])])
    assert torch.load(tmp_path / "a.pt")["w"].tolist() == [1.0, 1.0, 1.0]
    mark_written(tmp_path, 0)
    mark_written(tmp_path, 1)
    wait_written(tmp_path, 2, timeout=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "b.pt"]  # the markers are gone


def test_a_rank_that_failed_or_never_wrote_raises(tmp_path):
    mark_failed(tmp_path, 1, OSError("disk full"))
    with pytest.raises(WriteFailed, match="rank 1 failed .*disk full"):
        wait_written(tmp_path, 2, timeout=1)
    with pytest.raises(WriteFailed, match=r"ranks \[0\] did not finish"):
        wait_written(tmp_path / "..", 1, timeout=0.05)


def test_background_writer_raises_a_jobs_error_in_the_caller():
    writer = BackgroundWriter()
    done = []
    writer.submit(lambda: done.append(1))
    writer.wait()
    writer.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        writer.submit(lambda: None)
    writer.close()
    assert done == [1]


def test_state_bytes_counts_tensors():
    assert state_bytes({"a": torch.zeros(4), "b": [torch.zeros(2, dtype=torch.float64)]}) == 16 + 16
