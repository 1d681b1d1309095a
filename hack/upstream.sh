#!/usr/bin/env bash
# Builds the upstream binaries the real-stack tests run (etcd, Kubernetes, Cluster API) from the Go
# module proxy, each family from a small Go module of ours under hack/upstream/<family>. Binaries go
# to a cache outside the tree and are rebuilt only when a family's pins (its go.mod, go.sum, main.go
# or the version stamped into it) change.
#
#   hack/upstream.sh build [family...]   build what is stale (default: every family)
#   hack/upstream.sh bin                 print the directory holding the current binaries
#   hack/upstream.sh list                print each family, its pin and whether it is built
#
# The cache is $CAPMVM_UPSTREAM_CACHE, by default ${XDG_CACHE_HOME:-~/.cache}/capmvm-upstream.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${CAPMVM_UPSTREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capmvm-upstream}
families=(etcd kubernetes capi)

# The version each family's binaries report, stamped through -ldflags -X as upstream's own builds do.
kube_version=v1.36.3
capi_version=v1.14.2

ldflags_for() {
    local family=$1 date=2026-01-01T00:00:00Z
    case $family in
        etcd) echo "-s -w" ;;
        kubernetes)
            local major=${kube_version#v}; major=${major%%.*}
            local minor=${kube_version#v*.}; minor=${minor%%.*}
            local flags="-s -w"
            for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
                flags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
                flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
            done
            echo "$flags" ;;
        capi)
            local major=${capi_version#v}; major=${major%%.*}
            local minor=${capi_version#v*.}; minor=${minor%%.*}
            local pkg=sigs.k8s.io/cluster-api/version
            echo "-s -w -X $pkg.gitVersion=$capi_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date" ;;
    esac
}

# name=package for every binary of a family.
packages_for() {
    case $1 in
        etcd) echo "etcd=." ;;
        kubernetes) echo "kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver kubectl=k8s.io/kubernetes/cmd/kubectl kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager" ;;
        capi) echo "capi-manager=sigs.k8s.io/cluster-api/core capi-kubeadm-bootstrap-manager=sigs.k8s.io/cluster-api/bootstrap/kubeadm capi-kubeadm-control-plane-manager=sigs.k8s.io/cluster-api/controlplane/kubeadm clusterctl=sigs.k8s.io/cluster-api/cmd/clusterctl" ;;
    esac
}

pin_of() {
    local family=$1
    {
        cat "$here/upstream/$family"/go.mod "$here/upstream/$family"/go.sum
        cat "$here/upstream/$family"/*.go 2>/dev/null || true
        packages_for "$family"
        ldflags_for "$family"
        go env GOVERSION
    } | sha256sum | cut -c1-16
}

# Cluster API's manifests (CRDs, webhook configurations, clusterctl's inventory CRD) from the module
# the binaries were built from, for the harness to install.
copy_manifests() {
    local family=$1 out=$2 module part
    [ "$family" = capi ] || return 0
    module=$(cd "$here/upstream/capi" && go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api)
    for part in core/config bootstrap/kubeadm/config controlplane/kubeadm/config cmd/clusterctl/config; do
        mkdir -p "$out/capi-config/$part"
        cp -R "$module/$part/." "$out/capi-config/$part/"
    done
    chmod -R u+w "$out/capi-config"
}

build_family() {
    local family=$1 pin out started
    pin=$(pin_of "$family")
    out="$cache/$family/$pin"
    if [ -f "$out/.complete" ]; then
        echo "upstream: $family is current ($out)"
    else
        echo "upstream: building $family into $out"
        started=$SECONDS
        rm -rf "$out.partial" && mkdir -p "$out.partial"
        local entry name pkg
        for entry in $(packages_for "$family"); do
            name=${entry%%=*}; pkg=${entry#*=}
            (cd "$here/upstream/$family" && CGO_ENABLED=0 go build -mod=readonly -trimpath \
                -ldflags "$(ldflags_for "$family")" -o "$out.partial/$name" "$pkg")
            echo "upstream:   $name ($(( SECONDS - started ))s)"
        done
        copy_manifests "$family" "$out.partial"
        touch "$out.partial/.complete"
        rm -rf "$out" && mv "$out.partial" "$out"
        echo "upstream: $family built in $(( SECONDS - started ))s"
    fi
    mkdir -p "$cache/bin"
    for entry in $(packages_for "$family"); do
        ln -sfn "$out/${entry%%=*}" "$cache/bin/${entry%%=*}"
    done
    if [ -d "$out/capi-config" ]; then ln -sfn "$out/capi-config" "$cache/bin/capi-config"; fi
}

cmd=${1:-build}
shift || true
case $cmd in
    build)
        [ $# -gt 0 ] || set -- "${families[@]}"
        for family in "$@"; do build_family "$family"; done ;;
    bin) echo "$cache/bin" ;;
    list)
        for family in "${families[@]}"; do
            pin=$(pin_of "$family")
            state=stale; [ -f "$cache/$family/$pin/.complete" ] && state=built
            echo "$family $pin $state"
        done ;;
    *) echo "usage: $0 build [family...] | bin | list" >&2; exit 2 ;;
esac
