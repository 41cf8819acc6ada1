"""`pretrain lineage` and `export` (assets/cli/checkpoints.py) on a folder that holds no checkpoint: exit 2, the
folder named. A real checkpoint's lineage and export: tests/assets/core/test_lineage.py and
tests/trainer/evaluation/test_export.py."""

from assets.cli import main


def test_a_folder_without_a_checkpoint_exits_2_naming_it(tmp_path, capsys):
    empty = tmp_path / "not-a-checkpoint"
    empty.mkdir()
    assert main(["lineage", str(empty)]) == 2
    assert f"{empty}: no committed checkpoint" in capsys.readouterr().err
    assert main(["export", str(empty), str(tmp_path / "hf")]) == 2
    assert str(empty) in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()
