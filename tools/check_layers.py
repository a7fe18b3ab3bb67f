"""Fails on a C++ include that goes up a floor of csrc/, or across its rooms in a circle.

The floors, lowest first (docs/internals.md): a file may include its own floor and the
floors below it, never one above::

    common -> core -> cuda -> transport -> protocol -> engine -> bindings

Each subfolder of a floor is a room of its own (``transport/tcp``, ``transport/shm``...); the
files directly in the floor's folder are its interface (``transport``: the Transport and
Channel interface, the registry, shared modules). The interface includes none of its floor's
rooms, and no rooms of one floor include each other in a circle (``transport/shm`` ->
``transport/tcp`` -> ``transport/shm``): a transport is its folder, and leaving one out of the
build breaks no other.

Usage: ``python tools/check_layers.py [CSRC]`` (default: the csrc/ next to this script). Prints
one line per upward include (``file:line: floor 'transport' includes 'engine/x.h' (floor
'engine', above)``), per include of a room by its interface, and per cycle of rooms, and exits
1 when there is any, 0 otherwise.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

FLOORS = ("common", "core", "cuda", "transport", "protocol", "engine", "bindings")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def floor_of(relative: str) -> str | None:
    """The floor a path under csrc/ ("transport/tcp/io_loop.h") is on, or None if it names none."""
    top = relative.split("/", 1)[0]
    return top if top in FLOORS else None


def room_of(relative: str) -> str:
    """The room of a path under csrc/: "transport/tcp" for "transport/tcp/tcp_stream.h", the floor
    ("transport") for a file directly in the floor's folder (its interface)."""
    parts = relative.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The include cycles of the room graph ``edges`` (room -> rooms it includes), each once,
    as the rooms in order starting from the smallest name."""
    found: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()

    def walk(path: list[str]) -> None:
        for nxt in sorted(edges.get(path[-1], ())):
            if nxt == path[0]:
                if tuple(sorted(path)) not in seen:
                    seen.add(tuple(sorted(path)))
                    found.append(path[:])
            elif nxt not in path and nxt > path[0]:
                walk([*path, nxt])

    for start in sorted(edges):
        walk([start])
    return found


def violations(csrc: Path) -> list[str]:
    """One message per include in ``csrc`` that goes up a floor or into an unknown one, per
    include of a room by its floor's interface, and per cycle between rooms of one floor."""
    found = []
    rooms: dict[str, set[str]] = {}
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
            elif target == own:
                here, there = room_of(relative), room_of(match.group(1))
                if here == own and there != own:
                    found.append(
                        f"{relative}:{number}: the interface of floor '{own}' includes "
                        f"'{match.group(1)}' (room '{there}')"
                    )
                elif here != there:
                    rooms.setdefault(here, set()).add(there)
    for cycle in cycles(rooms):
        found.append("include cycle between rooms: " + " -> ".join([*cycle, cycle[0]]))
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
