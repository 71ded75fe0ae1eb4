#!/usr/bin/env bash
# airflow-init of docker-compose.yml: runs once (as root) before the Airflow services start, on every `up`.
#   1. resource check (warnings, as in Airflow's own compose file)
#   2. the volumes (logs, state, auth, MLflow artifacts) exist and belong to $AIRFLOW_UID:0
#   3. the simple auth manager's passwords file, written from $AIRFLOW_ADMIN_USERNAME/$AIRFLOW_ADMIN_PASSWORD
#      into the auth volume (mode 600): no password is ever in a file of the repo or a layer of the image
#   4. `airflow db migrate`, and the pool $ABPO_UPDATE_POOL when it is not default_pool
set -euo pipefail

log() { printf '[airflow-init] %s\n' "$*"; }
warn() { printf '\033[1;33m[airflow-init] WARNING: %s\033[0m\n' "$*"; }

uid=${AIRFLOW_UID:-}
if [[ -z "$uid" ]]; then
    warn "AIRFLOW_UID is not set: using 50000 (set it in .env, e.g. AIRFLOW_UID=\$(id -u), see .env.example)"
    uid=50000
fi
[[ "$uid" =~ ^[0-9]+$ ]] || { echo "AIRFLOW_UID must be a number, got '$uid'" >&2; exit 1; }

# 1. resources: the LLM update needs more than Airflow itself; these are the floor of Airflow's own compose file
mem_mib=$(( $(getconf _PHYS_PAGES) * $(getconf PAGE_SIZE) / 1048576 ))
cpus=$(getconf _NPROCESSORS_ONLN)
disk_kib=$(df -Pk / | awk 'NR == 2 {print $4}')
low=false
(( mem_mib >= 4000 )) || { warn "at least 4 GB of memory recommended, Docker has ${mem_mib} MiB"; low=true; }
(( cpus >= 2 )) || { warn "at least 2 CPUs recommended, Docker has ${cpus}"; low=true; }
(( disk_kib >= 10 * 1048576 )) || { warn "at least 10 GB of free disk recommended, $(( disk_kib / 1048576 )) GB free"; low=true; }
[[ $low == false ]] || warn "not enough resources for the stack (see above); it may be slow or fail"
log "resources: ${mem_mib} MiB memory, ${cpus} CPUs, $(( disk_kib / 1048576 )) GB free disk"

# 2. volumes: created and owned by the Airflow user; only what is not already theirs is changed (the state volume
#    holds the warehouse and checkpoints)
logs=${AIRFLOW__LOGGING__BASE_LOG_FOLDER:-/opt/airflow/logs}
state=${ABPO_STATE:-/var/abpo}
passwords_file=${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:-/opt/airflow/auth/passwords.json}
artifacts=${MLFLOW_ARTIFACTS_DIR:-/mlflow/artifacts}
volumes=("$logs" "$(dirname "$passwords_file")" "$state")
if [[ -d "$artifacts" ]]; then volumes+=("$artifacts"); fi
own() {
    mkdir -p "$@"
    find "$@" \( \! -user "$uid" -o \! -group 0 \) -exec chown "$uid:0" {} +
    chmod g+rwX "$@"
}
own "${volumes[@]}"
log "volumes owned by ${uid}:0: ${volumes[*]}"

# 3. the passwords file of the simple auth manager ([core] simple_auth_manager_passwords_file), from the environment
: "${AIRFLOW_ADMIN_PASSWORD:?AIRFLOW_ADMIN_PASSWORD is not set (see .env.example)}"
PASSWORDS_FILE=$passwords_file python - <<'PY'
import json
import os
import tempfile

path = os.environ["PASSWORDS_FILE"]
user = os.environ.get("AIRFLOW_ADMIN_USERNAME") or "admin"
try:
    with open(path) as f:
        passwords = json.load(f)  # keeps the passwords the API server generated for other users
except (FileNotFoundError, ValueError):
    passwords = {}
passwords[user] = os.environ["AIRFLOW_ADMIN_PASSWORD"]
fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".passwords.")
with os.fdopen(fd, "w") as f:
    json.dump(passwords, f)
    f.write("\n")
os.replace(tmp, path)
print(f"[airflow-init] passwords file {path}: {sorted(passwords)}")
PY
chown "$uid:0" "$passwords_file"
chmod 600 "$passwords_file"

# 4. the metadata database and the update pool (the image's /entrypoint waits for the database first)
airflow_cmd=(airflow)
if [[ -x /entrypoint ]]; then airflow_cmd=(/entrypoint airflow); fi
"${airflow_cmd[@]}" version
"${airflow_cmd[@]}" db migrate
pool=${ABPO_UPDATE_POOL:-default_pool}
if [[ "$pool" != default_pool ]]; then
    "${airflow_cmd[@]}" pools set "$pool" "${ABPO_UPDATE_POOL_SLOTS:-1}" "abpo update tasks (GPU slots)"
fi
# what the commands above wrote as root (logs) goes back to the Airflow user
own "$logs"
log "done"
