"""A real Prometheus (Debian's `prometheus`) on loopback for the tests, and what the rules of
deploy/prometheus/rules.yml ask of the metrics.

:class:`Prometheus` writes a config (scrape and rule evaluation every second; each target with
its labels), loads a COPY of the rules in which every alert's ``for:`` is removed (an alert
fires at the first evaluation that sees its condition: a test waits seconds, not the minutes
the shipped rules wait), starts ``prometheus`` on 127.0.0.1 with its storage in a temporary
folder, waits until it is ready, and asks its HTTP API. It is stopped by PID.

:func:`rule_requirements` reads every rule's expression for the ``scoperouter_*`` metrics it
selects and the labels it uses (in the selector's matchers and the ``by (...)`` of the
aggregations around it), so a test can check that a live Prometheus has each of them.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

from tests.ci import missing

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
ROUTER_JOB = "scoperouter"  # the job names rules.yml expects
BROKER_JOB = "scoperouter-broker"
START_TIMEOUT = 60.0

T = TypeVar("T")


def binary(name: str) -> str:
    """The path of `name` (prometheus, promtool): Debian's package puts them in /usr/bin. A
    skip when absent, a failure under CI=true (.ci/run installs the package)."""
    found = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/bin") / name, Path("/usr/sbin") / name) if p.exists()), None
    )
    if found is None:
        missing(f"{name} is not installed (Debian: apt-get install --no-install-recommends "
                "prometheus)")  # fmt: skip
    return str(found)


def quick_rules(source: Path, target: Path) -> Path:
    """`source`'s rules with every alert's ``for:`` removed (see the module's docstring)."""
    doc = yaml.safe_load(source.read_text())
    for group in doc["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            rule.pop("for", None)
    target.write_text(yaml.safe_dump(doc, sort_keys=False))
    return target


Target = tuple[str, Mapping[str, str]]  # host:port, its labels


class Prometheus:
    def __init__(self, directory: Path, jobs: Mapping[str, Iterable[Target]], port: int) -> None:
        self.directory = directory
        self.url = f"http://127.0.0.1:{port}"
        self.log = directory / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(quick_rules(RULES, directory / "rules.yml"))],
            "scrape_configs": [
                {
                    "job_name": job,
                    "static_configs": [
                        {"targets": [address], "labels": dict(labels)}
                        for address, labels in targets
                    ],
                }
                for job, targets in jobs.items()
            ],
        }
        self.config = directory / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        self._port = port

    def start(self) -> Prometheus:
        argv = [
            binary("prometheus"),
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{self._port}",
            "--log.level=warn",
        ]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        try:
            self.wait_for(self._ready, START_TIMEOUT, "ready")
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited {self.proc.returncode}:\n{self.log_text()}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(self.url + "/-/ready", timeout=2, trust_env=False).status_code == 200
        return False

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def api(self, path: str, **params: Any) -> Any:
        reply = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10, trust_env=False)
        body = reply.json()
        assert body.get("status") == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def series(self, name: str) -> list[dict[str, str]]:
        result: list[dict[str, str]] = self.api("series", **{"match[]": f'{{__name__="{name}"}}'})
        return result

    def alerts(self, name: str, state: str = "firing") -> list[dict[str, Any]]:
        return [
            a
            for a in self.api("alerts")["alerts"]
            if a["labels"].get("alertname") == name and a["state"] == state
        ]

    def wait_for(self, probe: Callable[[], T], timeout: float, what: str) -> T:
        """`probe()` once it is truthy; AssertionError naming `what` at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus: not {what} after {timeout:.0f} s")
            time.sleep(0.25)


# ----------------------------------------------------------------------- the rules' needs

_NAME = re.compile(r"(?<![\w:])(scoperouter_\w+)(?![\w:])\s*(\{[^}]*\})?")
_MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
_BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_HISTOGRAM_LABELS = {"le"}


def rules_doc(path: Path = RULES) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


def rule_requirements(doc: Mapping[str, Any]) -> dict[str, set[str]]:
    """Every ``scoperouter_*`` metric a rule selects (recorded series, ``a:b:c``, are not
    metrics) -> the labels the rule needs it to have: those of its matchers and of the
    ``by (...)`` clauses of the expression (target labels such as source_cloud included:
    the scrape config gives them)."""
    needs: dict[str, set[str]] = {}
    for group in doc["groups"]:
        for rule in group["rules"]:
            expr = rule["expr"]
            grouped = {
                label.strip()
                for clause in _BY.findall(expr)
                for label in clause.split(",")
                if label.strip()
            }
            for name, matchers in _NAME.findall(expr):
                labels = set(_MATCHER.findall(matchers or ""))
                if name.endswith("_bucket"):
                    labels |= grouped
                else:
                    labels |= grouped - _HISTOGRAM_LABELS
                needs.setdefault(name, set()).update(labels)
    return needs


def absent_requirements(prometheus: Prometheus, needs: Mapping[str, set[str]]) -> list[str]:
    """What of `needs` the live Prometheus does not have: a metric without any series, or one
    whose series lack a label (empty: every metric and label is there)."""
    problems = []
    for name, labels in sorted(needs.items()):
        series = prometheus.series(name)
        if not series:
            problems.append(f"{name}: no series")
            continue
        present = {key for s in series for key in s}
        lacking = sorted(labels - present)
        if lacking:
            problems.append(f"{name}: no label {', '.join(lacking)}")
    return problems


def wait_for_requirements(
    prometheus: Prometheus, needs: Mapping[str, set[str]], timeout: float
) -> None:
    """Wait until the live Prometheus has every metric and label of `needs`; AssertionError
    listing what is still missing after `timeout` seconds."""
    problems: list[str] = []

    def complete() -> bool:
        problems[:] = absent_requirements(prometheus, needs)
        return not problems

    try:
        prometheus.wait_for(complete, timeout, "showing every metric the rules use")
    except AssertionError:
        raise AssertionError("metrics the rules use are missing:\n" + "\n".join(problems)) from None
