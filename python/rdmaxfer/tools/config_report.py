"""``rdmaxfer info --config``: every setting of the option tables (:mod:`rdmaxfer.options`) with
its environment variable, default, current value and help, and the tests-only switches
(:mod:`rdmaxfer._test_hooks`); also the configuration page of the documentation, generated
from the same tables (``python tools/config_docs.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .._test_hooks import TEST_HOOKS
from ..errors import InvalidArgumentError
from ..options import TABLES, Option

__all__ = ["config_markdown", "config_rows", "print_config"]

_WHERE = {
    "process": "the whole process (environment only)",
    "engine": "every transport of an engine: EngineOptions",
    "tcp": "the tcp transport: TcpOptions",
    "shm": "the shm transport: ShmOptions",
    "rdma": "the rdma (verbs) transport: RdmaOptions",
    "ofi": "the ofi (libfabric) transport (environment only)",
}


def _current(option: Option, environ: Mapping[str, str] | None) -> tuple[Any, str]:
    """(the value in force, where it comes from: "env", "default" or "invalid: ...")."""
    try:
        value = option.from_env(environ)
    except InvalidArgumentError as exc:
        return None, f"invalid: {exc}"
    if value is None:
        return option.default, "default"
    if option.kind == "secret":
        return "(set)", "env"
    return value, "env"


def config_rows(environ: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One dict per setting, table by table (``table``, ``name``, ``type``, ``default``,
    ``unit``, ``env``, ``current``, ``source``, ``field``, ``read_by``, ``help``), then one per
    tests-only switch (``table`` "tests-only"); ``environ`` defaults to ``os.environ``."""
    rows: list[dict[str, Any]] = []
    for table, options in TABLES.items():
        for o in options:
            current, source = _current(o, environ)
            rows.append({
                "table": table, "name": o.name, "type": o.kind, "default": o.default,
                "unit": o.unit, "env": o.env, "current": current, "source": source,
                "field": o.field, "read_by": o.read_by, "help": o.help,
            })  # fmt: skip
    for env, what in TEST_HOOKS.items():
        rows.append({
            "table": "tests-only", "name": env, "type": "str", "default": None, "unit": "",
            "env": env, "current": None, "source": "", "field": False, "read_by": "",
            "help": what,
        })  # fmt: skip
    return rows


def print_config(as_json: bool, environ: Mapping[str, str] | None = None) -> None:
    """Print :func:`config_rows` as text grouped by table, or as one JSON list."""
    rows = config_rows(environ)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = None
    for r in rows:
        if r["table"] != table:
            table = r["table"]
            where = _WHERE.get(table, "switches of the project's tests; never set them")
            print(f"\n[{table}] {where}")
        if table == "tests-only":
            print(f"  {r['env']}: {r['help']}")
            continue
        unit = f" {r['unit']}" if r["unit"] else ""
        env = r["env"] or "(no variable: per engine)"
        field = "" if r["field"] else "  (environment only)"
        now = f"{r['current']!r}{unit} ({r['source']})" if r["source"] != "default" else "default"
        if r["source"].startswith("invalid"):
            now = r["source"]
        print(f"  {r['name']:18} {env}{field}")
        default = "automatic" if r["default"] is None else f"{r['default']!r}{unit}"
        print(f"      default {default}; now: {now}")
        print(f"      {r['help']}")


def config_markdown() -> str:
    """The documentation's configuration page (docs/configuration.md), from the tables."""
    out = [
        "# Configuration",
        "",
        "Every setting, as `rdmaxfer info --config` lists it (with the values in force) and as",
        "`rdmaxfer.options` declares it: one table per transport, plus the settings every",
        "transport of an engine shares and those of the whole process. An engine takes them as",
        "typed objects:",
        "",
        "```python",
        "import rdmaxfer",
        "",
        "engine = rdmaxfer.Engine(",
        '    "rdma",',
        "    options=[",
        '        rdmaxfer.EngineOptions(poll_mode="busy"),',
        '        rdmaxfer.RdmaOptions(devices=["mlx5_0", "mlx5_1"], traffic_class=104),',
        "    ],",
        ")",
        "```",
        "",
        "A field left at None takes its environment variable when set, else the default; a",
        "setting marked *environment only* has no field and is read from its variable. A bad",
        "value, in a field or a variable, raises `InvalidArgumentError` naming the setting and",
        "what it must be. The older keywords of `Engine()` (`streams=`, `rdma_device=`,",
        "`poll_mode=`...) set the same fields.",
        "",
        "<!-- generated from python/rdmaxfer/options.py by tools/config_docs.py: do not edit -->",
    ]
    for table, options in TABLES.items():
        out += ["", f"## {table}: {_WHERE[table]}", ""]
        out += ["| setting | variable | default | help |", "|---|---|---|---|"]
        for o in options:
            name = f"`{o.name}`" + ("" if o.field else " (environment only)")
            env = f"`{o.env}`" if o.env else "(none: per engine)"
            default = o.describe_default().replace("|", "\\|")
            out.append(f"| {name} | {env} | {default} | {o.help.replace('|', '/')} |")
    out += [
        "",
        "## Tests-only switches",
        "",
        "Set by the project's tests and its soft-RoCE guest; never set them otherwise.",
        "",
        "| variable | what it does |",
        "|---|---|",
    ]
    out += [f"| `{env}` | {what} |" for env, what in TEST_HOOKS.items()]
    return "\n".join(out) + "\n"
