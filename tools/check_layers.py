"""Fails on a C++ include that goes up a floor of csrc/.

The floors, lowest first (docs/internals.md): a file may include its own floor and the
floors below it, never one above::

    common -> core -> cuda -> transport -> protocol -> engine -> bindings

Usage: ``python tools/check_layers.py [CSRC]`` (default: the csrc/ next to this script). Prints
one line per upward include (``file:line: floor 'transport' includes 'engine/x.h' (floor
'engine', above)``) and exits 1 when there is any, 0 otherwise.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

FLOORS = ("common", "core", "cuda", "transport", "protocol", "engine", "bindings")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def floor_of(relative: str) -> str | None:
    """The floor a path under csrc/ ("transport/tcp/wire.h") is on, or None if it names none."""
    top = relative.split("/", 1)[0]
    return top if top in FLOORS else None


def violations(csrc: Path) -> list[str]:
    """One message per include in ``csrc`` that goes up a floor or into an unknown one."""
    found = []
    for path in sorted(csrc.rglob("*")):
        if path.suffix not in (".h", ".cc") or not path.is_file():
            continue
        relative = path.relative_to(csrc).as_posix()
        own = floor_of(relative)
        if own is None:
            found.append(f"{relative}: not on a floor (top folder must be one of {FLOORS})")
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            match = INCLUDE.match(line)
            if match is None:
                continue
            target = floor_of(match.group(1))
            if target is None:
                found.append(f"{relative}:{number}: includes '{match.group(1)}', on no floor")
            elif FLOORS.index(target) > FLOORS.index(own):
                found.append(
                    f"{relative}:{number}: floor '{own}' includes '{match.group(1)}' "
                    f"(floor '{target}', above)"
                )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parent.parent / "csrc"
    parser.add_argument("csrc", nargs="?", type=Path, default=default, help="the csrc/ folder")
    args = parser.parse_args(argv)
    if not args.csrc.is_dir():
        parser.error(f"{args.csrc} is not a folder: pass the repository's csrc/")
    found = violations(args.csrc)
    for message in found:
        print(message)
    if found:
        print(f"{len(found)} include(s) against the floors {' -> '.join(FLOORS)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
