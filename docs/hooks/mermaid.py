"""MkDocs hook: the site serves its own copy of mermaid, so diagrams render without a CDN.

Material for MkDocs loads mermaid from unpkg.com unless the page already has it. With
``npm ci --prefix docs`` run (the version pinned in ``docs/package.json``, as ``.ci/run``
does), the built site carries ``javascripts/mermaid.min.js`` and every page loads it (the
``extra_javascript`` of ``mkdocs.yml``): a site served inside a network without internet access
still draws its diagrams. Without it, the script is missing (a 404) and Material falls back to
the CDN.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

SOURCE = Path(__file__).resolve().parent.parent / "node_modules/mermaid/dist/mermaid.min.js"
TARGET = "javascripts/mermaid.min.js"


def on_files(files: Files, config: Any, **kwargs: Any) -> Files:
    if SOURCE.is_file():
        files.append(File.generated(config, TARGET, abs_src_path=str(SOURCE)))
    return files
