#!/usr/bin/env bash
# The Celery end-to-end test (tests/dags/test_celery_e2e.py) runs Debian's Redis server as the Celery broker on a
# free port of 127.0.0.1. Installs it when missing (needs root, as on CI and the dev machines); otherwise says what
# to install. The server is only installed here, never started as a system service by this script.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing Debian redis-server for the Celery end-to-end test"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
else
    echo "[setup] redis-server not found: install Debian's 'redis-server' package to run the Celery test" >&2
    exit 1
fi
