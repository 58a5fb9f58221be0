#!/usr/bin/env bash
# biaxial on kind, with fake GPUs: create the cluster, build and load the image, install the
# chart, apply the four two-axis patterns and show where their pods went.
#
#   deploy/kind/up.sh                  # everything (Kubernetes 1.37 node image by default)
#   K8S_VERSION=1.34 deploy/kind/up.sh # the 1.34 config (alpha DRA gates switched on)
#   deploy/kind/up.sh --check-tools    # exit 1, naming what is missing, if this cannot run
#   deploy/kind/up.sh --delete         # delete the cluster
#
# Environment: K8S_VERSION (1.34 | 1.35 | 1.36 | 1.37), KIND_NODE_IMAGE (overrides the node
# image), CLUSTER_NAME (biaxial), IMAGE (biaxial:0.1.0), CONTAINER_ENGINE (docker | podman;
# default: whichever works), KUBECONFIG_OUT (where the cluster's kubeconfig is written;
# default ${TMPDIR:-/tmp}/biaxial-kind.kubeconfig, which tests/e2e reads too).
#
# Fake GPUs publish real ResourceSlices and go through real allocation and Prepare; the CDI
# specs they produce name /dev/nvidia* device nodes, so this script creates inert character
# devices with NVIDIA's major numbers inside each worker's node container (nothing can open
# them: there is no driver), and GPU shares are time-sliced (deviceClasses.sharingStrategy=none,
# the only strategy the class allows there: there is no CUDA for HAMi-core to intercept, so the
# image is built without it, HAMI_CORE=none, and the chart installs none:
# kubeletPlugin.hamiCoreLibrary=""), so pods reach Running.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
K8S_VERSION="${K8S_VERSION:-1.37}"
CLUSTER_NAME="${CLUSTER_NAME:-biaxial}"
IMAGE="${IMAGE:-biaxial:0.1.0}"
NAMESPACE=biaxial-system
KUBECONFIG_OUT="${KUBECONFIG_OUT:-${TMPDIR:-/tmp}/biaxial-kind.kubeconfig}"

say() { printf '\n=== %s\n' "$*" >&2; }
die() { printf 'up.sh: %s\n' "$*" >&2; exit 1; }

engine() {
  if [[ -n "${CONTAINER_ENGINE:-}" ]]; then echo "$CONTAINER_ENGINE"; return; fi
  for candidate in docker podman; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" info >/dev/null 2>&1; then
      echo "$candidate"; return
    fi
  done
  echo ""
}

check_tools() {
  local missing=()
  [[ -n "$(engine)" ]] || missing+=("a running container engine (docker or podman)")
  command -v kind >/dev/null 2>&1 || missing+=("kind")
  command -v kubectl >/dev/null 2>&1 || missing+=("kubectl")
  if ((${#missing[@]})); then
    local joined; joined="$(printf '%s, ' "${missing[@]}")"
    printf 'up.sh: cannot create a kind cluster here; missing: %s\n' "${joined%, }" >&2
    return 1
  fi
}

node_image() {
  if [[ -n "${KIND_NODE_IMAGE:-}" ]]; then echo "$KIND_NODE_IMAGE"; return; fi
  case "$K8S_VERSION" in
    1.34) echo "kindest/node:v1.34.0" ;;
    1.35) echo "kindest/node:v1.35.0" ;;
    1.36) echo "kindest/node:v1.36.0" ;;
    1.37) echo "kindest/node:v1.37.0" ;;
    *) die "K8S_VERSION=$K8S_VERSION is not supported (1.34 .. 1.37)" ;;
  esac
}

cluster_config() {
  case "$K8S_VERSION" in
    1.34 | 1.35) echo "$here/cluster-1.34.yaml" ;;
    *) echo "$here/cluster-1.36.yaml" ;;
  esac
}

# Inert /dev/nvidia* character devices (NVIDIA's majors: 195 for GPUs and nvidiactl, the
# nvidia-uvm major read from /proc/devices when the host has it, else 510) in a node container.
fake_device_nodes() {
  local node="$1" eng="$2"
  # shellcheck disable=SC2016 # expanded by the shell inside the node container
  "$eng" exec "$node" sh -ec '
    uvm=$(awk "\$2 == \"nvidia-uvm\" {print \$1}" /proc/devices); uvm=${uvm:-510}
    for i in 0 1 2 3; do [ -e /dev/nvidia$i ] || mknod -m 666 /dev/nvidia$i c 195 $i; done
    [ -e /dev/nvidiactl ] || mknod -m 666 /dev/nvidiactl c 195 255
    [ -e /dev/nvidia-uvm ] || mknod -m 666 /dev/nvidia-uvm c "$uvm" 0
    [ -e /dev/nvidia-uvm-tools ] || mknod -m 666 /dev/nvidia-uvm-tools c "$uvm" 1
  '
}

main() {
  case "${1:-}" in
    --check-tools) check_tools; exit $? ;;
    --delete) kind delete cluster --name "$CLUSTER_NAME"; exit $? ;;
    "") ;;
    *) die "unknown argument $1 (use --check-tools or --delete)" ;;
  esac
  check_tools || exit 1
  local eng; eng="$(engine)"
  export KIND_EXPERIMENTAL_PROVIDER="$eng"

  if kind get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
    say "cluster $CLUSTER_NAME exists; reusing it"
  else
    say "creating kind cluster $CLUSTER_NAME ($(node_image), $(basename "$(cluster_config)"))"
    kind create cluster --name "$CLUSTER_NAME" --image "$(node_image)" \
      --config "$(cluster_config)" --wait 120s
  fi
  kind get kubeconfig --name "$CLUSTER_NAME" >"$KUBECONFIG_OUT"
  export KUBECONFIG="$KUBECONFIG_OUT"

  say "fake /dev/nvidia* device nodes on the workers"
  for node in $(kind get nodes --name "$CLUSTER_NAME"); do
    [[ "$node" == *control-plane* ]] || fake_device_nodes "$node" "$eng"
  done

  say "building $IMAGE and loading it into the nodes"
  "$eng" build --build-arg HAMI_CORE=none -t "$IMAGE" "$root"
  if [[ "$eng" == docker ]]; then
    kind load docker-image "$IMAGE" --name "$CLUSTER_NAME"
  else
    local archive; archive="$(mktemp --suffix=.tar)"
    "$eng" save -o "$archive" "$IMAGE"
    kind load image-archive "$archive" --name "$CLUSTER_NAME"
    rm -f "$archive"
  fi

  say "installing biaxial with fake GPUs"
  if command -v helm >/dev/null 2>&1; then
    helm upgrade --install biaxial "$root/deploy/helm/biaxial" \
      --namespace "$NAMESPACE" --create-namespace \
      --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" \
      --set kubeletPlugin.fakeGpus=t4x4 \
      --set-json 'kubeletPlugin.nodeSelector={"nvidia.com/gpu.present":null,"biaxial.dev/fake-gpus":"true"}' \
      --set kubeletPlugin.tolerations=null \
      --set kubeletPlugin.advertiseLegacyResources=true \
      --set kubeletPlugin.hamiCoreLibrary= \
      --set 'kubeletPlugin.shareStrategies={none}' \
      --set deviceClasses.sharingStrategy=none \
      --set 'deviceClasses.allowedSharingStrategies={none}'
  else
    # The same values, rendered: deploy/manifests/biaxial-fake-gpus.yaml.
    [[ "$IMAGE" == biaxial:0.1.0 ]] || die "without helm only IMAGE=biaxial:0.1.0 is supported"
    kubectl apply --server-side -f "$root/deploy/manifests/biaxial-fake-gpus.yaml"
  fi
  kubectl -n "$NAMESPACE" rollout status daemonset/biaxial-kubelet-plugin --timeout=180s
  kubectl -n "$NAMESPACE" rollout status deployment/biaxial-controller --timeout=180s

  say "ResourceSlices published"
  kubectl get resourceslices -o wide

  # One pattern at a time: each is documented for an otherwise empty cluster.
  for pattern in "$root"/examples/four-patterns/*.yaml; do
    local app; app="$(basename "$pattern" .yaml)"; app="pattern-${app:0:1}"
    say "$(basename "$pattern")"
    kubectl apply -f "$pattern"
    local deadline=$((SECONDS + 180))
    until [[ "$(kubectl get pods -l "app=$app" -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' \
        | grep -c .)" == 4 ]]; do
      ((SECONDS < deadline)) || die "$app: pods still unscheduled after 180 s (docs/operations.md)"
      sleep 2
    done
    kubectl get pods -l "app=$app" -o wide
    kubectl get resourceclaims -o custom-columns='CLAIM:.metadata.name,DEVICE:.status.allocation.devices.results[*].device,NODE:.status.allocation.nodeSelector.nodeSelectorTerms[0].matchFields[0].values[0]'
    kubectl delete -f "$pattern" --wait=true
    kubectl wait --for=delete pod -l "app=$app" --timeout=120s || true
  done
  echo
  echo "KUBECONFIG=$KUBECONFIG_OUT   (tests: make e2e-kind; delete: deploy/kind/up.sh --delete)"
}

main "$@"
