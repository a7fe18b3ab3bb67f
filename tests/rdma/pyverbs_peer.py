"""An independent RDMA peer for the interop test, written with Debian's pyverbs (rdma-core).

It creates its own PD, CQ, RC QP and MR, connects to an rdmaxfer engine by speaking rdmaxfer's
documented bootstrap (Hello/HelloAck, csrc/transport/bootstrap.h) and endpoint record
(csrc/transport/rdma/endpoint_record.h) with ``struct``, then:

1. RDMA-WRITEs random bytes into the rdmaxfer buffer named on the command line;
2. reports its own MR (address, rkey) so rdmaxfer can RDMA-WRITE into it;
3. receives one rdmaxfer message through the two-sided protocol
   (csrc/transport/rdma/control_msg.h): RTS in a receive buffer, CTS back with its MR's address
   and rkey, then waits for the WRITE_WITH_IMM whose immediate is the message id.

Talks JSON lines on stdout; reads commands from stdin. Run with /usr/bin/python3 (or any
CPython 3.11 with PYTHONPATH=$RDMAXFER_PYVERBS_PATH). Every wait is bounded.

Usage: pyverbs_peer.py DEVICE GID_INDEX HOST PORT REMOTE_ADDR REMOTE_RKEY LENGTH SEED
"""

from __future__ import annotations

import json
import random
import socket
import struct
import sys
import time

import pyverbs.enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

TIMEOUT_S = 60.0
CTRL_SIZE = 4096
CTRL_DEPTH = 8
ENGINE_ID = 0x5059564552425321  # arbitrary
RESPONDER_RESOURCES = 1  # RDMA READs we serve at once (endpoint record byte 44)
INITIATOR_DEPTH = 2  # RDMA READs we keep outstanding (byte 45)
HEADER = struct.Struct("<HBBIQQQII8x")  # control message header, 48 bytes


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("rdmaxfer closed the bootstrap connection")
        buf += chunk
    return buf


def poll_one(cq: CQ, what: str) -> object:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        n, wcs = cq.poll(num_entries=1)
        if n:
            wc = wcs[0]
            if wc.status != e.IBV_WC_SUCCESS:
                raise RuntimeError(f"{what}: completion status {wc.status}")
            return wc
        time.sleep(0.0005)
    raise TimeoutError(f"{what}: no completion within {TIMEOUT_S} s")


def main() -> None:
    dev, gid_index, host, port = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    raddr, rkey, length, seed = (int(x) for x in sys.argv[5:9])
    rnd = random.Random(seed)

    ctx = Context(name=dev)
    port_attr = ctx.query_port(1)
    gid = ctx.query_gid(1, gid_index)
    gid_raw = bytes.fromhex(gid.gid.replace(":", ""))
    pd = PD(ctx)
    cq = CQ(ctx, 64)
    cap = QPCap(max_send_wr=16, max_recv_wr=CTRL_DEPTH, max_send_sge=1, max_recv_sge=1)
    access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
    init = QPAttr(port_num=1)
    init.qp_access_flags = access  # the QP must admit remote WRITEs (the MR decides where)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap), init)
    data_mr = MR(pd, length, access)  # rdmaxfer WRITEs here
    src_mr = MR(pd, length, e.IBV_ACCESS_LOCAL_WRITE)  # we WRITE from here
    ctrl_mr = MR(pd, CTRL_SIZE * (CTRL_DEPTH + 1), e.IBV_ACCESS_LOCAL_WRITE)  # receives + 1 send
    for i in range(CTRL_DEPTH):  # posted in INIT, before the peer can send
        sge = SGE(ctrl_mr.buf + i * CTRL_SIZE, CTRL_SIZE, ctrl_mr.lkey)
        qp.post_recv(RecvWR(wr_id=i, num_sge=1, sg=[sge]))
    psn = rnd.getrandbits(24)

    # Bootstrap: Hello (32 bytes) -> HelloAck (16 bytes), transport 2 = rdma, one stream.
    sock = socket.create_connection((host, port), timeout=TIMEOUT_S)
    sock.sendall(struct.pack("<4sHBBB7xQQ", b"RXHI", 1, 2, 0, 1, ENGINE_ID, rnd.getrandbits(64)))
    magic, _version, status, _engine = struct.unpack("<4sHHQ", recv_exact(sock, 16))
    assert magic == b"RXOK" and status == 0, (magic, status)

    # Endpoint records: ours first (we connect), then rdmaxfer's.
    record = struct.pack(
        "<4sHBBHBBB3x16sIIIBB2xQQ",
        b"RXEP",
        2,
        2,
        1,
        port_attr.lid,
        port_attr.active_mtu,
        1,
        gid_index,
        gid_raw,
        port_attr.max_msg_sz,
        CTRL_SIZE,
        CTRL_DEPTH,
        RESPONDER_RESOURCES,
        INITIATOR_DEPTH,
        ENGINE_ID,
        0,
    ) + struct.pack("<II", qp.qp_num, psn)
    sock.sendall(record)
    head = recv_exact(sock, 64)
    (
        magic,
        version,
        link,
        n_qps,
        _lid,
        mtu,
        _port,
        _gidx,
        extra_rails,
        peer_gid,
        _max_msg,
        peer_ctrl_size,
        _depth,
        peer_responder,
        peer_initiator,
        _engine2,
        _res,
    ) = struct.unpack("<4sHBBHBBBB2x16sIIIBB2xQQ", head)
    assert magic == b"RXEP" and version == 2 and link == 2 and n_qps == 1, head
    qp_word, psn_word = struct.unpack("<II", recv_exact(sock, 8))
    # The QP's rail (bits 24-31) is one of rdmaxfer's that reaches ours; its other rails'
    # records (32 bytes each) follow the QP list.
    peer_qpn, peer_psn = qp_word & 0xFFFFFF, psn_word & 0xFFFFFF
    recv_exact(sock, 32 * extra_rails)

    attr = QPAttr(port_num=1)
    attr.path_mtu = min(mtu, port_attr.active_mtu)
    attr.dest_qp_num = peer_qpn
    attr.rq_psn = peer_psn
    attr.sq_psn = psn
    attr.max_dest_rd_atomic = min(RESPONDER_RESOURCES, peer_initiator)
    attr.max_rd_atomic = min(INITIATOR_DEPTH, peer_responder)
    attr.min_rnr_timer = 12
    attr.timeout = 16
    attr.retry_cnt = 7
    attr.rnr_retry = 7
    dgid = GID(":".join(peer_gid[i : i + 2].hex() for i in range(0, 16, 2)))
    attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=GlobalRoute(dgid=dgid, sgid_index=gid_index))
    qp.to_rts(attr)
    sock.sendall(b"R")  # READY
    assert recv_exact(sock, 1) == b"R"

    # 1. Our RDMA WRITE into rdmaxfer's buffer.
    payload = bytes(rnd.getrandbits(8) for _ in range(length))
    src_mr.write(payload, length, 0)
    wr = SendWR(
        wr_id=100,
        opcode=e.IBV_WR_RDMA_WRITE,
        num_sge=1,
        sg=[SGE(src_mr.buf, length, src_mr.lkey)],
        send_flags=e.IBV_SEND_SIGNALED,
    )
    wr.set_wr_rdma(rkey, raddr)
    qp.post_send(wr)
    poll_one(cq, "RDMA WRITE into rdmaxfer")
    emit(
        step="wrote",
        hex=payload.hex(),
        mr_addr=data_mr.buf,
        mr_rkey=data_mr.rkey,
        engine_id=ENGINE_ID,
    )

    # 2. rdmaxfer WRITEs into data_mr; the test tells us what to expect.
    cmd = json.loads(sys.stdin.readline())
    got = data_mr.read(length, 0)
    emit(step="checked", match=got.hex() == cmd["hex"])

    # 3. One rendezvous message: RTS -> our CTS -> rdmaxfer's WRITEs + WRITE_WITH_IMM.
    wc = poll_one(cq, "receiving the RTS")
    slot = wc.wr_id
    raw = ctrl_mr.read(wc.byte_len, slot * CTRL_SIZE)
    _magic, _ver, mtype, meta_len, msg_id, size, _a, _k, _p = HEADER.unpack_from(raw)
    meta = raw[HEADER.size : HEADER.size + meta_len]
    assert mtype == 1 and size == length, (mtype, size)  # RTS
    sge = SGE(ctrl_mr.buf + slot * CTRL_SIZE, CTRL_SIZE, ctrl_mr.lkey)
    qp.post_recv(RecvWR(wr_id=slot, num_sge=1, sg=[sge]))  # for the WRITE_WITH_IMM
    cts = HEADER.pack(0x4352, 1, 3, 0, msg_id, size, data_mr.buf, data_mr.rkey, 0)
    assert len(cts) <= peer_ctrl_size
    off = CTRL_DEPTH * CTRL_SIZE
    ctrl_mr.write(cts, len(cts), off)
    send = SendWR(
        wr_id=101,
        opcode=e.IBV_WR_SEND,
        num_sge=1,
        sg=[SGE(ctrl_mr.buf + off, len(cts), ctrl_mr.lkey)],
        send_flags=e.IBV_SEND_SIGNALED,
    )
    qp.post_send(send)
    imm_wc = None
    for _ in range(2):  # our SEND's completion and the WRITE_WITH_IMM's receive, any order
        wc = poll_one(cq, "CTS / WRITE_WITH_IMM")
        if wc.opcode == e.IBV_WC_RECV_RDMA_WITH_IMM:
            imm_wc = wc
    assert imm_wc is not None, "no WRITE_WITH_IMM arrived"
    imm = socket.ntohl(imm_wc.imm_data)
    got = data_mr.read(length, 0)
    emit(step="message", meta=meta.decode(), imm=imm, msg_low32=msg_id & 0xFFFFFFFF, hex=got.hex())
    sys.stdin.readline()  # wait for the test to finish before closing
    sock.close()


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # report, do not hang the test
        emit(step="error", error=f"{type(exc).__name__}: {exc}")
        sys.exit(1)
