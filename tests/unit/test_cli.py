"""The scoperouter console script: route (masking, exit codes, JSON), check-config, help, the
table of commands and their modules."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from scoperouter import __version__
from scoperouter.cli import COMMANDS, main

from .conftest import SAMPLE

CFG = str(SAMPLE)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_route_forward_masks_the_token(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "route", "--config", CFG, "--cloud", "CloudOne",
        "-H", 'X-Auth-Token: gAAAAs3cr3t!SCOPE!{"image":"CloudTwo"}',
        "GET", "http://127.0.0.2:9292/v2/images",
    )  # fmt: skip
    assert code == 0
    assert "decision: forward to CloudTwo (its router)" in out
    assert "target:   http://127.0.0.3:9292/v2/images" in out
    assert "X-Auth-Token: <token>!SCOPE!{" in out
    assert "s3cr3t" not in out


def test_route_reject_exit_1_with_the_clients_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "route", "--config", CFG, "--cloud", "CloudOne", "--scope", '{"image": "X"}',
        "GET", "http://127.0.0.2:9292/v2/images",
    )  # fmt: skip
    assert code == 1
    assert "decision: reject 400 Bad Request" in out
    assert "unknown cloud 'X'" in out


def test_route_json_and_forward_mode(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "route", "--config", CFG, "--cloud", "CloudOne", "--json",
        "-H", "X-Service-Token: nova-s3cr3t", "--scope", '{"image": "CloudTwo"}',
        "GET", "http://127.0.0.2:9292/v2/images/abc",
    )  # fmt: skip
    assert code == 0
    data = json.loads(out)
    assert data["mode"] == "reverse" and data["remote"] is True and data["cloud"] == "CloudTwo"
    assert data["swap_tokens"] == ["X-Service-Token"] and "s3cr3t" not in out
    code, out, _ = run(
        capsys, "route", "--config", CFG, "--cloud", "CloudOne", "--json",
        "GET", "http://10.9.9.9/anything",
    )  # fmt: skip
    data = json.loads(out)
    assert (code, data["mode"], data["status"]) == (1, "forward", 403)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--cloud", "Nowhere", "GET", "http://127.0.0.2:9292/"], "cloud 'Nowhere' is not in"),
        (["--cloud", "CloudOne", "GET", "ftp://x/"], "is not an http(s) URL"),
        (
            ["--cloud", "CloudOne", "-H", "nocolon", "GET", "http://127.0.0.2:9292/"],
            "is not 'Name: value'",
        ),
    ],
)
def test_route_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    code, _, err = run(capsys, "route", "--config", CFG, *argv)
    assert code == 2 and fragment in err


def test_check_config_ok_and_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "check-config", CFG)
    assert code == 0 and "OK (2 clouds, 8 endpoints)" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(SAMPLE.read_text().replace("hop_limit: 8", "hop_limit: -1"))
    code, _, err = run(capsys, "check-config", str(bad))
    assert code == 1
    assert f"invalid config: {bad}: settings.hop_limit: must be a positive integer" in err


def test_serve_needs_a_known_cloud(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "serve", "--config", CFG)
    assert code == 2 and "--cloud is required" in err
    code, _, err = run(capsys, "serve", "--config", CFG, "--cloud", "Nope")
    assert code == 2 and "cloud 'Nope' is not in" in err


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    for command in ("serve", "route", "check-config", "lab"):
        assert command in out


def test_route_shows_a_token_validation_leaving_the_cloud(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(
        capsys, "route", "--config", CFG, "--cloud", "CloudTwo",
        "-H", "X-Auth-Token: glance-s3cr3t",
        "-H", 'X-Subject-Token: user-s3cr3t!SCOPE!{"identity":"CloudOne"}',
        "GET", "http://127.0.0.3:5000/v3/auth/tokens",
    )  # fmt: skip
    assert code == 0
    assert "swap:     X-Auth-Token: checked with CloudTwo's keystone" in out
    assert "twinned into region CloudTwo" in out
    assert "s3cr3t" not in out


def test_check_config_shows_settings_and_status_addresses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "check-config", CFG)
    assert code == 0
    assert "hop_limit 8" in out and "limits 100 headers, 65536 bytes" in out
    assert "down for 10s after 1 failure" in out
    assert "CloudOne (region CloudOne)" in out and "metrics 127.0.0.2:9180" in out


def test_check_config_refuses_a_backend_that_is_a_router(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = SAMPLE.read_text().replace(
        "backend: http://127.0.1.2:9292", "backend: http://127.0.0.3:9292"
    )
    path = tmp_path / "loop.yaml"
    path.write_text(text)
    code, _, err = run(capsys, "check-config", str(path))
    assert code == 1
    assert "clouds.CloudOne.services.image.public.backend" in err
    assert "router of CloudTwo listens" in err and "routing loop" in err


def test_serve_help_explains_workers_and_signals(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    for part in ("--workers", "SO_REUSEPORT", "SIGHUP", "SIGTERM", "/metrics", "--drain"):
        assert part in out


def test_check_config_refuses_the_removed_data_path(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """settings.data_path is gone (one data path): 'lean' is still read, with a warning;
    'mitmproxy' says what to do."""
    for value, ok in (("lean", True), ("mitmproxy", False)):
        path = tmp_path / f"{value}.yaml"
        text = SAMPLE.read_text().replace("  hop_limit:", f"  data_path: {value}\n  hop_limit:", 1)
        path.write_text(text)
        code, out, err = run(capsys, "check-config", str(path))
        if ok:
            assert code == 0 and "settings.data_path is obsolete" in caplog.text, (out, err)
        else:
            assert code == 1 and "settings.data_path: 'mitmproxy' is no longer available" in err


def test_route_shows_each_part_of_a_fan_out_and_each_candidate_of_a_failover(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(
        capsys, "route", "--config", CFG, "--cloud", "CloudOne",
        "-H", 'X-Auth-Token: s3cr3t!SCOPE!{"image":"CloudOne & CloudTwo"}',
        "GET", "http://127.0.0.2:9292/v2/images?limit=2",
    )  # fmt: skip
    assert code == 0 and "s3cr3t" not in out
    assert "decision: fan-out CloudOne & CloudTwo (each cloud's list at once" in out
    assert "  - CloudOne (local backend): http://127.0.1.2:9292/v2/images?limit=2" in out
    assert "  - CloudTwo (its router): http://127.0.0.3:9292/v2/images?limit=2" in out
    code, out, _ = run(
        capsys, "route", "--config", CFG, "--cloud", "CloudOne", "-H", "X-Service-Token: s",
        "--scope", '{"image": "CloudTwo | CloudOne"}', "GET", "http://127.0.0.2:9292/v2/images/x",
    )  # fmt: skip
    assert code == 0
    assert "decision: failover CloudTwo | CloudOne (tried in order" in out
    assert (
        "  1. CloudTwo (its router, swaps X-Service-Token): http://127.0.0.3:9292/v2/images/x"
        in out
    )
    assert "  2. CloudOne (local backend): http://127.0.1.2:9292/v2/images/x" in out
    # nested, as JSON: a failover whose second candidate is a fan-out; token values masked
    code, out, _ = run(
        capsys, "route", "--config", CFG, "--cloud", "CloudOne", "--json",
        "-H", 'X-Auth-Token: s3cr3t!SCOPE!{"image":"CloudTwo | CloudOne & CloudTwo"}',
        "GET", "http://127.0.0.2:9292/v2/images",
    )  # fmt: skip
    data = json.loads(out)
    assert code == 0 and "s3cr3t" not in out
    assert (data["decision"], data["expression"]) == ("failover", "CloudTwo | CloudOne & CloudTwo")
    first, second = data["candidates"]
    assert first["decision"] == "forward" and first["cloud"] == "CloudTwo"
    assert second["decision"] == "fanout" and second["label"] == "CloudOne & CloudTwo"
    assert [p["cloud"] for p in second["parts"]] == ["CloudOne", "CloudTwo"]
    assert second["parts"][0]["target"] == "http://127.0.1.2:9292/v2/images"
    assert second["parts"][0]["set_headers"]["X-Auth-Token"].startswith("<token>!SCOPE!")


def test_route_refuses_a_write_with_and(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "route", "--config", CFG, "--cloud", "CloudOne",
        "--scope", '{"image": "CloudOne & CloudTwo"}', "POST", "http://127.0.0.2:9292/v2/images",
    )  # fmt: skip
    assert code == 1 and "decision: reject 400" in out and "'&' only reads" in out


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_is_registered_by_the_module_the_table_names(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: scoperouter {command} ")
    parser = argparse.ArgumentParser(prog="scoperouter")
    module = importlib.import_module(COMMANDS[command])
    registered = module.register(parser.add_subparsers())
    assert registered.prog == f"scoperouter {command}"


def test_python_dash_m_runs_the_console_script() -> None:
    """How the tests and the bench start routers: ``python -m scoperouter.cli``."""
    done = subprocess.run(
        [sys.executable, "-m", "scoperouter.cli", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, f"scoperouter {__version__}")
