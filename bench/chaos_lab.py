"""``bench.chaos``'s view of the running lab: its clouds, processes and clouds.yaml."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml


class ChaosError(Exception):
    pass


class LabView:
    """The running lab: its clouds, processes and clouds.yaml, and how to restart its parts
    (the lab's own code: scoperouter_lab)."""

    def __init__(self) -> None:
        from scoperouter_lab.cloud import Step
        from scoperouter_lab.lab import Lab
        from scoperouter_lab.layout import default_dir

        self.lab = Lab(default_dir(), out=open(os.devnull, "w"))  # noqa: SIM115
        if not self.lab.state:
            raise ChaosError(f"no lab in {self.lab.paths.root}: run `scoperouter lab up` first")
        if not self.lab.routed or len(self.lab.clouds) < 2:
            raise ChaosError("the lab must be routed, with two clouds at least")
        self.clouds = self.lab.clouds[:2]
        self.step = Step(report=lambda label, result, took: None)
        self.clouds_yaml = self.lab.paths.clouds_yaml
        self.entries: dict[str, Any] = yaml.safe_load(self.clouds_yaml.read_text())["clouds"]
        self.services = set(self.lab.services)

    def router(self, cloud: Any) -> Any:
        rec = self.lab.procs.running(f"{cloud.slug}-router")
        if rec is None:
            raise ChaosError(f"{cloud.name}'s router is not running")
        return rec

    def router_log(self, cloud: Any) -> Path:
        return Path(self.lab.paths.log(cloud, "router"))

    def restart_router(self, cloud: Any) -> None:
        """SIGTERM (the router drains), then started again as `lab up` starts it."""
        self.lab.procs.stop(f"{cloud.slug}-router")
        self.lab._ensure_router(cloud)

    def restart_keystone(self, cloud: Any) -> None:
        runner = self.lab.runner(cloud, self.step)
        self.lab.procs.stop(runner.pname("keystone"))
        runner._start("keystone")
        runner.wait_ready("keystone")
