"""The deployment files, checked offline: the Kubernetes manifests against the pinned
Kubernetes version's schemas (strict) and against each other, the compose file's essentials,
and the per-pod routing of a call's later requests through a real server. The images are not
built here (no docker on the test machines; docs/operations.md, Deployment, has the commands)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import numpy as np
import pytest
import yaml

from agent.config import ENV_PREFIX, Settings
from pipeline.settings import PoolSettings
from tests.media_servers import tone_server
from tests.rtc_client import ArrayAudioTrack, RtcCaller

DOCKER = Path(__file__).resolve().parent.parent / "docker"
KUBERNETES_VERSION = "1.37.0"
MANIFESTS = sorted((DOCKER / "k8s").glob("*.yaml"))
UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "k": 1000, "m": 1 << 20, "g": 1 << 30}


def resources() -> list[dict[str, Any]]:
    return [doc for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def of_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in resources() if r["kind"] == kind}


def quantity(text: str | int) -> int:
    """Bytes of a Kubernetes quantity (512Mi) or a compose size (512m, where m is MiB)."""
    number, unit = re.fullmatch(r"(\d+)([A-Za-z]*)", str(text)).groups()
    return int(number) * UNITS.get(unit, 1)


def pool_bytes() -> int:
    """The shared-memory block pool by default: what /dev/shm must hold."""
    pool = PoolSettings()
    return pool.block_count * pool.block_size


def container() -> dict[str, Any]:
    return of_kind("StatefulSet")["omnivox"]["spec"]["template"]["spec"]["containers"][0]


def env(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in entries}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid_kubernetes(path: Path) -> None:
    docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert docs
    for doc in docs:  # raises on the first error, naming it
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_validation_is_strict() -> None:
    """A misspelt field must fail, or the test above proves nothing."""
    service = dict(of_kind("Service")["omnivox"])
    service["spec"] = {**service["spec"], "publishNotReady": True}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(service, KUBERNETES_VERSION, strict=True)


def test_pods_probe_drain_and_shm() -> None:
    statefulset = of_kind("StatefulSet")["omnivox"]
    pod = statefulset["spec"]["template"]["spec"]
    main = container()
    variables = env(main["env"])
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert main["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["terminationGracePeriodSeconds"] > float(variables["OMNIVOX_DRAIN_TIMEOUT_S"])
    assert main["resources"]["requests"]["cpu"] and main["resources"]["requests"]["memory"]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]
    assert shm["medium"] == "Memory" and quantity(shm["sizeLimit"]) >= pool_bytes()
    assert {"name": "dshm", "mountPath": "/dev/shm"} in main["volumeMounts"]
    # Every OMNIVOX_ variable is a declared setting (a typo would be silently ignored).
    declared = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    assert {v for v in variables if v.startswith(ENV_PREFIX)} <= declared
    assert variables["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert variables["OMNIVOX_LOCATION_PREFIX"] == "/pods/$(POD_NAME)"


def test_every_pod_has_its_service_and_path() -> None:
    statefulset = of_kind("StatefulSet")["omnivox"]
    services = of_kind("Service")
    assert services[statefulset["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"
    shared = services["omnivox"]["spec"]["selector"]
    assert shared.items() <= statefulset["spec"]["template"]["metadata"]["labels"].items()
    ingress = of_kind("Ingress")["omnivox-pods"]
    paths = {p["path"]: p["backend"]["service"]["name"]
             for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]}
    for ordinal in range(statefulset["spec"]["replicas"]):
        pod = f"omnivox-{ordinal}"
        own = services[pod]["spec"]
        assert own["selector"] == {"statefulset.kubernetes.io/pod-name": pod}
        assert own["publishNotReadyAddresses"] is True  # a draining pod keeps its calls' routes
        assert paths[f"/pods/{pod}(/|$)(.*)"] == pod
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/rewrite-target"] == "/$2"


def ingress_rewrite(path: str) -> tuple[str, str] | None:
    """Where ingress.yaml sends a request path: (Service, path the pod sees), as nginx does
    with its per-pod regex locations and rewrite-target /$2."""
    ingress = of_kind("Ingress")["omnivox-pods"]
    for rule in ingress["spec"]["rules"]:
        for entry in rule["http"]["paths"]:
            found = re.match(entry["path"], path)
            if found:
                return entry["backend"]["service"]["name"], "/" + found[2]
    return None


def test_compose_essentials() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    extras = tomllib.loads((DOCKER.parent / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    services = compose["services"]
    assert set(services) == {"omnivox", "omnivox-gpu"}
    for name, service in services.items():
        assert "8000:8000" in service["ports"], name
        assert quantity(service["shm_size"]) >= pool_bytes(), name
        assert "/healthz" in " ".join(service["healthcheck"]["test"]), name
        drain_s = float(service["environment"]["OMNIVOX_DRAIN_TIMEOUT_S"])
        assert quantity(service["stop_grace_period"].rstrip("s")) > drain_s, name
        assert service["build"]["dockerfile"] == "docker/Dockerfile"
        assert service["build"]["args"]["ENGINE"] in extras, name
        mounts = {volume.split(":")[1] for volume in service["volumes"]}
        assert {"/srv/omnivox/models", "/srv/omnivox/data"} <= mounts, name
    assert services["omnivox"]["build"]["args"]["ENGINE"] == "engine-cpu"
    assert services["omnivox-gpu"]["build"]["args"]["ENGINE"] == "engine-gpu"
    device = services["omnivox-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert "ARG ENGINE=engine-cpu" in dockerfile and 'ENGINE="$ENGINE"' in dockerfile


async def test_a_calls_later_requests_reach_its_pod(tmp_path: Path) -> None:
    """A server told it is omnivox-0 names its pod in the Location; that path, as the ingress
    rewrites it and as it is, hangs up the call and reads its record."""
    settings = Settings(data_dir=tmp_path, location_prefix="/pods/omnivox-0")
    async with tone_server(settings) as served:
        caller = RtcCaller(served.url, ArrayAudioTrack(np.zeros(4800, np.int16)))
        await caller.connect()
        location = caller.location
        assert re.fullmatch(r"/pods/omnivox-0/v1/realtime/calls/rtc_\w+", location), location
        service, rewritten = ingress_rewrite(location)
        assert (service, rewritten) == ("omnivox-0", location.removeprefix("/pods/omnivox-0"))
        call_id = location.rsplit("/", 1)[1]
        async with httpx.AsyncClient(base_url=served.url) as http:
            assert (await http.get(f"/pods/omnivox-0/v1/calls/{call_id}")).status_code == 200
            assert (await http.get(f"/v1/calls/{call_id}")).status_code == 200
            assert (await http.delete(rewritten)).status_code == 204
            assert (await http.delete(location)).status_code == 404  # already ended
            assert (await http.get("/pods/omnivox-0/readyz")).status_code == 200
        await caller.close()


async def test_a_client_secret_hangs_up_its_call_by_the_pod_path(tmp_path: Path) -> None:
    """The secret that placed a call may end it: the server binds it to the call named in
    the (prefixed) Location, whichever path the DELETE comes by."""
    key = "k" * 24
    settings = Settings(data_dir=tmp_path, location_prefix="/pods/omnivox-0", api_keys=key)
    async with tone_server(settings) as served, httpx.AsyncClient(base_url=served.url) as http:
        for path in ("/pods/omnivox-0/v1/realtime/calls/{}", "/v1/realtime/calls/{}"):
            minted = await http.post("/v1/realtime/client_secrets",
                                     headers={"Authorization": f"Bearer {key}"})
            secret = minted.json()["value"]
            caller = RtcCaller(served.url, ArrayAudioTrack(np.zeros(4800, np.int16)))
            await caller.pc.setLocalDescription(await offer_of(caller))
            placed = await http.post(
                "/pods/omnivox-0/v1/realtime/calls", content=caller.pc.localDescription.sdp,
                headers={"Content-Type": "application/sdp",
                         "Authorization": f"Bearer {secret}"})
            assert placed.status_code == 201, placed.text
            call_id = placed.headers["location"].rsplit("/", 1)[1]
            bearer = {"Authorization": f"Bearer {secret}"}
            assert (await http.delete(path.format(call_id), headers=bearer)).status_code == 204
            # Without a key or secret, the prefixed path is no way around authentication.
            refused = await http.get(f"/pods/omnivox-0/v1/calls/{call_id}")
            assert refused.status_code == 401
            await caller.close()


async def offer_of(caller: RtcCaller) -> Any:
    caller.pc.addTransceiver(caller.audio, direction="sendrecv")
    return await caller.pc.createOffer()
