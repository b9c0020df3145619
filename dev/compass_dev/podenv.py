"""What a pod's container runs with on the node helper (compass_dev.devnode): argv and environment.

Images do not exist here: a container's program is its `command` as written, or what a LocalImage
says about its image (ENTRYPOINT, CMD, programs to substitute, ENV). The environment is the
node's, the image's, then the container's `env` and `envFrom` (ConfigMaps, Secrets, the downward
API's fieldRef), with Kubernetes' $(VAR) expansion.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from compass_dev.podnetwork import HOST_IP

Pod = dict[str, Any]  # a Pod as the API returns it (JSON), not the client's models
Container = dict[str, Any]


class ContainerConfigError(Exception):
    """The container cannot be run here (no command, an env source missing); fails the pod."""


@dataclass(frozen=True)
class LocalImage:
    """How the node runs containers of one image, which does not exist on this machine."""

    entrypoint: Sequence[str] = ()  # the image's ENTRYPOINT: used when a container has no command
    cmd: Sequence[str] = ()  # the image's CMD: used when a container has neither command nor args
    executables: Mapping[str, str] = field(default_factory=dict)  # argv[0] -> local program
    env: Mapping[str, str] = field(default_factory=dict)  # the image's ENV


def image_keys(image: str) -> list[str]:
    """Names an image reference may be registered under, most specific first."""
    keys = [image]
    name = image.split("@", 1)[0]
    keys.append(name)
    if ":" in name.rsplit("/", 1)[-1]:  # a tag, not a registry's port
        name = name.rsplit(":", 1)[0]
        keys.append(name)
    keys.append(name.rsplit("/", 1)[-1])
    return list(dict.fromkeys(keys))


def local_image(images: Mapping[str, LocalImage], container: Container) -> LocalImage:
    """The LocalImage registered for a container's image (an empty one when none is)."""
    for key in image_keys(container.get("image", "")):
        if key in images:
            return images[key]
    return LocalImage()


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command, args and env values; $$ escapes."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", replace, value)


def container_argv(
    container: Container, image: LocalImage, env: Mapping[str, str], node_name: str
) -> list[str]:
    """The command line: command and args, or the image's, expanded, argv[0] substituted."""
    command, args = container.get("command"), container.get("args")
    if command:
        argv = [*command, *(args or [])]
    elif args is not None:
        argv = [*image.entrypoint, *args]
    else:
        argv = [*image.entrypoint, *image.cmd]
    if not argv:
        raise ContainerConfigError(
            f"container {container['name']!r}: no command, and node {node_name} knows no "
            f"entrypoint for image {container.get('image')!r} (give it a LocalImage)"
        )
    argv = [expand(a, env) for a in argv]
    argv[0] = image.executables.get(argv[0], argv[0])
    return argv


def container_environment(
    core: Any,
    pod: Pod,
    container: Container,
    *,
    image: LocalImage,
    node_env: Mapping[str, str],
    inherit_env: bool,
    node_name: str,
    pod_ip: str,
) -> dict[str, str]:
    """Base environment, node env, image env, then the container's env (last wins).

    core is the CoreV1Api that reads the ConfigMaps and Secrets the container refers to.
    """
    env = dict(os.environ) if inherit_env else {"PATH": os.environ.get("PATH", "")}
    env.update(node_env)
    env.update(image.env)
    env["HOSTNAME"] = pod["metadata"]["name"]
    namespace = pod["metadata"]["namespace"]
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        if "configMapRef" in source:
            data = _read(core, "config_map", namespace, source["configMapRef"])
        elif "secretRef" in source:
            data = _read(core, "secret", namespace, source["secretRef"])
        else:
            raise ContainerConfigError(f"unsupported envFrom source {source}")
        env.update({prefix + k: v for k, v in data.items()})
    for variable in container.get("env") or []:
        name = variable["name"]
        if "valueFrom" not in variable:
            env[name] = expand(variable.get("value", ""), env)
            continue
        value_from = variable["valueFrom"]
        if "fieldRef" in value_from:
            env[name] = _field(pod, value_from["fieldRef"]["fieldPath"], node_name, pod_ip)
        elif "configMapKeyRef" in value_from or "secretKeyRef" in value_from:
            kind = "config_map" if "configMapKeyRef" in value_from else "secret"
            ref = value_from.get("configMapKeyRef") or value_from["secretKeyRef"]
            data = _read(core, kind, namespace, ref)
            if ref["key"] in data:
                env[name] = data[ref["key"]]
            elif not ref.get("optional"):
                raise ContainerConfigError(f"env {name}: key {ref['key']!r} not in {ref}")
        else:
            raise ContainerConfigError(f"env {name}: unsupported valueFrom {value_from}")
    return env


def _read(core: Any, kind: str, namespace: str, ref: Mapping[str, Any]) -> dict[str, str]:
    """The data of a ConfigMap or Secret (decoded), {} when optional and absent."""
    read = getattr(core, f"read_namespaced_{kind}")
    try:
        obj = json.loads(read(ref["name"], namespace, _preload_content=False).data)
    except ApiException as error:
        if error.status == 404 and ref.get("optional"):
            return {}
        raise ContainerConfigError(f"{kind} {namespace}/{ref['name']}: {error.reason}") from None
    data: dict[str, str] = dict(obj.get("data") or {})
    if kind == "secret":
        data = {k: base64.b64decode(v).decode() for k, v in data.items()}
    return data


def _field(pod: Pod, path: str, node_name: str, pod_ip: str) -> str:
    """The downward API's fieldRef: what the pod's metadata, spec or status says."""
    meta = pod["metadata"]
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": node_name,
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,  # one address: the list is that address
        "status.hostIP": HOST_IP,
    }
    if path in simple:
        return str(simple[path])
    match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise ContainerConfigError(f"unsupported fieldRef {path}")
