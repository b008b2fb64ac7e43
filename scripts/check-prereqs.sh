#!/usr/bin/env bash
# Stops `make setup` early, naming what to install, when a toolchain the setup builds with is missing.
# The versions here are the README's "Prerequisites" and CI's (.ci/run runs make setup, so this).
set -u
missing=0

# Python first: every Python step needs 3.11 (pandas 3 and pyproject.toml's requires-python).
if ! command -v python3 >/dev/null 2>&1; then
  echo "setup: 'python3' is not installed. Install Python 3.11 or newer with venv: apt-get install python3 python3-venv" >&2
  exit 1
fi
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: python3 is $(python3 -c 'import platform; print(platform.python_version())'), and complyroute needs Python 3.11 or newer" \
       "(pandas 3, which the experiments' reports use, supports no older Python). Install Python 3.11+ as python3" \
       "(apt-get install python3 python3-venv on Debian 12 or Ubuntu 24.04 and newer; otherwise pyenv or your distribution's python3.11)." >&2
  exit 1
fi

need() { # need <command> <minimum major.minor or ""> <how to install>
  local cmd=$1 min=$2 how=$3 have
  if ! command -v "$cmd" >/dev/null 2>&1; then
    echo "setup: '$cmd' is not installed. Install it: $how" >&2; missing=1; return
  fi
  [ -z "$min" ] && return
  case $cmd in
    go) have=$(go env GOVERSION | sed 's/^go//') ;;
    npm) have=$(npm --version 2>/dev/null) ;;
  esac
  if [ "$(printf '%s\n%s\n' "$min" "$have" | sort -V | head -1)" != "$min" ]; then
    echo "setup: '$cmd' $have is too old, $min or newer is needed. Install it: $how" >&2; missing=1
  fi
}
need go 1.26 "https://go.dev/doc/install (or: apt-get install golang-go, if new enough)"
# Node.js itself (24, the LTS line) comes from the npm registry into tools/node (make setup);
# any npm that reads lockfile version 3, on any Node.js, fetches it.
need npm 7.0 "apt-get install nodejs npm"
need curl "" "apt-get install curl"
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  echo "setup: python3 cannot create virtual environments. Install it: apt-get install python3-venv" >&2; missing=1
fi

# Not a stop: everything installs and the unit tests run elsewhere, but a local deployment does not.
if [ "$(uname -s)" != Linux ]; then
  echo "setup: note: this is $(uname -s), not Linux. Setup and the unit tests work, but local deployments" \
       "(make deploy, make demo, make test's end-to-end tests, make experiment, make bench) need Linux:" \
       "the control plane binds each node's parts to its own loopback address 127.0.1.x, which only Linux routes" \
       "without configuration, and measures their memory as PSS, which only Linux reports. Deploy to Kubernetes" \
       "(make deploy target=k8s) or use a Linux machine or VM." >&2
fi
exit $missing
