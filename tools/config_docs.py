"""Writes docs/configuration.md from the option tables (python/rdmaxfer/options.py).

Usage: python tools/config_docs.py [--check]   (with the package installed)
   (--check: fail when the page is out of date)
"""

from __future__ import annotations

import sys
from pathlib import Path

from rdmaxfer.tools.config_report import config_markdown

ROOT = Path(__file__).resolve().parent.parent

PAGE = ROOT / "docs" / "configuration.md"


def main(argv: list[str]) -> int:
    text = config_markdown()
    if "--check" in argv:
        if PAGE.read_text() != text:
            print(f"{PAGE} is out of date: run python tools/config_docs.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
