#!/usr/bin/env bash
# Stops `make setup` early, naming what to install, when a toolchain the setup builds with is missing.
set -u
missing=0
need() { # need <command> <minimum major.minor or ""> <how to install>
  local cmd=$1 min=$2 how=$3 have
  if ! command -v "$cmd" >/dev/null 2>&1; then
    echo "setup: '$cmd' is not installed. Install it: $how" >&2; missing=1; return
  fi
  [ -z "$min" ] && return
  case $cmd in
    go) have=$(go env GOVERSION | sed 's/^go//') ;;
    node) have=$(node --version | sed 's/^v//') ;;
    python3) have=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])') ;;
  esac
  if [ "$(printf '%s\n%s\n' "$min" "$have" | sort -V | head -1)" != "$min" ]; then
    echo "setup: '$cmd' $have is too old, $min or newer is needed. Install it: $how" >&2; missing=1
  fi
}
need go 1.25 "https://go.dev/doc/install (or: apt-get install golang-go, if new enough)"
need node 20.19 "Node.js 20.19 or newer (https://nodejs.org, or apt-get install nodejs npm if new enough)"
need npm "" "apt-get install npm"
need python3 3.10 "apt-get install python3 python3-venv"
need curl "" "apt-get install curl"
if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  echo "setup: python3 cannot create virtual environments. Install it: apt-get install python3-venv" >&2; missing=1
fi
exit $missing
