# SPDX-License-Identifier: Apache-2.0
"""A small HTTPS server that answers GET /api/v1/pods as the Kubernetes API server does (no cluster runs in CI)."""

from __future__ import annotations

import http.server
import json
import ssl
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from tests.exporters.receivers import self_signed_certificate

NODE = "gpu-node-7"
TOKEN = "sa-token-123"
POD_UID = "0b7a2c1d-1111-4222-8333-944455556666"
CONTAINER_ID = "ab" * 32


def make_pod(uid: str, name: str, node: str, containers: dict[str, str]) -> dict[str, object]:
    return {"metadata": {"uid": uid, "name": name, "namespace": "ml"}, "spec": {"nodeName": node},
            "status": {"containerStatuses": [{"name": n, "containerID": f"containerd://{c}"}
                                             for n, c in containers.items()],
                       "initContainerStatuses": [{"name": "setup", "containerID": "cri-o://" + "cd" * 32}]}}


PODS = [make_pod(POD_UID, "trainer-0", NODE, {"trainer": CONTAINER_ID, "sidecar": "ef" * 32}),
        make_pod("11111111-2222-3333-4444-555555555555", "web-1", "other-node", {"web": "01" * 32})]


@dataclass
class FakeAPIServer:
    """HTTPS on 127.0.0.1 answering GET /api/v1/pods like the API server (the field selector applied); ``status`` is
    what it answers next (200 or an error code); while ``hold`` is clear, requests wait for it (an API that hangs)."""

    folder: Path
    status: int = 200
    hold: threading.Event = field(default_factory=threading.Event)
    requests: list[tuple[str, str]] = field(default_factory=list)  # (path with query, Authorization header)
    held: threading.Event = field(default_factory=threading.Event)  # set while a request waits on ``hold``

    def __post_init__(self) -> None:
        self.hold.set()
        cert, key = self_signed_certificate(self.folder)
        self.ca = cert
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                api.requests.append((self.path, self.headers.get("Authorization", "")))
                if not api.hold.is_set():
                    api.held.set()
                    api.hold.wait(30)
                url = urllib.parse.urlparse(self.path)
                if api.status != 200 or url.path != "/api/v1/pods":
                    code = api.status if api.status != 200 else 404
                    self.send_response(code)
                    self.end_headers()
                    self.wfile.write(json.dumps({"kind": "Status", "code": code}).encode())
                    return
                selector = urllib.parse.parse_qs(url.query).get("fieldSelector", [""])[0]
                node = selector.removeprefix("spec.nodeName=") if selector.startswith("spec.nodeName=") else None
                items = [p for p in PODS if node is None or p["spec"]["nodeName"] == node]  # type: ignore[index]
                body = json.dumps({"kind": "PodList", "items": items}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.server.daemon_threads = True
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.hold.set()
        self.server.shutdown()
        self.server.server_close()

    def service_account(self, folder: Path) -> Path:
        """A service-account folder as the kubelet mounts it (token and ca.crt) for this server, under ``folder``."""
        folder.mkdir()
        (folder / "token").write_text(TOKEN + "\n")
        (folder / "ca.crt").write_bytes(self.ca.read_bytes())
        return folder
