"""`compass crds`: write (or check) the CRD YAML and reference generated from the models."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from compass.api.crds import render_crd_templates, render_crds
from compass.api.reference import render_reference
from compass.console import fail
from compass.evaluators.files import write_replacing


def register(commands: Any, summary: str) -> None:
    """Add `compass crds` to the `compass` parser."""
    crds = commands.add_parser(
        "crds",
        help=summary,
        description="Render the compass.io CRDs from their pydantic models (the single source "
        "of truth) into a directory; --check only reports whether the files there are current.",
    )
    crds.add_argument("--output-dir", default="crds", help="where to write (default: crds)")
    crds.add_argument("--check", action="store_true", help="fail if the files are stale")
    crds.add_argument(
        "--helm-template",
        action="store_true",
        help="write the Helm chart's CRD templates instead (charts/compass-operator/templates/"
        "crds): installed only with crds.install, kept on uninstall with crds.keep, the CEL "
        "rules only where the API server supports them",
    )
    crds.add_argument(
        "--reference",
        metavar="FILE",
        help="also write (with --check: verify) the markdown CRD reference rendered from the "
        "same models, e.g. docs/crd-reference.md (always with the CEL rules)",
    )
    crds.set_defaults(handler=crds_command)


def _stale(path: Path, text: str, *, write: bool) -> bool:
    """Whether the file at path differs from text; rewritten when write is set."""
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    if write:
        write_replacing(path, text)
    return True


def crds_command(args: argparse.Namespace) -> int:
    """`compass crds`: write or check the generated CRD YAML."""
    directory = Path(str(args.output_dir))
    if not directory.is_dir():
        fail("--output-dir", f"{directory} is not a directory", "create it or pass another")
    rendered = render_crd_templates() if args.helm_template else render_crds()
    stale = [
        name
        for name, text in rendered.items()
        if _stale(directory / name, text, write=not args.check)
    ]
    reference_stale = False
    if args.reference is not None:
        reference = Path(str(args.reference))
        if not reference.parent.is_dir():
            fail(
                "--reference", f"{reference.parent} is not a directory", "create it or pass another"
            )
        reference_stale = _stale(reference, render_reference(), write=not args.check)
    if args.check and (stale or reference_stale):
        if stale:
            print(
                f"compass crds: stale in {directory}: {', '.join(stale)}; run `compass crds "
                f"{'--helm-template ' if args.helm_template else ''}--output-dir {directory}` "
                "(hack/gen-crds.sh does) and commit the result",
                file=sys.stderr,
            )
        if reference_stale:
            print(
                f"compass crds: stale: {args.reference}; run `compass crds --reference "
                f"{args.reference}` (hack/gen-crds.sh does) and commit the result",
                file=sys.stderr,
            )
        return 1
    verb = "up to date" if not stale else f"wrote {', '.join(stale)}"
    print(f"compass crds: {directory}: {verb}")
    if args.reference is not None:
        done = "wrote it" if reference_stale else "up to date"
        print(f"compass crds: {args.reference}: {done}")
    return 0
