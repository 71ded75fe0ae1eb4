#!/usr/bin/env bash
# The report test renders the HTML report in Debian's headless Chromium. Installs it when missing
# (needs root, as on CI and the dev machines); otherwise says what to install.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing Debian chromium for the report's browser test"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
    echo "[setup] chromium not found: install Debian's 'chromium' package to run the browser test" >&2
    exit 1
fi
