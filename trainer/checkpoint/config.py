"""Where and how often a run checkpoints: a run.json's `checkpoint` section."""

from __future__ import annotations

from trainer.base_config import RunConfigSection


class CheckpointConfig(RunConfigSection):
    """When and where checkpoints go: local disk first (committed atomically), then the object store
    in a background thread. Layout: <local_dir>/step-<N>/ and <remote>/checkpoints/<stage>/<run_name>/step-<N>/."""

    interval_steps: int = 0  # save every N optimizer steps; 0 = no fixed interval
    mtbf_hours: float | None = None  # automatic interval by Young's rule sqrt(2 · save time · MTBF)
    local_dir: str | None = None  # None = <output_dir>/checkpoints; $VARS are expanded on each rank ($TMPDIR)
    # false: no folder is shared by the nodes (node-local disks): each rank writes its own files under
    # <local_dir>/rank-<r>/ and uploads them itself, rank 0 commits the step in `remote` (trainer.checkpoint.rank_upload)
    shared_local_dir: bool = True
    remote: str | None = None  # object-store URL (path, file://, s3://bucket/prefix); None = local only
    run_name: str = "run"
    keep_last: int = 3  # the newest k committed checkpoints are kept, locally and remotely
    keep_every: int = 0  # and every step that is a multiple of this, permanently (0 = none)
    save_final: bool = True  # a checkpoint at the end of the run
    resume: bool = True  # start from the newest committed checkpoint (local, else remote) when there is one
    allow_batch_change: bool = False  # resuming with a different global batch is refused unless this is set
    upload_retry_max_s: float = 30.0  # the background upload retries with backoff up to this pause, forever

    def _check(self) -> None:
        for name in ("interval_steps", "keep_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"checkpoint.{name} must be >= 0, got {getattr(self, name)}")
        if self.keep_last < 1:
            raise ValueError(f"checkpoint.keep_last must be >= 1, got {self.keep_last}")
        if self.mtbf_hours is not None and self.mtbf_hours <= 0:
            raise ValueError(f"checkpoint.mtbf_hours must be > 0, got {self.mtbf_hours}")
        if not self.run_name or "/" in self.run_name:
            raise ValueError(f"checkpoint.run_name must be a non-empty name without '/', got {self.run_name!r}")
        if not self.shared_local_dir and not self.remote:
            raise ValueError("checkpoint.shared_local_dir = false needs checkpoint.remote: without a shared folder "
                             "the object store is where every rank's files meet and where a step is committed")
