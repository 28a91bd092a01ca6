"""What ``lab up`` prints at its end: the first commands to try, each runnable as printed.

A command is printed by its bare name only when ``PATH`` finds that very program (the venv of
scoperouter is often not on ``PATH``: then its absolute path), and only for the services the lab
runs (no ``server create`` without nova, no image examples without glance).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from scoperouter_lab.layout import CloudSpec, LabPaths


def runnable(name: str, bin_dir: Path) -> str | None:
    """How to call the program ``name`` of ``bin_dir`` from a shell: its bare name when
    ``PATH`` finds that same file, else its absolute path; None when ``bin_dir`` has none."""
    ours = shutil.which(name, path=str(bin_dir))
    if ours is None:
        return None
    on_path = shutil.which(name)
    if on_path is not None and Path(on_path).resolve() == Path(ours).resolve():
        return name
    return str(Path(ours).absolute())


@dataclass(frozen=True)
class Commands:
    """The programs the lines name: scoperouter's console script, and the ``openstack`` CLI
    carrying the --os-scope plugin (None: only the lab venv's, which does not)."""

    scoperouter: str
    openstack: str | None
    lab_openstack: str

    @classmethod
    def find(cls, bin_dir: Path, paths: LabPaths) -> Commands:
        """``bin_dir``: the directory of the Python running the lab (scoperouter's venv)."""
        return cls(
            scoperouter=runnable("scoperouter", bin_dir) or "scoperouter",
            openstack=runnable("openstack", bin_dir),
            lab_openstack=str(paths.venv / "bin" / "openstack"),
        )


def next_steps(
    clouds: Sequence[CloudSpec],
    services: Sequence[str],
    paths: LabPaths,
    routed: bool,
    cmd: Commands,
) -> str:
    c1 = clouds[0]
    other = clouds[1] if len(clouds) > 1 else c1
    cli = cmd.openstack or cmd.lab_openstack
    lines = ["", "Next:", f"  export OS_CLIENT_CONFIG_FILE={paths.clouds_yaml}"]
    if "glance" in services:
        lines.append(f"  {cli} --os-cloud {c1.slug} image list")
    else:
        lines.append(f"  {cli} --os-cloud {c1.slug} token issue")
    if "nova" in services:
        lines.append(
            f"  {cli} --os-cloud {c1.slug} server create --image tiny --flavor m1.tiny "
            "--nic none vm1 --wait"
        )
    if "glance" in services and routed:
        scope = f'{{"image": "{other.name}"}}'
        lines.append(f"  # scoped: enter {c1.name}, use the images of {other.name}")
        if cmd.openstack:
            lines.append(f"  {cli} --os-cloud {c1.slug} --os-scope '{scope}' image list")
            if "nova" in services:
                tiny = f"$({cli} --os-cloud {other.slug} image show tiny -f value -c id)"
                lines += [
                    f"  # the headline: a server in {c1.name} booted from an image of {other.name}",
                    f"  {cli} --os-cloud {c1.slug} --os-scope '{scope}' \\",
                    f"      server create --image {tiny} --flavor m1.tiny --nic none vm2 --wait",
                ]
        else:
            image_front = c1.endpoint_url("image", routed)
            lines += [
                "  # (pip install 'scoperouter[client]' adds --os-scope to the openstack CLI)",
                f"  TOKEN=$({cli} --os-cloud {c1.slug} token issue -f value -c id)",
                f"  curl -s -H \"X-Auth-Token: $TOKEN\"'!SCOPE!{scope.replace(' ', '')}' "
                f"{image_front}/v2/images",
            ]
    sr = cmd.scoperouter
    lines += [
        f"Federation config: {paths.federation_yaml}",
        f"Logs: {paths.logs}/<cloud>/<service>.log",
        f"Status: {sr} lab status     Stop: {sr} lab down",
    ]
    if not routed:
        lines.append("NOTE: no router in front of the clouds (scoped calls are not routed).")
    return "\n".join(lines)
