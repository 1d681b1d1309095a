#!/usr/bin/env bash
# Builds the upstream binaries the real-stack tests run. etcd, Kubernetes and Cluster API come from the
# Go module proxy, each family from a small Go module of ours under hack/upstream/<family>. The
# cluster-autoscaler, the Go provider (cluster-api-provider-microvm) and flintlockd are refused by the
# proxy, so they are built from pinned source archives (`git archive` of a public tag or commit, sha256
# checked here) found in $CAPMVM_UPSTREAM_SRC, else $CAPMVM_SHARED_DIR/upstream-src, else
# ../shared/upstream-src beside the repository: unpacked into the cache, never into the tree, their
# refused modules `replace`d by the unpacked folders. Binaries go to a cache outside the tree and are
# rebuilt only when a family's pins (its go.mod, go.sum, main.go, archives or the version stamped into
# it) change.
#
#   hack/upstream.sh build [family...]   build what is stale (default: every family)
#   hack/upstream.sh bin                 print the directory holding the current binaries
#   hack/upstream.sh list                print each family, its pin and whether it is built
#
# The cache is $CAPMVM_UPSTREAM_CACHE, by default ${XDG_CACHE_HOME:-~/.cache}/capmvm-upstream.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${CAPMVM_UPSTREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capmvm-upstream}
families=(etcd kubernetes capi autoscaler go-provider flintlock)
repo_root=$(cd "$here/.." && pwd)

# The version each family's binaries report, stamped through -ldflags -X as upstream's own builds do.
kube_version=v1.36.3
capi_version=v1.14.2

ldflags_for() {
    local family=$1 date=2026-01-01T00:00:00Z
    case $family in
        etcd|autoscaler|go-provider|flintlock) echo "-s -w" ;;
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

# The source archives an archive family is built from: "file sha256 upstream-repository ref" per line.
archives_for() {
    case $1 in
        autoscaler) echo "autoscaler-cluster-autoscaler-1.36.1.tar.gz eb84df0df0935f5645579f85564f7360a0270bda1e97aa22239baf25694a4f74 github.com/kubernetes/autoscaler tag:cluster-autoscaler-1.36.1(folder-cluster-autoscaler)" ;;
        go-provider)
            echo "cluster-api-provider-microvm-v0.10.1.tar.gz f643275366c604fc1e70eb4a70f83105d2a54d32c2be673be4795af9bc7db4d9 github.com/liquidmetal-dev/cluster-api-provider-microvm tag:v0.10.1"
            echo "controller-pkg-fccf00f.tar.gz c139825b420119e7f69042e62a65cdaf1213453d867e943dbe65df3c9604ac04 github.com/liquidmetal-dev/controller-pkg commit:fccf00f7a4079eade8c7eeafde9be2b413b0305b"
            echo "flintlock-755c4154.tar.gz df2940ff9c9033eac9eaa33a5628774ee94d4776d28df74f14257a5053087a65 github.com/liquidmetal-dev/flintlock commit:755c4154ea88d6cf74aefd43366c828d89632a49" ;;
        flintlock) echo "flintlock-v0.11.0.tar.gz 84f4baed75c8fb4da40ff5e6c3b4a7f6db4034609478a6dfea4eccaaa6a969a6 github.com/liquidmetal-dev/flintlock tag:v0.11.0" ;;
    esac
}

# Where, inside the unpacked archives, an archive family's main module is built.
module_dir_for() {
    case $1 in
        autoscaler) echo "autoscaler-cluster-autoscaler-1.36.1/cluster-autoscaler" ;;
        go-provider) echo "cluster-api-provider-microvm-v0.10.1" ;;
        flintlock) echo "flintlock-v0.11.0" ;;
    esac
}

# module=folder (relative to the unpacked archives) for each module the proxy refuses.
replaces_for() {
    case $1 in
        autoscaler) echo "k8s.io/autoscaler/cluster-autoscaler/apis=autoscaler-cluster-autoscaler-1.36.1/cluster-autoscaler/apis" ;;
        go-provider)
            local pkg=github.com/liquidmetal-dev
            echo "$pkg/controller-pkg/client=controller-pkg-fccf00f/client"
            echo "$pkg/controller-pkg/services/microvm=controller-pkg-fccf00f/services/microvm"
            echo "$pkg/controller-pkg/types/microvm=controller-pkg-fccf00f/types/microvm"
            echo "$pkg/flintlock/api=flintlock-755c4154/api"
            echo "$pkg/flintlock/client=flintlock-755c4154/client" ;;
    esac
}

tags_for() {
    case $1 in
        autoscaler) echo "clusterapi" ;;
    esac
}

is_archive_family() { [ -n "$(archives_for "$1")" ]; }

# The folder holding the source archives, or nothing.
upstream_src() {
    local dir
    for dir in "${CAPMVM_UPSTREAM_SRC:-}" "${CAPMVM_SHARED_DIR:+$CAPMVM_SHARED_DIR/upstream-src}" \
        "$repo_root/../shared/upstream-src"; do
        if [ -n "$dir" ] && [ -d "$dir" ]; then (cd "$dir" && pwd); return 0; fi
    done
}

# Checks every archive of a family is present with its pinned sha256; says where to get a missing one.
check_archives() {
    local family=$1 src file sum repo ref actual ok=0
    src=$(upstream_src)
    while read -r file sum repo ref; do
        if [ -z "$src" ] || [ ! -f "$src/$file" ]; then
            echo "upstream: $family needs $file, which the Go module proxy will not serve:" >&2
            echo "  make it with \`git archive --prefix=${file%.tar.gz}/ -o $file <$ref>\` in a clone of https://$repo" >&2
            echo "  (${ref%%(*} ${ref#*(}) and put it in \$CAPMVM_UPSTREAM_SRC (or \$CAPMVM_SHARED_DIR/upstream-src); sha256 $sum" >&2
            ok=1; continue
        fi
        actual=$(sha256sum "$src/$file" | cut -d' ' -f1)
        if [ "$actual" != "$sum" ]; then
            echo "upstream: $src/$file has sha256 $actual, pinned $sum: not the pinned source, refusing it" >&2
            ok=1
        fi
    done < <(archives_for "$family")
    return $ok
}

# name=package for every binary of a family.
packages_for() {
    case $1 in
        etcd) echo "etcd=." ;;
        kubernetes) echo "kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver kubectl=k8s.io/kubernetes/cmd/kubectl kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager" ;;
        capi) echo "capi-manager=sigs.k8s.io/cluster-api/core capi-kubeadm-bootstrap-manager=sigs.k8s.io/cluster-api/bootstrap/kubeadm capi-kubeadm-control-plane-manager=sigs.k8s.io/cluster-api/controlplane/kubeadm clusterctl=sigs.k8s.io/cluster-api/cmd/clusterctl" ;;
        autoscaler) echo "cluster-autoscaler=." ;;
        go-provider) echo "capmvm-go-manager=." ;;
        flintlock) echo "flintlockd=./cmd/flintlockd" ;;
    esac
}

pin_of() {
    local family=$1
    {
        if is_archive_family "$family"; then
            archives_for "$family"; replaces_for "$family"; tags_for "$family"
        else
            cat "$here/upstream/$family"/go.mod "$here/upstream/$family"/go.sum
            cat "$here/upstream/$family"/*.go 2>/dev/null || true
        fi
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

# Unpacks an archive family's archives into <src> (a folder of the cache that outlives the build: the
# replaces name it) and points its refused modules at the unpacked folders; prints the folder to build in.
unpack_archives() {
    local family=$1 src=$2 archives file sum rest entry module folder
    archives=$(upstream_src)
    rm -rf "$src" && mkdir -p "$src"
    while read -r file sum rest; do
        tar xzf "$archives/$file" -C "$src"
    done < <(archives_for "$family")
    chmod -R u+w "$src"
    local dir="$src/$(module_dir_for "$family")"
    for entry in $(replaces_for "$family"); do
        module=${entry%%=*}; folder=${entry#*=}
        (cd "$dir" && go mod edit -replace "$module=$src/$folder")
    done
    echo "$dir"
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
        local entry name pkg dir="$here/upstream/$family" tags
        if is_archive_family "$family"; then
            check_archives "$family" || return 1
            dir=$(unpack_archives "$family" "$out.src")
        fi
        tags=$(tags_for "$family")
        for entry in $(packages_for "$family"); do
            name=${entry%%=*}; pkg=${entry#*=}
            (cd "$dir" && CGO_ENABLED=0 go build -mod=readonly -trimpath ${tags:+-tags "$tags"} \
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
    # An archive family's unpacked source stays beside its binaries (the Go provider's config/, say).
    if [ -d "$out.src" ]; then ln -sfn "$out.src" "$cache/bin/$family-src"; fi
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
