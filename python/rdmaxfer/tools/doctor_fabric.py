"""``rdmaxfer doctor``'s fabric check: does the traffic class rdmaxfer puts on RoCE packets
land on the priority the NIC runs lossless (PFC) and marks congestion on (ECN)?

The traffic class (``Engine(traffic_class=)`` or ``RDMAXFER_TRAFFIC_CLASS``, default 0) is the
IP TOS byte of RoCE v2 packets: DSCP = traffic class >> 2. A NIC that trusts DSCP maps it to a
priority (the default map, kept by mlx5 and the switch defaults: priority = DSCP >> 3); one
that trusts PCP uses the VLAN priority, i.e. the service level. Where sysfs shows them (the
mlx5 / MLNX_OFED layout), the check reads:

- ``/sys/class/net/<netdev>/qos/trust``: ``pcp`` or ``dscp``;
- ``/sys/class/net/<netdev>/qos/pfc``: eight 0/1 flags, PFC per priority 0..7;
- ``/sys/class/net/<netdev>/ecn/roce_np/enable/<prio>`` and ``.../roce_rp/enable/<prio>``:
  RoCE congestion control (notification point / reaction point) per priority;
- ``/sys/class/infiniband/<dev>/tc/<port>/traffic_class``: a traffic class the NIC forces on
  every QP of that port (``tclass=N``), overriding the engine's.

Nothing shown: an ``info`` finding says so (PFC is then set by ``dcb``/``mlnx_qos`` and cannot
be checked from sysfs).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from ..errors import InvalidArgumentError
from ..options import env_setting
from .doctor_facts import Finding, read

ENV_TRAFFIC_CLASS = "RDMAXFER_TRAFFIC_CLASS"
ENV_SERVICE_LEVEL = "RDMAXFER_SERVICE_LEVEL"


def _setting(value: int | None, env: Mapping[str, str] | None, name: str, top: int) -> int | str:
    """The setting's value, or the text of why it is invalid."""
    if value is None:
        try:
            value = env_setting(name, env)
        except InvalidArgumentError as exc:
            return str(exc)
        assert isinstance(value, int)
    if not 0 <= value <= top:
        return f"{value} is outside 0..{top}"
    return value


def _flags(text: str | None) -> list[bool] | None:
    """Eight per-priority flags from '0,0,0,1,0,0,0,0' / '0 0 0 1 ...' ('None' when absent)."""
    if text is None:
        return None
    bits = re.findall(r"[01]", text)
    return [b == "1" for b in bits] if len(bits) == 8 else None


def _port_netdevs(sysfs: Path) -> list[tuple[str, str, str]]:
    """(device, port, netdev) of every RoCE port."""
    out = []
    base = sysfs / "class" / "infiniband"
    for dev in sorted(base.iterdir()) if base.is_dir() else []:
        ports = dev / "ports"
        for port in sorted(ports.iterdir()) if ports.is_dir() else []:
            if (read(port / "link_layer") or "") != "Ethernet":
                continue
            ndevs = sorted(
                {v for f in sorted((port / "gid_attrs" / "ndevs").glob("*")) if (v := read(f))}
            )
            if ndevs:
                out.append((dev.name, port.name, ndevs[0]))
    return out


def check_fabric(
    sysfs: Path,
    traffic_class: int | None = None,
    service_level: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[Finding]:
    """The engine's traffic class / service level against each RoCE port's PFC and ECN.

    Args:
        sysfs: root of sysfs (tests pass a fake tree).
        traffic_class, service_level: the engine's settings; None: from
            ``RDMAXFER_TRAFFIC_CLASS`` / ``RDMAXFER_SERVICE_LEVEL`` in ``environ``, else 0.
        environ: the environment (default ``os.environ``).

    Returns:
        One finding per RoCE port (none without RoCE ports), or one ``error`` for an invalid
        setting.
    """
    tc = _setting(traffic_class, environ, ENV_TRAFFIC_CLASS, 255)
    sl = _setting(service_level, environ, ENV_SERVICE_LEVEL, 15)
    for name, got in (("traffic_class", tc), ("service_level", sl)):
        if isinstance(got, str):
            return [Finding("fabric", "error", name, got, f"set {name} / the variable in range")]
    assert isinstance(tc, int) and isinstance(sl, int)
    dscp = tc >> 2
    out = []
    for dev, port, ndev in _port_netdevs(sysfs):
        subject = f"{dev} port {port} ({ndev})"
        net = sysfs / "class" / "net" / ndev
        trust = (read(net / "qos" / "trust") or "").strip().lower()
        prio = sl & 7 if trust == "pcp" else dscp >> 3
        how = f"service level {sl} (PCP trust)" if trust == "pcp" else f"DSCP {dscp}"
        ours = f"traffic class {tc}: {how} -> priority {prio}"
        problems: list[str] = []
        fixes: list[str] = []
        forced = read(sysfs / "class" / "infiniband" / dev / "tc" / port / "traffic_class")
        m = re.search(r"(\d+)", forced or "")
        if m is not None and int(m.group(1)) != tc:
            problems.append(f"the NIC forces traffic class {m.group(1)} on every QP")
            fixes.append(
                f"set traffic_class={m.group(1)} or clear the NIC's tc/{port}/traffic_class"
            )
        pfc = _flags(read(net / "qos" / "pfc"))
        if pfc is not None and any(pfc) and not pfc[prio]:
            lossless = [p for p, on in enumerate(pfc) if on]
            problems.append(f"PFC is on for priority {lossless} but not {prio}")
            target = lossless[0]
            fixes.append(
                f"traffic_class={(target << 3) << 2} (DSCP {target << 3} -> priority {target})"
                if trust != "pcp"
                else f"service_level={target}"
            )
        ecn = {
            point: read(net / "ecn" / point / "enable" / str(prio))
            for point in ("roce_np", "roce_rp")
        }
        off = [point for point, v in ecn.items() if v is not None and v.strip() == "0"]
        if off:
            problems.append(f"ECN ({'/'.join(off)}) is off for priority {prio}")
            fixes.append(f"echo 1 > /sys/class/net/{ndev}/ecn/<point>/enable/{prio}")
        if problems:
            out.append(
                Finding(
                    "fabric", "warn", subject, f"{ours}; " + "; ".join(problems), "; ".join(fixes)
                )
            )
        elif pfc is None and all(v is None for v in ecn.values()) and m is None:
            out.append(
                Finding(
                    "fabric",
                    "info",
                    subject,
                    f"{ours}; sysfs shows no PFC/ECN setting for {ndev} (check "
                    "with `dcb pfc show dev " + ndev + "`)",
                )
            )
        else:
            out.append(Finding("fabric", "ok", subject, f"{ours}, lossless/ECN as configured"))
    return out
