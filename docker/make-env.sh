#!/usr/bin/env bash
# Fills the secrets of a compose .env with random values:  docker/make-env.sh [FILE]   (default: .env)
# FILE is created from .env.example when missing. Every uncommented `NAME=` line with an empty value gets a fresh
# random value (AIRFLOW_FERNET_KEY a Fernet key: urlsafe base64 of 32 bytes); values already set are never
# changed, so it is safe to re-run. AIRFLOW_UID is set to your uid when it still has the example's 50000.
# The file is made readable by you only. Needs bash, head, base64 and tr (no Python).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
file=${1:-.env}
if [[ ! -e "$file" ]]; then
    cp "$here/.env.example" "$file"
    echo "make-env: created $file from .env.example"
fi

rand() {  # urlsafe base64 of $1 random bytes; padded for a Fernet key, unpadded otherwise
    local out
    out=$(head -c "$1" /dev/urandom | base64 | tr -d '\n' | tr '+/' '-_')
    if [[ "${2:-}" == padded ]]; then printf '%s' "$out"; else printf '%s' "${out//=/}"; fi
}

tmp=$(mktemp "${file}.XXXXXX")
trap 'rm -f "$tmp"' EXIT
filled=()
while IFS= read -r line || [[ -n "$line" ]]; do
    if [[ "$line" =~ ^([A-Z][A-Z0-9_]*)=$ ]]; then
        name=${BASH_REMATCH[1]}
        if [[ "$name" == AIRFLOW_FERNET_KEY ]]; then
            line="$name=$(rand 32 padded)"
        else
            line="$name=$(rand 32)"
        fi
        filled+=("$name")
    elif [[ "$line" == "AIRFLOW_UID=50000" && "$(id -u)" != 0 ]]; then
        line="AIRFLOW_UID=$(id -u)"
    fi
    printf '%s\n' "$line" >> "$tmp"
done < "$file"
chmod 600 "$tmp"
mv "$tmp" "$file"
trap - EXIT
echo "make-env: $file: filled ${#filled[@]} secret(s)${filled[*]:+: ${filled[*]}}"
