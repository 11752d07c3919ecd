#!/usr/bin/env bash
# Runs the README's quickstart on an ARM Debian under emulation, on an x86-64 Debian/Ubuntu host:
#
#   ./scripts/check-arm.sh arm64|armhf [--fresh]
#
# Steps, each timed, one summary line per step at the end (and a failure names its step):
#   host     qemu-user-static, debootstrap and binfmt-support (apt-get when missing), and the
#            binfmt handler of the architecture enabled, so the root's binaries run under qemu
#   root     a Debian bookworm root for the architecture (debootstrap), cached in
#            .cache/arm/<arch>/root and reused while .cache/arm/<arch>/root/.edge-inferd-root is there
#   copy     `git archive HEAD` of this checkout into /srv/edge-inferd in the root (committed
#            files only; the venvs and test models of an earlier run there are kept, --fresh drops them)
#   setup    ./scripts/setup.sh in the root (venv, edge-inferd and its test extra, mosquitto)
#   seed     the host's test models (CHECK_ARM_TEST_MODELS, default .cache/test-models here) copied
#            into the root's .cache/test-models when they are there: data files (.tflite, photos,
#            labels), the same on every architecture. The root's fetch_test_models.sh still checks
#            each against its pinned sha256 and fetches what is missing or wrong, so only the
#            download (apt-get install npm under emulation, about 11 min) is saved
#   demo     ./scripts/demo.sh in the root (fetches the test models and photos first)
#   unit     ./scripts/test.sh -q -p no:cacheprovider --ignore=tests/integration in the root
#            (the integration tests take too long under emulation)
#
# Nothing runs as a service in the root (a policy-rc.d refuses starts). Every emulated step runs
# under `nice -n $CHECK_ARM_NICE` (default 10). Each step's output goes to the terminal and to
# .cache/arm/<arch>/<step>.log; a line every 60 s says a long step is still running.
# env: CHECK_ARM_MIRROR (default: the first Debian mirror in /etc/apt/sources.list*, else
#      http://deb.debian.org/debian), CHECK_ARM_CACHE (default .cache/arm), CHECK_ARM_NICE,
#      CHECK_ARM_TEST_MODELS (empty: no seeding, the root fetches its own), CHECK_ARM_LITERT: a pip version spec for ai-edge-litert put into the root's venv after setup
#      (e.g. "==1.4.0"). Under qemu-aarch64 7.2 (Debian 12's qemu-user-static) ai-edge-litert
#      2.3.0 dies with SIGSEGV building any interpreter, with /proc and /sys mounted and
#      QEMU_CPU=max or cortex-a72 alike; 1.4.0 runs. Emulation's limit or the wheel's is not known
#      (no ARM hardware here); the daemon's own requirement stays ai-edge-litert>=2.0.
set -euo pipefail
ROOT_DIR=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT_DIR"

usage() { echo "usage: $0 arm64|armhf [--fresh]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
ARCH=$1
FRESH=0
[ $# -eq 2 ] && { [ "$2" = --fresh ] || usage; FRESH=1; }
case "$ARCH" in
    arm64) QEMU=qemu-aarch64; MACHINE=aarch64 ;;
    armhf) QEMU=qemu-arm; MACHINE=armv7l ;;
    *) usage ;;
esac
SUITE=bookworm
NICE=${CHECK_ARM_NICE:-10}
CACHE=${CHECK_ARM_CACHE:-$ROOT_DIR/.cache/arm}/$ARCH
CHROOT=$CACHE/root
MARK=$CHROOT/.edge-inferd-root
PROJECT=/srv/edge-inferd
BUNDLE=/etc/ssl/certs/ca-certificates.crt  # the root's system store (pip's vendored certifi lacks the host's CAs)
HEARTBEAT_S=60

SUMMARY=()
CURRENT=""
# A step runs in a pipeline (a subshell): what it wants on its summary line goes through a file.
note() { echo "$*" > "$CACHE/.note"; }
annotate() { SUMMARY[${#SUMMARY[@]}-1]="${SUMMARY[${#SUMMARY[@]}-1]}$*"; }
say() { echo "check-arm[$ARCH]: $*" >&2; }
fmt() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
print_summary() {
    local line
    say "summary ($ARCH, $SUITE, qemu $(qemu_version))"
    for line in "${SUMMARY[@]}"; do echo "  $line" >&2; done
}
qemu_version() { "$QEMU-static" --version 2>/dev/null | head -n1 | sed 's/.*version //' || echo "?"; }

# step NAME COMMAND...: runs it with its output teed to a log, a heartbeat on long steps, the time taken.
step() {
    local name=$1 start rc hb
    shift
    CURRENT=$name
    rm -f "$CACHE/.note"
    start=$(date +%s)
    say "step $name: $*"
    ( while sleep "$HEARTBEAT_S"; do say "step $name still running ($(fmt $(($(date +%s) - start))))"; done ) &
    hb=$!
    set +e
    "$@" 2>&1 | tee "$CACHE/$name.log"
    rc=${PIPESTATUS[0]}
    set -e
    kill "$hb" 2>/dev/null; wait "$hb" 2>/dev/null || true
    local took
    took=$(fmt $(($(date +%s) - start)))
    if [ "$rc" -ne 0 ]; then
        SUMMARY+=("$(printf '%-6s FAILED (exit %d) after %s; log: %s' "$name" "$rc" "$took" "$CACHE/$name.log")")
        print_summary
        say "FAILED at step $name (exit $rc): see $CACHE/$name.log"
        exit 1
    fi
    SUMMARY+=("$(printf '%-6s ok  %7s  %s' "$name" "$took" "$(cat "$CACHE/.note" 2>/dev/null)")")
    CURRENT=""
}

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
mkdir -p "$CACHE"

# --- host
host_ready() {
    command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || return 1
    command -v "$QEMU-static" >/dev/null || return 1
    command -v update-binfmts >/dev/null || [ -x /usr/sbin/update-binfmts ] || return 1
}
do_host() {
    if ! host_ready; then
        echo "installing qemu-user-static debootstrap binfmt-support with apt-get"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq qemu-user-static debootstrap binfmt-support >/dev/null
    fi
    if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
        $SUDO mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc \
            || { echo "cannot mount binfmt_misc: the host (or the container) does not allow foreign binaries"; return 1; }
    fi
    if ! grep -q '^enabled' "/proc/sys/fs/binfmt_misc/$QEMU" 2>/dev/null; then
        $SUDO update-binfmts --enable "$QEMU" || true
    fi
    grep -q '^enabled' "/proc/sys/fs/binfmt_misc/$QEMU" 2>/dev/null \
        || { echo "binfmt handler $QEMU is not enabled (update-binfmts --display $QEMU)"; return 1; }
    echo "qemu $(qemu_version), binfmt $QEMU enabled ($(grep '^flags' "/proc/sys/fs/binfmt_misc/$QEMU"))"
}

# --- root
mirror() {
    if [ -n "${CHECK_ARM_MIRROR:-}" ]; then echo "$CHECK_ARM_MIRROR"; return; fi
    local m
    m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | grep -v '^[[:space:]]*#' | grep -oE 'https?://[^ ]+/debian/?' | grep -v security | head -n1 || true)
    echo "${m:-http://deb.debian.org/debian}"
}
do_root() {
    if [ -f "$MARK" ]; then
        echo "reusing $CHROOT (built $(cat "$MARK"))"
        note "reused"
        return 0
    fi
    local m
    m=$(mirror)
    rm -rf "$CHROOT.tmp"
    echo "debootstrap --arch=$ARCH $SUITE from $m (several minutes under emulation)"
    # Its per-package lines (hundreds) stay out of the output; the stage lines show the progress.
    nice -n "$NICE" debootstrap --arch="$ARCH" --include=ca-certificates "$SUITE" "$CHROOT.tmp" "$m" \
        | grep --line-buffered -vE '^I: (Retrieving|Validating|Extracting|Unpacking|Configuring) '
    [ -x "$CHROOT.tmp/bin/bash" ] || { echo "debootstrap left no usable root in $CHROOT.tmp"; return 1; }
    # No daemon starts inside the root when apt installs one (mosquitto, ejabberd).
    printf '#!/bin/sh\nexit 101\n' > "$CHROOT.tmp/usr/sbin/policy-rc.d"
    chmod 755 "$CHROOT.tmp/usr/sbin/policy-rc.d"
    date -u +%FT%TZ > "$CHROOT.tmp/.edge-inferd-root"
    rm -rf "$CHROOT"
    mv "$CHROOT.tmp" "$CHROOT"
    note "debootstrap from $m"
}

# --- mounts (undone on exit)
MOUNTED=()
mount_root() {
    local d
    for d in proc sys dev dev/pts; do
        mountpoint -q "$CHROOT/$d" && continue
        case $d in
            proc) $SUDO mount -t proc proc "$CHROOT/proc" ;;
            sys) $SUDO mount -t sysfs sys "$CHROOT/sys" ;;
            dev) $SUDO mount --bind /dev "$CHROOT/dev" ;;
            dev/pts) $SUDO mount -t devpts devpts "$CHROOT/dev/pts" ;;
        esac
        MOUNTED=("$CHROOT/$d" "${MOUNTED[@]}")
    done
    cp -L /etc/resolv.conf "$CHROOT/etc/resolv.conf"
    trust_host_cas
}
# The host's own CAs (/usr/local/share/ca-certificates: a proxy's, say) are trusted in the root
# too, or pip and npm there fail where they work here; the root's store is rebuilt when they change.
trust_host_cas() {
    local f changed=0 dest=$CHROOT/usr/local/share/ca-certificates
    mkdir -p "$dest"
    for f in /usr/local/share/ca-certificates/*.crt; do
        [ -f "$f" ] || continue
        cmp -s "$f" "$dest/$(basename "$f")" && continue
        cp "$f" "$dest/"
        changed=1
    done
    if [ "$changed" -eq 1 ]; then
        say "trusting the host's CAs in the root ($(ls "$dest" | tr '\n' ' '))"
        chroot "$CHROOT" /usr/sbin/update-ca-certificates >/dev/null
    fi
}
unmount_root() {
    local d
    for d in "${MOUNTED[@]}"; do $SUDO umount -l "$d" 2>/dev/null || true; done
}
cleanup() {
    local rc=$?
    unmount_root
    if [ "$rc" -ne 0 ] && [ -n "$CURRENT" ]; then say "FAILED at step $CURRENT"; fi
}
trap cleanup EXIT

# in_root COMMAND: runs a shell command in the project's copy inside the root, niced.
in_root() {
    nice -n "$NICE" chroot "$CHROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PYTHONUNBUFFERED=1 \
        PIP_CERT=$BUNDLE SSL_CERT_FILE=$BUNDLE REQUESTS_CA_BUNDLE=$BUNDLE NODE_EXTRA_CA_CERTS=$BUNDLE \
        /bin/bash -c "cd $PROJECT && $1"
}

# --- copy
do_copy() {
    local dest=$CHROOT$PROJECT keep
    mkdir -p "$dest"
    if [ "$FRESH" -eq 1 ]; then
        rm -rf "$dest"; mkdir -p "$dest"
    else  # every file of an earlier copy but what the setup made there
        find "$dest" -mindepth 1 -maxdepth 1 ! -name .venv ! -name '.venv-*' ! -name .cache -exec rm -rf {} +
    fi
    git -C "$ROOT_DIR" archive --format=tar HEAD | tar -x -C "$dest"
    keep=$(cd "$dest" && ls -d .venv .venv-* .cache 2>/dev/null | tr '\n' ' ' || true)
    note "HEAD $(git -C "$ROOT_DIR" rev-parse --short HEAD)${keep:+; kept from the last run: $keep}"
    cat "$CACHE/.note"
}

# --- seed: copies files only; the fetch in the root verifies them (sha256) before any test reads them
SEED=${CHECK_ARM_TEST_MODELS-$ROOT_DIR/.cache/test-models}
do_seed() {
    local dest=$CHROOT$PROJECT/.cache/test-models f n=0
    mkdir -p "$dest"
    for f in "$SEED"/*; do
        [ -f "$f" ] || continue
        cmp -s "$f" "$dest/$(basename "$f")" || { cp "$f" "$dest/"; n=$((n + 1)); }
    done
    note "$n file(s) copied from $SEED"
    cat "$CACHE/.note"
}

probe() {
    in_root 'echo "machine $(uname -m), $(python3 --version 2>&1 || echo no python3 yet)"; [ ! -x .venv/bin/python ] || .venv/bin/python -c "import platform, daemon.model.runtime as r; print(\"venv:\", platform.machine(), platform.python_version(), \"runtime:\", r.resolve_backend())" 2>&1 || true'
}

step host do_host
step root do_root
mount_root
step copy do_copy
step setup in_root './scripts/setup.sh'
if [ -n "${CHECK_ARM_LITERT:-}" ]; then
    step litert in_root ".venv/bin/pip install -q 'ai-edge-litert$CHECK_ARM_LITERT' 2>&1 | grep -v 'dependency conflicts\|requires ai-edge-litert' || true"
fi
annotate "$(probe | tail -n1)"
if [ -n "$SEED" ] && [ -d "$SEED" ]; then step seed do_seed; fi
step demo in_root './scripts/demo.sh'
annotate "$(grep -E 'accuracy|ROC-AUC|detect' "$CACHE/demo.log" | sed 's/^ *//' | tr -s ' ' | paste -sd';' | cut -c1-400)"
step unit in_root 'EDGE_INFERD_SKIP_HA=1 EDGE_INFERD_SKIP_V2=1 ./scripts/test.sh -q -p no:cacheprovider --ignore=tests/integration'
annotate "$(grep -E '[0-9]+ (passed|failed|error)' "$CACHE/unit.log" | tail -n1)"
print_summary
