"""deploy/kubernetes: every overlay renders, every object validates against the schemas of a current
Kubernetes release (offline, ``kubernetes-validate``), and the platform policies hold.

No cluster is needed. The renderer is ``kubectl kustomize`` (or a standalone ``kustomize``); when
neither is on PATH the tests fail with a clear message rather than skip.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from tests.support.concurrent import concurrently

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.33.0"  # a current release; kubernetes-validate ships its schemas offline
OVERLAYS = (
    ["base", *sorted(p.name for p in (KUBE / "overlays").iterdir() if p.is_dir())]
    if (KUBE / "overlays").is_dir()
    else ["base"]
)
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "Job"}
SWITCHYARD_IMAGES = {"switchyard:cpu", "switchyard:cuda"}  # the tags compose.yaml builds from the Dockerfile


def _renderer() -> list[str]:
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    pytest.fail("neither kubectl nor kustomize is on PATH: install one to render deploy/kubernetes")


def _path(name: str) -> Path:
    return KUBE / "base" if name == "base" else KUBE / "overlays" / name


_rendered: dict[str, list[dict[str, Any]]] = {}


def render(name: str) -> list[dict[str, Any]]:
    if name not in _rendered:
        out = subprocess.run([*_renderer(), str(_path(name))], capture_output=True, text=True, check=False)
        assert out.returncode == 0, f"kustomize failed for {name}: {out.stderr}"
        docs = [d for d in yaml.safe_load_all(out.stdout) if d]
        assert docs, f"{name} rendered nothing"
        _rendered[name] = docs
    return _rendered[name]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(obj)
    return [*spec.get("initContainers", []), *spec["containers"]]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_kubernetes_schemas(overlay: str) -> None:
    import kubernetes_validate as kv  # a test dependency (pyproject [test]); missing means fail, not skip

    for obj in render(overlay):
        where = f"{overlay}: {obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        try:
            kv.validate(obj, K8S_VERSION, strict=True)
        except kv.SchemaNotFoundError:
            pytest.fail(f"{where}: no schema in Kubernetes {K8S_VERSION} (a CRD kind?)")
        except kv.ValidationError as exc:
            pytest.fail(f"{where}: {exc.message} at {list(exc.path)}")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_namespace(overlay: str) -> None:
    # the gateway reaches engine-N.engine, postgres and redis by short DNS names: same namespace
    assert {o["metadata"].get("namespace") for o in render(overlay)} == {"switchyard"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_probes_resources_and_runs_as_non_root(overlay: str) -> None:
    for obj in render(overlay):
        if obj["kind"] not in WORKLOAD_KINDS:
            continue
        spec = pod_spec(obj)
        pod_sc = spec.get("securityContext", {})
        for c in containers(obj):
            where = f"{overlay}: {obj['kind']}/{obj['metadata']['name']} container {c['name']}"
            res = c.get("resources", {})
            for part in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(res.get(part, {})), f"{where}: resources.{part} needs cpu and memory"
            sc = c.get("securityContext", {})
            assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, f"{where}: runAsNonRoot"
            uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
            assert uid not in (None, 0), f"{where}: needs a numeric non-zero runAsUser"
            assert sc.get("readOnlyRootFilesystem") is True, f"{where}: readOnlyRootFilesystem"
            assert sc.get("allowPrivilegeEscalation") is False, f"{where}: allowPrivilegeEscalation"
            assert "ALL" in sc.get("capabilities", {}).get("drop", []), f"{where}: drop ALL capabilities"
            if obj["kind"] != "Job" and c in spec["containers"]:
                assert "readinessProbe" in c and "livenessProbe" in c, f"{where}: readiness and liveness probes"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_probes_drain_and_scaling(overlay: str) -> None:
    objs = render(overlay)
    gw = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "gateway")
    c = next(c for c in pod_spec(gw)["containers"] if c["name"] == "gateway")
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # The gateway drains for 10 s after SIGTERM (README "Serving in production"); the preStop sleep runs first.
    pre = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod_spec(gw)["terminationGracePeriodSeconds"] >= pre + 10 + 5 + 10  # preStop, drain, settle, SQL flush
    kinds = {
        (o["kind"], o["spec"].get("scaleTargetRef", {}).get("name"))
        for o in objs
        if o["kind"] == "HorizontalPodAutoscaler"
    }
    assert ("HorizontalPodAutoscaler", "gateway") in kinds
    pdbs = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
    assert any(
        p["spec"]["selector"]["matchLabels"].items() <= gw["spec"]["selector"]["matchLabels"].items() for p in pdbs
    )
    ann = gw["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/path"] == "/metrics"


def test_gateway_serves_the_probed_paths() -> None:
    src = (ROOT / "gateway" / "controllers" / "health.py").read_text()
    assert '@get("/healthz"' in src and '@get("/readyz"' in src
    metrics = subprocess.run(["grep", "-rn", '"/metrics"', str(ROOT / "gateway")], capture_output=True, text=True)
    assert metrics.stdout, "the gateway serves no /metrics path"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_the_ones_this_repo_builds(overlay: str) -> None:
    compose = (ROOT / "compose.yaml").read_text()
    for tag in SWITCHYARD_IMAGES:
        assert f"image: {tag}" in compose, f"compose.yaml no longer builds {tag}"
    for obj in render(overlay):
        if obj["kind"] not in WORKLOAD_KINDS:
            continue
        for c in containers(obj):
            image = c["image"]
            if image.split(":")[0].endswith("switchyard"):
                assert image.rsplit("/", 1)[-1] in SWITCHYARD_IMAGES, f"{overlay}: unknown image {image}"


CLI = "from gateway.cli import app; app()"  # the console script `switchyard` (pyproject); adjust if it moves


def _cli_help(words: list[str]) -> str:
    """`switchyard WORDS --help` from this checkout; fails on an unknown command."""
    out = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.argv = ['switchyard', *sys.argv[1:]]; {CLI}", *words, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
        timeout=120,
    )
    assert out.returncode == 0, f"`switchyard {' '.join(words)}` is not a command: {out.stdout}{out.stderr}"
    return out.stdout


_helps: dict[tuple[str, ...], str] = {}  # one run per command for all overlays


def _cli_helps(commands: list[tuple[str, ...]]) -> dict[tuple[str, ...], str]:
    """`_cli_help` of each command, the ones not asked before run side by side."""
    missing = [words for words in dict.fromkeys(commands) if words not in _helps]
    _helps.update(zip(missing, concurrently(*(partial(_cli_help, list(words)) for words in missing)), strict=True))
    return _helps


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_commands_are_switchyard_cli_commands(overlay: str) -> None:
    found: list[tuple[str, tuple[str, ...], list[str]]] = []  # container, command words, its whole command
    for obj in render(overlay):
        if obj["kind"] not in WORKLOAD_KINDS:
            continue
        for c in containers(obj):
            cmd = c.get("command", [])
            if cmd[:2] == ["sh", "-c"]:
                cmd = cmd[2].replace("exec ", "").split()
            if cmd[:1] != ["switchyard"]:
                continue
            words = []
            for w in cmd[1:]:
                if w.startswith("-"):
                    break
                words.append(w)
            found.append((c["name"], tuple(words), cmd))
    helps = _cli_helps([words for _, words, _ in found])
    for name, words, cmd in found:
        helptext = helps[words]
        for opt in (w.split("=")[0] for w in cmd if w.startswith("--")):
            assert opt in helptext, f"{overlay}: {name}: `switchyard {' '.join(words)}` has no option {opt}"


def _unknown_keys(raw: Any, typ: Any, path: str) -> list[str]:
    """Keys that the settings structs do not declare (the loader would silently ignore them)."""
    info = msgspec.inspect.type_info(typ)
    if isinstance(info, msgspec.inspect.StructType):
        if not isinstance(raw, dict):
            return []
        fields = {f.encode_name: f.type for f in info.fields}
        bad = [f"{path}.{k}".lstrip(".") for k in raw if k not in fields]
        for k, v in raw.items():
            if k in fields:
                bad += _unknown_keys_t(v, fields[k], f"{path}.{k}")
        return bad
    return _unknown_keys_t(raw, info, path)


def _unknown_keys_t(raw: Any, t: Any, path: str) -> list[str]:
    ti = msgspec.inspect
    if isinstance(t, ti.StructType):
        return _unknown_keys(raw, t.cls, path)
    if isinstance(t, (ti.ListType, ti.TupleType, ti.VarTupleType)) and isinstance(raw, list):
        item = getattr(t, "item_type", None)
        return [b for i, v in enumerate(raw) for b in _unknown_keys_t(v, item, f"{path}[{i}]")] if item else []
    if isinstance(t, ti.UnionType):
        for sub in t.types:
            if isinstance(sub, ti.StructType) and isinstance(raw, dict):
                return _unknown_keys(raw, sub.cls, path)
    return []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_configmap_config_loads_with_the_settings_loader(overlay: str, tmp_path: Path) -> None:
    from gateway.settings import Settings, load_settings  # the one gateway import (adjust if it moves)

    cms = [o for o in render(overlay) if o["kind"] == "ConfigMap" and "switchyard.yaml" in o.get("data", {})]
    assert cms, f"{overlay}: no ConfigMap carries switchyard.yaml"
    for cm in cms:
        text = cm["data"]["switchyard.yaml"]
        path = tmp_path / "switchyard.yaml"
        path.write_text(text)
        env = {v: "x" for v in re.findall(r"\$\{([A-Z0-9_]+)", text)}
        env.update(
            {
                "SWITCHYARD_DATABASE_URL": "postgresql+asyncpg://u:p@db:5432/s",
                "SWITCHYARD_REDIS_URL": "redis://r:6379/0",
            }
        )
        load_settings(path, env=env)
        assert _unknown_keys(yaml.safe_load(text), Settings, "") == [], "keys the settings loader ignores"


def test_gpu_engine_is_addressed_per_pod_for_cache_aware() -> None:
    objs = render("gpu")
    sts = next(o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "engine")
    svc = next(o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == sts["spec"]["serviceName"])
    assert svc["spec"]["clusterIP"] == "None", "per-pod DNS needs a headless Service"
    c = pod_spec(sts)["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == c["resources"]["requests"]["nvidia.com/gpu"]
    assert pod_spec(sts)["tolerations"] and pod_spec(sts)["nodeSelector"]
    probe = c["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 600, "a model load needs a long startupProbe"
    assert any(m["mountPath"] == "/models" for m in c["volumeMounts"])
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and "switchyard.yaml" in o.get("data", {}))
    group = next(g for g in yaml.safe_load(cm["data"]["switchyard.yaml"])["models"] if g["name"] == "local-llm")
    assert group["strategy"] == "cache_aware"
    name = sts["metadata"]["name"]
    want = [f"http://{name}-{i}.{svc['metadata']['name']}:8100/v1" for i in range(sts["spec"]["replicas"])]
    assert [d["api_base"] for d in group["deployments"]] == want, "one deployment per engine pod, in step with replicas"


def test_gpu_engine_has_a_disruption_budget() -> None:
    objs = render("gpu")
    sts = next(o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "engine")
    pdbs = [o for o in objs if o["kind"] == "PodDisruptionBudget"
            and o["spec"]["selector"]["matchLabels"].items() <= sts["spec"]["selector"]["matchLabels"].items()]
    assert pdbs and pdbs[0]["spec"].get("maxUnavailable") == 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_new_gateway_pods_wait_for_the_migration(overlay: str) -> None:
    """A plain `kubectl apply -k` creates the migration Job and rolls the gateway at once: each new
    gateway pod must wait (init container) until the schema is at its image's head."""
    objs = render(overlay)
    gw = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "gateway")
    job = next(o for o in objs if o["kind"] == "Job")
    inits = pod_spec(gw).get("initContainers", [])
    assert any(c["command"][:3] == ["switchyard", "db", "wait"] for c in inits)
    assert pod_spec(job)["containers"][0]["command"][:3] == ["switchyard", "db", "upgrade"]
    gw_image = pod_spec(gw)["containers"][0]["image"]
    assert all(c["image"] == gw_image for c in inits), "the init container checks the gateway image's own head"
