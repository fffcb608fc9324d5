#!/usr/bin/env bash
# Build the API and worker images and run them: Redis, the API and a CPU worker in one podman
# pod; a zoo model registered and a job submitted over HTTP; its results read back from the API.
#
#   sudo bash deploy/check.sh            # from anywhere; needs podman, runc and mmdebstrap
#   KEEP_IMAGES=0 bash deploy/check.sh   # also remove the images it built (the base is kept)
#
# No registry is needed: the base image is made from Debian's packages with mmdebstrap and
# imported (`podman import`), and torch's CPU wheel comes from where this machine's pip finds it
# (copied into the build context as deploy/wheels/torch-*.whl). Everything else pip fetches
# from the package index during the build. Idempotent: an existing base image is reused (set
# REBUILD_BASE=1 to make it again) and every container, pod and volume of an earlier run is
# removed first; all are removed again on exit, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

PREFIX=strata-check
BASE_IMAGE=localhost/strata-base:bookworm
API_IMAGE=localhost/strata-api:check
WORKER_IMAGE=localhost/strata-worker:check
TORCH_VERSION=$(sed -n 's/^ *"torch==\([^"]*\)".*/\1/p' pyproject.toml | head -1)
PORT=${CHECK_PORT:-18000}
KEY=check-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3

# runc, and limits within this machine's hard limits (podman's defaults can exceed them, which
# runc refuses: "error setting rlimits"). Set here, not in the images.
hard_nofile=$(ulimit -Hn); hard_nproc=$(ulimit -Hu)
nofile=65536; [ "$hard_nofile" != unlimited ] && [ "$hard_nofile" -lt "$nofile" ] && nofile=$hard_nofile
nproc=16384; [ "$hard_nproc" != unlimited ] && [ "$hard_nproc" -lt "$nproc" ] && nproc=$hard_nproc
RUN_OPTS=(--runtime runc --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
BUILD_OPTS=(--runtime runc --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc"
            --network host --layers --format docker)

say() { printf '[check %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
CTX=$(mktemp -d /tmp/strata-check-ctx.XXXXXX)
# The same for what podman starts by itself (a pod's infra container): its own config file,
# for this script's podman calls only.
cat > "$CTX/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF=$CTX/containers.conf

cleanup() {
  local code=$?
  if [ "$code" != 0 ]; then
    for c in api worker redis migrate; do
      podman logs --tail 60 "$PREFIX-$c" 2>/dev/null | sed "s/^/[$c] /" >&2 || true
    done
  fi
  podman pod rm -f -t 5 "$PREFIX" >/dev/null 2>&1 || true
  podman rm -f -v "$PREFIX-migrate" >/dev/null 2>&1 || true
  podman volume rm -f "$PREFIX-data" "$PREFIX-cache" >/dev/null 2>&1 || true
  if [ "${KEEP_IMAGES:-1}" = 0 ]; then
    podman rmi -f "$API_IMAGE" "$WORKER_IMAGE" >/dev/null 2>&1 || true
  fi
  rm -rf "$CTX"
  exit "$code"
}
trap cleanup EXIT INT TERM

for tool in podman runc mmdebstrap curl; do
  command -v "$tool" >/dev/null || { say "missing $tool: apt-get install podman runc mmdebstrap curl"; exit 2; }
done
# an earlier run interrupted hard: start clean
podman pod rm -f -t 5 "$PREFIX" >/dev/null 2>&1 || true
podman rm -f -v "$PREFIX-migrate" >/dev/null 2>&1 || true
podman volume rm -f "$PREFIX-data" "$PREFIX-cache" >/dev/null 2>&1 || true
started=$(date +%s)

# 1. The base: Debian bookworm (Python 3.11, as `python` too), Redis and tini from Debian.
if [ "${REBUILD_BASE:-0}" = 1 ] || ! podman image exists "$BASE_IMAGE"; then
  say "building $BASE_IMAGE with mmdebstrap"
  sources=/etc/apt/sources.list.d/debian.sources
  [ -f "$sources" ] || sources="http://deb.debian.org/debian"
  # This machine's TLS trust (its network may re-sign HTTPS): pip in the build uses it.
  mmdebstrap --variant=minbase --quiet \
    --include=python3,python3-venv,python-is-python3,ca-certificates,redis-server,tini \
    --customize-hook='mkdir -p "$1/usr/local/share/strata-check"' \
    --customize-hook='copy-in /etc/ssl/certs/ca-certificates.crt /usr/local/share/strata-check' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm "$CTX/base.tar" "$sources"
  podman import --quiet \
    --change 'ENV PIP_CERT=/usr/local/share/strata-check/ca-certificates.crt' \
    --change 'CMD ["/bin/bash"]' "$CTX/base.tar" "$BASE_IMAGE" >/dev/null
  rm -f "$CTX/base.tar"
fi
base_done=$(date +%s)

# 2. The build context: what the Dockerfiles copy, and torch's CPU wheel from this machine.
mkdir -p "$CTX/src/deploy/wheels"
cp pyproject.toml README.md alembic.ini "$CTX/src/"
cp -r compute service migrations "$CTX/src/"
cp deploy/Dockerfile.api deploy/Dockerfile.worker "$CTX/src/deploy/"
find "$CTX/src" -name __pycache__ -prune -exec rm -rf {} +
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --dest "$CTX/src/deploy/wheels" \
  --python-version 3.11 --platform manylinux_2_28_x86_64 "torch==$TORCH_VERSION"
ls "$CTX/src/deploy/wheels/"torch-*.whl >/dev/null
say "torch wheel: $(basename "$CTX"/src/deploy/wheels/torch-*.whl)"

# 3. The images (the worker on the same Debian base, with torch's CPU wheel).
for image in api worker; do
  tag=$API_IMAGE; [ "$image" = worker ] && tag=$WORKER_IMAGE
  say "building $tag"
  t0=$(date +%s)
  podman build --quiet "${BUILD_OPTS[@]}" --build-arg "BASE=$BASE_IMAGE" \
    -f "$CTX/src/deploy/Dockerfile.$image" -t "$tag" "$CTX/src" >/dev/null
  say "built $tag in $(( $(date +%s) - t0 )) s, $(podman image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}')"
done
built=$(date +%s)

# 4. Run: Redis, the migration, the API and a CPU worker in one pod (they share localhost).
ENV_COMMON=(-e STRATA_BROKER_URL=redis://127.0.0.1:6379/0 -e STRATA_API_URL=http://127.0.0.1:8000
            -e HF_HUB_OFFLINE=1 -e OMP_NUM_THREADS=1)
podman pod create --name "$PREFIX" --publish "127.0.0.1:$PORT:8000" >/dev/null
podman volume create "$PREFIX-data" >/dev/null
podman volume create "$PREFIX-cache" >/dev/null  # the images' model-cache volume, named so it goes
podman run -d "${RUN_OPTS[@]}" --pod "$PREFIX" --name "$PREFIX-redis" --user 65534:65534 \
  "$BASE_IMAGE" redis-server --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null
podman run --rm "${RUN_OPTS[@]}" --name "$PREFIX-migrate" -v "$PREFIX-data:/data" \
  -v "$PREFIX-cache:/cache/huggingface" --no-healthcheck \
  -e STRATA_DATABASE=/data/strata.duckdb "$API_IMAGE" strata db upgrade >&2
# (no zoo registration on first start: only the job below runs; no healthcheck timers, which
# need systemd; the image's HEALTHCHECK is for Docker and compose)
podman run -d "${RUN_OPTS[@]}" --pod "$PREFIX" --name "$PREFIX-api" -v "$PREFIX-data:/data" \
  -v "$PREFIX-cache:/cache/huggingface" --no-healthcheck "${ENV_COMMON[@]}" \
  -e STRATA_JOBS__REGISTER_ZOO=false -e "STRATA_API_KEYS=$KEY" "$API_IMAGE" >/dev/null
podman run -d "${RUN_OPTS[@]}" --pod "$PREFIX" --name "$PREFIX-worker" \
  -v "$PREFIX-cache:/cache/huggingface" "${ENV_COMMON[@]}" -e "STRATA_API_KEY=$KEY" -e STRATA_WORKER__DEVICE=cpu \
  "$WORKER_IMAGE" strata worker --device cpu --queues gpu >/dev/null

API=http://127.0.0.1:$PORT/api/v1
call() { curl -sS --fail-with-body -H "X-API-Key: $KEY" "$@"; }
json() { "$PY" -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1], {'d': d}))" "$1"; }
for _ in $(seq 120); do call "$API/ready" >/dev/null 2>&1 && break; sleep 1; done
call "$API/ready" >/dev/null
say "API ready"
call -H 'Content-Type: application/json' -d '{"source": "zoo:tiny-2l-s0"}' "$API/models" >/dev/null
job=$(call -H 'Content-Type: application/json' -d '{"model": "tiny-2l-s0", "metrics":
  ["intervention", "logit_lens"], "n_sequences": 4, "seq_len": 32, "device": "cpu"}' \
  "$API/jobs" | json 'd["id"]')
say "job $job submitted"
state=queued
for _ in $(seq 300); do
  state=$(call "$API/jobs/$job" | json 'd["state"]')
  case $state in succeeded|failed|cancelled) break ;; esac
  sleep 1
done
[ "$state" = succeeded ] || { say "job $job ended $state: $(call "$API/jobs/$job")"; exit 1; }
rows=$(call "$API/models/tiny-2l-s0/metrics?metric=intervention.kl&component=drop" | json 'len(d["rows"]) if isinstance(d, dict) else len(d)')
[ "$rows" = 2 ] || { say "expected 2 layers of intervention.kl, got $rows"; exit 1; }
worker=$(call "$API/jobs/$job" | json 'd.get("worker")')
ran=$(date +%s)
say "job $job succeeded on $worker; intervention.kl read back for 2 layers"
say "times: base $(( base_done - started )) s, builds $(( built - base_done )) s, run $(( ran - built )) s, total $(( ran - started )) s"
podman image inspect --format '{{.RepoTags}} {{.Size}}' "$BASE_IMAGE" "$API_IMAGE" "$WORKER_IMAGE" \
  | awk '{printf "[check] image %s %.0f MB\n", $1, $2/1e6}' >&2
echo "deploy/check.sh: OK"
