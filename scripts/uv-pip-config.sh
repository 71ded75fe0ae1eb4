# Sourced by scripts/setup.sh and scripts/check-gpu-constraints.sh. uv reads no pip configuration, so what pip's
# configuration points at is handed to it: `uv_pip_config PYTHON` (PYTHON: the interpreter whose pip to ask) sets the
# array `links` to `--find-links DIR` for each find-links directory that exists ($PIP_FIND_LINKS, then pip's
# global.find-links: where a machine keeps local wheels, such as the CPU build of torch), and exports SSL_CERT_FILE
# from $SSL_CERT_FILE, else $PIP_CERT, else pip's global.cert, when one is set.
uv_pip_config() {
    local py=$1 d cert
    links=()
    for d in ${PIP_FIND_LINKS:-} $("$py" -m pip config get global.find-links 2>/dev/null || true); do
        [ -e "$d" ] && links+=(--find-links "$d")
    done
    cert=${SSL_CERT_FILE:-${PIP_CERT:-$("$py" -m pip config get global.cert 2>/dev/null || true)}}
    if [ -n "$cert" ]; then export SSL_CERT_FILE="$cert"; fi
}
