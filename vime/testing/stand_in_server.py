"""A stand-in for `vllm serve` in tests of process handling: answers /health, has a child as vLLM's engine core is, starts in a fraction of a second.

``python stand_in_server.py --host H --port P [--pid-dir DIR]`` (stdlib only, run by path).
With ``--pid-dir`` it writes ``<port>.pids`` there: its own pid and its child's. `command` builds
that argv from a `vime.real.vllm.launcher.ServerSpec` (the `EngineFleet` ``command`` hook); the
pid directory comes from ``VIME_STAND_IN_PID_DIR`` in the spec's ``extra_env``.
"""

from __future__ import annotations

import argparse
import http.server
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def command(spec: Any, python: str = sys.executable) -> list[str]:
    """The argv that serves `spec`'s host and port with this stand-in."""
    argv = [python, str(Path(__file__).resolve()), "--host", spec.host, "--port", str(spec.port)]
    pid_dir = dict(spec.extra_env).get("VIME_STAND_IN_PID_DIR")
    return argv + (["--pid-dir", pid_dir] if pid_dir else [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid-dir")
    opts = ap.parse_args(argv)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    if opts.pid_dir:
        path = Path(opts.pid_dir) / f"{opts.port}.pids"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{os.getpid()} {child.pid}\n")
        tmp.rename(path)  # a reader sees both pids or no file

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *a: Any) -> None:
            pass

    print(f"stand-in listening on {opts.host}:{opts.port}", flush=True)
    http.server.HTTPServer((opts.host, opts.port), Health).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
