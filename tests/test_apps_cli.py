"""``reproduce`` on bad input: one-line errors, exit status 2, the output folder untouched."""

from __future__ import annotations

import importlib.util
import socket

import pytest

from apps._executor import ExecutorError, check_address
from apps.cli import main


@pytest.fixture
def out_with_old_file(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "index.html").write_text("an earlier report")
    (out / "mine.txt").write_text("not ours")
    return out


def _untouched(out):
    assert (out / "index.html").read_text() == "an earlier report"
    assert (out / "mine.txt").read_text() == "not ours"
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "mine.txt"]


def _one_line_error(capsys, *words):
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("reproduce: error:"), err
    for w in words:
        assert w in err
    return err


def test_unknown_experiment(out_with_old_file, capsys):
    assert main(["--only", "h2mc_ring", "no_such_thing", "--out", str(out_with_old_file)]) == 2
    _one_line_error(capsys, "no_such_thing", "--list")
    _untouched(out_with_old_file)


def test_output_folder_that_cannot_be_created(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert main(["--only", "h2mc_economy", "--out", str(blocker / "sub")]) == 2
    _one_line_error(capsys, "not writable")
    assert main(["--only", "h2mc_economy", "--out", str(blocker)]) == 2
    _one_line_error(capsys, "not a folder")
    assert blocker.read_text() == "x"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ray_address_that_does_not_answer(out_with_old_file, capsys):
    addr = f"127.0.0.1:{_free_port()}"
    with pytest.raises(ExecutorError, match="does not answer"):
        check_address(addr, timeout=1)
    with pytest.raises(ExecutorError, match="HOST:PORT"):
        check_address("nonsense")
    rc = main(["--only", "h2mc_economy", "--executor", "ray", "--address", addr,
               "--out", str(out_with_old_file)])
    assert rc == 2
    err = _one_line_error(capsys)
    if importlib.util.find_spec("ray") is None:
        assert "needs Ray" in err
    else:
        assert "does not answer" in err
    _untouched(out_with_old_file)


def test_list_names_every_experiment(capsys):
    import apps

    assert main(["--list"]) == 0
    text = capsys.readouterr().out
    for name in apps.registry():
        assert name in text


def test_existing_files_survive_a_run(out_with_old_file):
    assert main(["--tier", "tiny", "--only", "h2mc_economy", "--no-progress",
                 "--out", str(out_with_old_file)]) == 0
    assert (out_with_old_file / "mine.txt").read_text() == "not ours"
    assert "h2mc_economy" in (out_with_old_file / "index.html").read_text()
