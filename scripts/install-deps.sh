#!/usr/bin/env bash
# Installs every Debian package Strata's build, daemon and tests use. Idempotent: packages that
# are already present are skipped, so a warm machine pays only for the dpkg query.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git ca-certificates
  libucx-dev ucx-utils
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev liburing-dev libzstd-dev libhwy-dev libssl-dev libxxhash-dev
  libyaml-cpp-dev libcpp-httplib-dev libspdlog-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev
  python3 python3-venv python3-dev
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev
  prometheus yamllint etcd-server etcd-client
  fio ccache openssl
  redis-server libhiredis-dev
  e2fsprogs
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all packages present"
fi
