"""`scoperouter lab up --data-path` is retired with settings.data_path (issue 32): the option
is gone, and a lab state an older lab wrote, which remembers it, is still read: the setting is
dropped, never written into the routers' config (where `mitmproxy` makes a router refuse it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scoperouter.cli import build_parser, main


def _old_state(root: Path, data_path: str) -> Path:
    from scoperouter_lab.layout import LabPaths

    paths = LabPaths(root)
    paths.root.mkdir(parents=True)
    state = {"clouds": 2, "services": ["keystone", "glance"], "routed": True}
    paths.state_file.write_text(json.dumps({**state, "data_path": data_path}))
    return paths.state_file


def test_lab_up_no_longer_offers_data_path(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["lab", "up", "--data-path", "lean"])  # parsed, not run
    assert exc.value.code == 2
    assert "unrecognized arguments: --data-path lean" in capsys.readouterr().err


@pytest.mark.parametrize("data_path", ["mitmproxy", "lean"])
def test_a_lab_state_that_remembers_data_path_is_read(
    tmp_path: Path, data_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from scoperouter_lab.lab import Lab

    state_file = _old_state(tmp_path / "lab", data_path)
    lab = Lab(tmp_path / "lab")
    assert (lab.n_clouds, lab.services, lab.routed) == (2, ("keystone", "glance"), True)
    assert "data_path" not in lab.state
    lab._save_state()  # the next `lab up` writes the state without it
    assert "data_path" not in json.loads(state_file.read_text())
    # `lab status` reads it too: no lab running, every process absent, no error raised
    main(["lab", "status", "--dir", str(tmp_path / "lab")])
    out = capsys.readouterr().out
    assert "2 clouds, keystone,glance, routed" in out and "data_path" not in out
