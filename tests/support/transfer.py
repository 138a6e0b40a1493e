"""What the transfer tests share: a private data server (Basic authentication and a presigned signature, as a
bucket's URL) and the instance's download script run here as the instance runs it (issue #36's `--data` secrets)."""
from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import subprocess
import sys
import tarfile
import threading

PW, SIG = "pw-s3cr3t-7781", "sig5ecret91ab"  # credentials no output or file may contain


class GuardedServer:
    """An HTTP server on 127.0.0.1 serving set.tar.gz (train.txt: "private rows") only to Basic alice:PW with an
    X-Amz-Signature parameter; 403 otherwise. `.host` (127.0.0.1:PORT), `.sha` (the archive's SHA-256)."""

    def __init__(self):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as t:
            data = b"private rows\n"
            info = tarfile.TarInfo("train.txt")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        body = buf.getvalue()
        want = "Basic " + base64.b64encode(f"alice:{PW}".encode()).decode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.headers.get("Authorization") != want or "X-Amz-Signature=" not in self.path:
                    self.send_response(403)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.host, self.sha = f"127.0.0.1:{self.srv.server_address[1]}", hashlib.sha256(body).hexdigest()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


def run_fetch_script(params: dict) -> dict:
    """The instance's download script (transfer/dataplan.py), run here as the instance runs it: python3, the
    parameters' line then the script on stdin; its one JSON line."""
    from gpuops.transfer import dataplan as dp

    r = subprocess.run([sys.executable, "-c", dp.RUNNER], input=json.dumps(params) + "\n" + dp.FETCH_SCRIPT,
                       capture_output=True, text=True, timeout=60)
    return json.loads(r.stdout.strip().splitlines()[-1])
