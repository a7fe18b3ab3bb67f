"""The option tables (rdmaxfer.options): typed options per transport, Engine(options=...), bad
values, `rdmaxfer info --config` and the rule that only the tables (and the test hooks) read
the package's environment variables."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import rdmaxfer
from rdmaxfer import (
    Engine,
    EngineOptions,
    InvalidArgumentError,
    RdmaOptions,
    ShmOptions,
    TcpOptions,
)
from rdmaxfer._test_hooks import TEST_HOOKS
from rdmaxfer.options import TABLES, declared, env_setting
from rdmaxfer.tools.config_report import config_markdown, config_rows

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "python" / "rdmaxfer"
CSRC = ROOT / "csrc"

#: The Python modules that may read the package's variables from the environment.
READERS = {"options.py", "_option.py", "_test_hooks.py"}
#: The only C++ file that names a tests-only variable.
CXX_TEST_HOOKS = "common/test_hooks.h"

DECLARED = {o.env for t in TABLES.values() for o in t if o.env}
TOKEN = re.compile(r"RDMAXFER_[A-Z0-9_]*[A-Z0-9]\b")


def test_every_row_is_complete_and_declared_once() -> None:
    names = [(table, o.name) for table, rows in TABLES.items() for o in rows]
    envs = [o.env for rows in TABLES.values() for o in rows if o.env]
    assert len(set(names)) == len(names) and len(set(envs)) == len(envs)
    for rows in TABLES.values():
        for o in rows:
            assert o.help and o.kind in ("int", "float", "bool", "str", "choice", "names", "secret")
            assert o.read_by in ("python", "core")
            assert o.env is None or o.env.startswith("RDMAXFER_")
            assert o.field or o.env, f"{o.name}: neither a field nor a variable"
    assert not DECLARED & set(TEST_HOOKS)


def test_options_take_typed_values() -> None:
    rdma = RdmaOptions(devices="mlx5_0, mlx5_1", traffic_class=104, qps=2)
    assert rdma.devices == ["mlx5_0", "mlx5_1"] and rdma.traffic_class == 104
    assert rdma.given() == {"devices": ["mlx5_0", "mlx5_1"], "qps": 2, "traffic_class": 104}
    assert rdma == RdmaOptions(devices=["mlx5_0", "mlx5_1"], qps=2, traffic_class=104)
    assert repr(EngineOptions(secret="s3")) == "EngineOptions(secret=***)"
    with pytest.raises(AttributeError, match="immutable"):
        rdma.qps = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: RdmaOptions(gid_index=-1),
            r"RdmaOptions\(gid_index=-1\): gid_index must be an integer in 0..65535, or None "
            r"for the default \(automatic\)",
        ),
        (lambda: RdmaOptions(traffic_class=256), r"traffic_class must be an integer in 0..255"),
        (lambda: RdmaOptions(qps=True), r"RdmaOptions\(qps=True\): qps must be an integer"),
        (lambda: RdmaOptions(devices=[]), r"devices must be device names"),
        (
            lambda: TcpOptions(socket_buffer=-1),
            r"socket_buffer must be an integer in 0..2147483647 bytes",
        ),
        (
            lambda: EngineOptions(poll_mode="fast"),
            r"poll_mode must be 'adaptive' or 'busy' or 'event'",
        ),
        (
            lambda: RdmaOptions(srq=False),
            r"RdmaOptions\(\) has no option 'srq' .*set by RDMAXFER_SRQ only",
        ),
        (
            lambda: ShmOptions(streams=2),
            r"ShmOptions\(\) has no option 'streams' \(its options: none\)",
        ),
    ],
)
def test_bad_option_names_itself_and_the_fix(make: object, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        make()  # type: ignore[operator]


def test_engine_takes_options_per_transport() -> None:
    opts = [EngineOptions(poll_mode="event"), TcpOptions(streams=3, io_threads=1)]
    with Engine("tcp", options=opts) as engine:
        text = engine.describe()
    assert "3 streams per connection" in text and "poll mode event" in text
    with Engine("tcp", 1, streams=3, poll_mode="event") as engine:  # the keywords: the same
        assert engine.describe() == text


def test_engine_refuses_misplaced_or_doubled_options() -> None:
    with pytest.raises(
        InvalidArgumentError,
        match=r"RdmaOptions is for transport 'rdma', but this engine uses 'tcp'",
    ):
        Engine("tcp", options=RdmaOptions(qps=2))
    with pytest.raises(
        InvalidArgumentError, match=r"default_streams given twice.*TcpOptions\(streams=3\)"
    ):
        Engine("tcp", streams=2, options=TcpOptions(streams=3))
    with pytest.raises(InvalidArgumentError, match=r"TcpOptions given twice"):
        Engine("tcp", options=[TcpOptions(), TcpOptions(streams=1)])
    with pytest.raises(InvalidArgumentError, match=r"options='fast': give EngineOptions"):
        Engine("tcp", options="fast")  # type: ignore[arg-type]


def test_environment_fills_what_options_leave(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDMAXFER_POLL_MODE", "busy")
    with Engine("tcp", options=TcpOptions(streams=2)) as engine:
        assert "poll mode busy" in engine.describe()
    with Engine("tcp", options=EngineOptions(poll_mode="event")) as engine:
        assert "poll mode event" in engine.describe()


@pytest.mark.parametrize(
    ("env", "value", "message"),
    [
        (
            "RDMAXFER_REGCACHE_BYTES",
            "1e9",
            r"RDMAXFER_REGCACHE_BYTES='1e9' must be an integer >= 0 bytes \(regcache_bytes, "
            r"default 1073741824 bytes\); fix it or unset it",
        ),
        (
            "RDMAXFER_TRANSPORT",
            "udp",
            r"RDMAXFER_TRANSPORT='udp' must be 'auto' or 'tcp' or 'rdma' or 'shm'",
        ),
        ("RDMAXFER_SRQ", "maybe", r"RDMAXFER_SRQ='maybe' must be True or False"),
    ],
)
def test_bad_variable_names_itself(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, message: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(InvalidArgumentError, match=message):
        env_setting(env)
    assert env_setting(env, {}) == declared(env).default


def test_a_secret_is_taken_as_set() -> None:
    assert env_setting("RDMAXFER_SECRET", {"RDMAXFER_SECRET": " s3 "}) == " s3 "
    assert env_setting("RDMAXFER_SRQ_BUFFERS", {"RDMAXFER_SRQ_BUFFERS": " 64 "}) == 64


def test_info_config_lists_every_option() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rdmaxfer", "info", "--config", "--json"],
        capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "RDMAXFER_SRQ_BUFFERS": "512", "RDMAXFER_SECRET": "x"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    listed = {(r["table"], r["name"]) for r in rows}
    assert listed == {(t, o.name) for t, os_ in TABLES.items() for o in os_} | {
        ("tests-only", name) for name in TEST_HOOKS
    }
    by_env = {r["env"]: r for r in rows if r["env"]}
    assert by_env["RDMAXFER_SRQ_BUFFERS"]["current"] == 512
    assert by_env["RDMAXFER_SRQ_BUFFERS"]["source"] == "env"
    assert by_env["RDMAXFER_SECRET"]["current"] == "(set)"  # never the secret itself
    timeout = by_env["RDMAXFER_TIMEOUT"]
    assert (timeout["current"], timeout["default"], timeout["unit"]) == (60.0, 60.0, "s")
    text = subprocess.run(
        [sys.executable, "-m", "rdmaxfer", "info", "--config"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert text.returncode == 0, text.stderr
    for env in DECLARED | set(TEST_HOOKS):
        assert env in text.stdout
    assert config_rows({"RDMAXFER_GID_INDEX": "x"})[0]["source"] == "default"


def test_documentation_page_is_generated_from_the_tables() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == config_markdown(), "run: python tools/config_docs.py"


def _code_strings(tree: ast.AST) -> list[str]:
    """The string constants of a module, docstrings left out."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docs.add(id(body[0].value))
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def _reads_environment(tree: ast.AST) -> bool:
    return any(
        (isinstance(n, ast.Attribute) and n.attr in ("environ", "environb", "getenv"))
        or (isinstance(n, ast.alias) and n.name in ("environ", "getenv"))
        for n in ast.walk(tree)
    )


def test_only_the_tables_read_the_package_variables() -> None:
    """Outside options.py (with its _option.py) and _test_hooks.py no module both reads the
    environment and names an RDMAXFER_ variable in its code; every variable the package or the
    core names is declared in a table or is a tests-only switch; the core names tests-only
    switches only in its test hooks header, and exactly the variables the tables say it
    reads."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        names = {m.group(0) for s in _code_strings(tree) for m in TOKEN.finditer(s)}
        if path.name not in READERS and names and _reads_environment(tree):
            wrong.append(f"{path.relative_to(ROOT)} reads the environment: {sorted(names)}")
        undeclared = names - DECLARED - set(TEST_HOOKS)
        wrong += [f"{path.relative_to(ROOT)}: {n} undeclared" for n in sorted(undeclared)]
    core_reads = {o.env for t in TABLES.values() for o in t if o.env and o.read_by == "core"}
    named_by_core: set[str] = set()
    for path in sorted(CSRC.rglob("*")):
        if path.suffix not in (".h", ".cc", ".cpp"):
            continue
        rel = str(path.relative_to(CSRC))
        for m in re.finditer(r'"(RDMAXFER_[A-Z0-9_]+)"', path.read_text()):
            name = m.group(1)
            if name in TEST_HOOKS:
                if rel != CXX_TEST_HOOKS:
                    wrong.append(f"csrc/{rel}: tests-only {name} outside {CXX_TEST_HOOKS}")
            elif name not in core_reads:
                wrong.append(f"csrc/{rel}: {name} is not declared read_by='core'")
            else:
                named_by_core.add(name)
    wrong += [f"{n}: declared read_by='core', not in csrc" for n in core_reads - named_by_core]
    assert wrong == []


def test_public_names() -> None:
    assert {"EngineOptions", "RdmaOptions", "ShmOptions", "TcpOptions"} <= set(rdmaxfer.__all__)
    assert rdmaxfer.RdmaOptions is RdmaOptions
