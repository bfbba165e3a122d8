# SPDX-License-Identifier: Apache-2.0
"""Pod, namespace and container names of this node's pods, from the Kubernetes API server (``--k8s-names``).

Off by default: where a Collector runs, its k8sattributes processor does this. When on, a background thread lists
the pods of this node only (``GET /api/v1/pods?fieldSelector=spec.nodeName=<node>``) every ``ttl_s`` with the pod's
service-account token (read again for each list: projected tokens rotate) over TLS checked against the service
account's ``ca.crt``. :meth:`K8sNames.lookup` only reads the last list, so a drain never waits on the API. A pod uid
the last list lacks (a pod newer than it), or a container id it lacks in a pod it has (a restarted container, the main
container after the init ones; once per container), asks for an early list, at most every :data:`MIN_RELIST_S`.

Names from a list older than ``3 * ttl_s`` are dropped rather than kept stale. A failing API gives one log line per
outage (saying why), one when it answers again, and ``otel_gpu.source.errors{otel_gpu.source=k8s}`` per failed list.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_gpu import selfmetrics, semconv

_logger = logging.getLogger(__name__)

SOURCE = semconv.Source.K8S
MIN_RELIST_S = 5.0  # an unknown pod uid or container id lists again at most this often
MAX_LIST_BYTES = 64 << 20  # a node's pods (110 by default, a few KiB each) are far below this
STALE_AFTER_TTLS = 3
MAX_EARLY_LISTED = 4096  # container ids remembered as having asked for their early list


@dataclass(frozen=True, slots=True)
class PodNames:
    """What the API server names a process's pod and container ("" where it does not say)."""

    pod_name: str
    namespace_name: str
    container_name: str = ""


@dataclass(frozen=True, slots=True)
class _Listing:
    pods: dict[str, tuple[str, str]]  # pod uid -> (name, namespace)
    containers: dict[str, str]  # container id (hex, no runtime prefix) -> container name
    monotonic_s: float


def parse_pod_list(document: Any) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """(pod uid -> (name, namespace), container id -> container name) of a ``PodList``; entries that are not what
    the API documents are skipped."""
    pods: dict[str, tuple[str, str]] = {}
    containers: dict[str, str] = {}
    items = document.get("items") if isinstance(document, dict) else None
    for item in items if isinstance(items, list) else ():
        metadata = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(metadata, dict) or not isinstance(metadata.get("uid"), str):
            continue
        pods[metadata["uid"]] = (str(metadata.get("name") or ""), str(metadata.get("namespace") or ""))
        status = item.get("status") or {}
        for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
            statuses = status.get(key) if isinstance(status, dict) else None
            for entry in statuses if isinstance(statuses, list) else ():
                if isinstance(entry, dict) and isinstance(entry.get("containerID"), str):
                    container_id = entry["containerID"].rpartition("://")[2]  # containerd://, cri-o://, docker://
                    if container_id:
                        containers[container_id] = str(entry.get("name") or "")
    return pods, containers


class K8sNames:
    """The names of this node's pods, refreshed in the background; :meth:`lookup` never blocks on the API."""

    def __init__(self, api_url: str, node_name: str, service_account_dir: str, *, ttl_s: float = 60.0,
                 timeout_s: float = 5.0) -> None:
        self._url = api_url.rstrip("/") + "/api/v1/pods?" + urllib.parse.urlencode(
            {"fieldSelector": f"spec.nodeName={node_name}"})
        self._account = Path(service_account_dir)
        self.ttl_s = ttl_s
        self._timeout_s = timeout_s
        self._listing: _Listing | None = None
        self._last_attempt_s = float("-inf")
        self._early_listed: dict[str, None] = {}  # container ids that asked for an early list (oldest first)
        self._early_lock = threading.Lock()
        self._failing = False
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._first_done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, wait_first_s: float = 0.0) -> None:
        """List at once and then every ``ttl_s`` on a daemon thread; wait up to ``wait_first_s`` for the first list
        (the agent does, before its sources start, so that their first reports carry the names)."""
        self._thread = threading.Thread(target=self._run, name="otel-gpu-k8s-names", daemon=True)
        self._thread.start()
        self._first_done.wait(wait_first_s)

    @property
    def timeout_s(self) -> float:
        """How long one list may take."""
        return self._timeout_s

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)  # a daemon thread: a list stuck in the API never holds up the exit

    def lookup(self, pod_uid: str, container_id: str = "") -> PodNames | None:
        """The names of ``pod_uid`` (and of ``container_id`` in it) from the last list, or None when the pod is unknown;
        a container the list lacks has the name "" until a later list has it."""
        if not pod_uid:
            return None
        listing = self._listing  # one reference read: the refresh thread swaps whole listings
        if listing is not None and time.monotonic() - listing.monotonic_s > STALE_AFTER_TTLS * self.ttl_s:
            listing = None
        pod = listing.pods.get(pod_uid) if listing is not None else None
        container_name = listing.containers.get(container_id) if listing is not None and container_id else None
        # newer than the list: list again, early; a container once only (a pod's sandbox, which no list names, must
        # not keep the API listed every few seconds: later lists, each ttl_s, still name the others)
        unknown_container = bool(container_id) and container_name is None and container_id not in self._early_listed
        if (pod is None or unknown_container) and time.monotonic() - self._last_attempt_s >= MIN_RELIST_S:
            self._wake.set()
            if pod is not None:
                with self._early_lock:  # lookups come from several sources' threads
                    if len(self._early_listed) >= MAX_EARLY_LISTED:
                        self._early_listed.pop(next(iter(self._early_listed)))
                    self._early_listed[container_id] = None
        if pod is None:
            return None
        return PodNames(pod[0], pod[1], container_name or "")

    def refresh(self) -> bool:
        """One list of this node's pods, on the calling thread; False (counted and logged once) when it failed."""
        self._last_attempt_s = time.monotonic()
        try:
            document = self._list()
        except _ListError as exc:
            selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=SOURCE, otel_gpu__reason=exc.reason)
            if not self._failing:
                _logger.warning("k8s names: listing this node's pods failed (%s); pod, namespace and container names "
                                "are left out until it answers", exc)
            self._failing = True
            return False
        pods, containers = parse_pod_list(document)
        self._listing = _Listing(pods, containers, time.monotonic())
        if self._failing:
            _logger.info("k8s names: the API server answers again (%d pods on this node)", len(pods))
        self._failing = False
        return True

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.clear()
            try:
                self.refresh()
            except Exception:  # loop boundary: the lookup stays on what it had, the thread goes on
                _logger.exception("k8s names: listing this node's pods failed unexpectedly")
                selfmetrics.count(semconv.SELF_ERRORS.name, otel_gpu__source=SOURCE,
                                  otel_gpu__reason=semconv.Reason.K8S_API_ERROR)
            finally:
                self._first_done.set()
            self._wake.wait(self.ttl_s)
            if not self._stopped.is_set():
                self._stopped.wait(max(0.0, MIN_RELIST_S - (time.monotonic() - self._last_attempt_s)))

    def _list(self) -> Any:
        import ssl  # only where the API is listed: ssl maps libcrypto and libssl (~4 MB resident) into the agent
        import urllib.error
        import urllib.request

        try:
            token = (self._account / "token").read_text().strip()
        except OSError as exc:
            raise _ListError(semconv.Reason.K8S_NO_TOKEN, f"no service-account token: {exc}") from None
        context = ssl.create_default_context()
        ca = self._account / "ca.crt"
        if ca.is_file():
            context.load_verify_locations(cafile=str(ca))
        request = urllib.request.Request(self._url, headers={"Authorization": f"Bearer {token}",
                                                             "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s, context=context) as response:  # noqa: S310
                body = response.read(MAX_LIST_BYTES + 1)
        except urllib.error.HTTPError as exc:
            reason = (semconv.Reason.K8S_UNAUTHORIZED if exc.code in (401, 403) else semconv.Reason.K8S_API_ERROR)
            hint = " (the service account needs RBAC to list pods: helm value k8sNames.enabled)" \
                if exc.code == 403 else ""
            raise _ListError(reason, f"HTTP {exc.code} from {self._url}{hint}") from None
        except TimeoutError:
            raise _ListError(semconv.Reason.K8S_TIMEOUT, f"no answer from {self._url} in {self._timeout_s:g} s") \
                from None
        except (urllib.error.URLError, OSError) as exc:
            why = getattr(exc, "reason", exc)
            if isinstance(why, TimeoutError):
                raise _ListError(semconv.Reason.K8S_TIMEOUT,
                                 f"no answer from {self._url} in {self._timeout_s:g} s") from None
            raise _ListError(semconv.Reason.K8S_UNREACHABLE, f"{self._url} unreachable: {why}") from None
        if len(body) > MAX_LIST_BYTES:
            raise _ListError(semconv.Reason.K8S_API_ERROR, f"the pod list is larger than {MAX_LIST_BYTES} bytes")
        try:
            return json.loads(body)
        except ValueError as exc:
            raise _ListError(semconv.Reason.K8S_API_ERROR, f"the answer is not JSON ({exc})") from None


class _ListError(Exception):
    def __init__(self, reason: semconv.Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
