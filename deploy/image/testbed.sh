#!/bin/bash
# Builds the project's Dockerfile with podman on a machine with no
# registry, and runs its image on namespace hosts ($CLUSTER_SH), for
# testing the image as deployed: one container per host, on the host's
# network. Needs root, and Debian's podman and mmdebstrap (`testbed.sh
# deps` installs them).
#
#   testbed.sh deps            install podman and mmdebstrap (Debian)
#   testbed.sh build TAG       make the Dockerfile's base images, then build it as TAG
#   testbed.sh run I ARGS...   podman run ARGS on namespace host I
#   testbed.sh podman ARGS...  podman on the testbed's storage
#   testbed.sh down            remove the hosts, the images and every file
#
# Everything lives in $IMAGE_TESTBED (default /tmp/gyre-image-testbed):
# the container storage and the base images' root filesystem. The
# workarounds below answer limits of this machine, not anything a user
# of the Dockerfile needs; each says which.
set -euo pipefail
export CLUSTER_ID=${CLUSTER_ID:-6}
cluster() {
  "${CLUSTER_SH:?set CLUSTER_SH to the namespace-cluster script}" "$@"
}
DIR=${IMAGE_TESTBED:-/tmp/gyre-image-testbed}
REPO=$(cd "$(dirname "$0")/../.." && pwd)

# The testbed's own storage, so that a run leaves nothing behind.
pod() {
  command podman --root "$DIR/storage" --runroot "$DIR/run" --tmpdir "$DIR/tmp" \
    --cgroup-manager cgroupfs --events-backend none "$@"
}

# Each podman runs in a mount namespace of its own with the cgroup v1
# controllers mounted alone (../v1-cgroups.sh says why).
V1_CGROUPS=$REPO/deploy/v1-cgroups.sh

# Root here lacks CAP_SYS_RESOURCE, so podman's default limits, above the
# machine's, cannot be set: lower ones are.
limits() { echo "--ulimit nofile=4096:4096 --ulimit nproc=4096:4096"; }

cmd=${1:-}; shift || true
case "$cmd" in
deps)
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends podman crun mmdebstrap
  ;;
build)
  tag=${1:?usage: testbed.sh build TAG}
  for tool in podman mmdebstrap go; do
    command -v "$tool" >/dev/null || { echo "testbed: no $tool (testbed.sh deps installs podman and mmdebstrap)" >&2; exit 2; }
  done
  # No registry: the Dockerfile's two bases are made here, under their
  # own names, from one bootstrap of the release the Dockerfile names,
  # with what the Go image needs for cgo (which the other carries too);
  # the Go image adds this machine's Go, which must be the version the
  # Dockerfile names.
  read -r build_base final_base < <(awk '/^FROM / { printf "%s ", $2 } END { print "" }' "$REPO/Dockerfile")
  release=${final_base#*:}; release=${release%-slim}
  go_version=${build_base#*:}; go_version=${go_version%%-*}
  case "$(go env GOVERSION)" in
  "go$go_version" | "go$go_version".*) ;;
  *) echo "testbed: the Dockerfile builds with Go $go_version; this machine has $(go env GOVERSION)" >&2; exit 2 ;;
  esac
  mkdir -p "$DIR/tmp"
  start=$(date +%s)
  # Essential packages, useradd and what cgo needs, without manuals,
  # documentation and translations, as a slim image has them.
  TMPDIR=$DIR/tmp mmdebstrap --variant=essential --include=passwd,gcc,libc6-dev,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' "$release" "$DIR/base.tar" http://deb.debian.org/debian \
    >"$DIR/bootstrap.log" 2>&1 || { tail -n 20 "$DIR/bootstrap.log" >&2; exit 1; }
  bootstrapped=$(date +%s)
  pod import -q - "docker.io/library/$final_base" <"$DIR/base.tar" >/dev/null
  tar -C "$(go env GOROOT)" -rf "$DIR/base.tar" --transform 's,^\.,./usr/local/go,' .
  pod import -q \
    --change 'ENV PATH=/usr/local/go/bin:/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV GOPATH=/go' - "docker.io/library/$build_base" <"$DIR/base.tar" >/dev/null
  rm -f "$DIR/base.tar"
  echo "testbed: base images made in $(( $(date +%s) - start )) s ($(( bootstrapped - start )) s of it the bootstrap)" >&2
  start=$(date +%s)
  # This machine's module and build caches, mounted: go mod download
  # finds every module there (this machine's HTTPS goes through a proxy
  # whose certificate the image does not trust), and the packages CI's
  # earlier builds compiled with the Dockerfile's flags are not compiled
  # again.
  unshare --mount --propagation private "$V1_CGROUPS" "$0" podman build --network host $(limits) \
    -v "$(go env GOMODCACHE):/go/pkg/mod" -v "$(go env GOCACHE):/root/.cache/go-build" \
    -t "$tag" "$REPO"
  echo "testbed: the Dockerfile built in $(( $(date +%s) - start )) s" >&2
  ;;
run)
  i=${1:?usage: testbed.sh run I ARGS...}; shift
  cluster run "$i" unshare --mount --propagation private "$V1_CGROUPS" "$0" podman run --network host --cgroups=disabled $(limits) "$@"
  ;;
podman)
  pod "$@"
  ;;
down)
  cluster down >/dev/null 2>&1 || true
  if [ -d "$DIR/storage" ]; then
    pod rm -af >/dev/null 2>&1 || true
    pod system reset -f >/dev/null 2>&1 || true
  fi
  # An interrupted bootstrap may leave /proc and /sys mounted in its
  # directory: unmount, deepest first, before removing anything.
  awk -v d="$DIR/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r | while read -r m; do umount -l "$m"; done
  rm -rf "$DIR"
  echo "testbed: down"
  ;;
*)
  sed -n '2,/^set -euo/p' "$0" | grep '^#' | cut -c3-
  exit 2
  ;;
esac
