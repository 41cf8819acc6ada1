"""`pretrain materialize`'s own checks (assets/cli/materialize.py), before anything loads; it runs assets end to end in
tests/assets/test_cli.py and the asset tests."""

import pytest

from assets.cli import main


@pytest.mark.parametrize(("args", "env", "named"), [
    (["--jobs", "0"], None, "--jobs 0"),
    ([], "two", "PRETRAIN_JOBS"),
])
def test_a_bad_step_count_exits_2_naming_it(monkeypatch, capsys, args, env, named):
    if env is not None:
        monkeypatch.setenv("PRETRAIN_JOBS", env)
    assert main(["materialize", "--verbose", *args]) == 2
    assert named in capsys.readouterr().err
