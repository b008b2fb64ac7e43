"""Check rendered Kubernetes objects offline against the strict JSON schemas of the pinned
control plane's Kubernetes version (the kubernetes-validate package in its strict mode)."""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

from complyroute.files import YAML_LOADER

# The Kubernetes version whose schemas the rendered objects are checked against: the pinned control
# plane's (tools/kubernetes/go.mod, v1.34.4) minor version, which the pinned kubernetes-validate
# package ships strict schemas for (v1.34.0-local-strict).
KUBERNETES_VERSION = "1.34.0"


def validate(yaml_file: Path, version: str = KUBERNETES_VERSION) -> list[str]:
    """Check every object in `yaml_file` offline against the strict JSON schemas of Kubernetes
    `version`, by the pinned kubernetes-validate package in its strict mode: a field the schema
    does not know, a value of the wrong type and a kind it has no schema for are errors. Returns
    one line per invalid object (its first error); [] when every object is valid. A minor
    version whose schemas the package does not ship raises (the package would otherwise check
    against an older one)."""
    import kubernetes_validate  # installed by `make setup` (requirements.lock)
    from kubernetes_validate import utils

    # The package reads and parses a schema and the 1.5 MB of shared definitions for every object
    # it checks (0.02 s each); read once, a 50-service render's 315 objects take 3 s here, not 16.
    if not hasattr(utils.schema_contents, "cache_info"):
        utils.schema_contents = functools.lru_cache(maxsize=None)(utils.schema_contents)
        utils.all_versions = functools.lru_cache(maxsize=None)(utils.all_versions)
    if utils.major_minor(version) not in {utils.major_minor(v) for v in utils.all_versions()}:
        raise utils.VersionNotSupportedError(version=version)
    errors = []
    for document in yaml.load_all(yaml_file.read_text(), Loader=YAML_LOADER):
        if not document:
            continue
        where = f"{document.get('kind')}/{(document.get('metadata') or {}).get('name')}"
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            errors.append(f"{where}: {'.'.join(map(str, error.path)) or '(the object)'}: {error.message}")
        except kubernetes_validate.SchemaNotFoundError as error:
            errors.append(f"{where}: {error.message}")
    return errors
