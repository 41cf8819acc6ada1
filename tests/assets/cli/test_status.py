"""`pretrain jobs` and `status` (assets/cli/status.py) on a home with no training job: said, not failed. The jobs'
restarts and left-out nodes are in tests/assets/test_cli.py."""

from assets.cli import main


def test_jobs_on_a_home_without_training_jobs_says_so(pretrain_home, capsys):
    assert main(["jobs"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and f"no training job under {pretrain_home / 'work' / 'training'}" in captured.err
    assert main(["jobs", "--json"]) == 0
    assert capsys.readouterr().out == ""
