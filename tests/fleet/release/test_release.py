"""Releases (daemon/fleet/release/release.py, publish.py): the manifest's strict reader, the trust decision over
signatures, and releases made from the bundled activity model, checked by minisign itself too."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.errors import DaemonError, ModelError
from daemon.fleet.release import minisign, release
from daemon.fleet.controller import publish
from daemon.fleet.release.refusal import (BAD_MANIFEST, BAD_SIGNATURE, TOO_FEW_SIGNATURES, UNSAFE_NAME, UNTRUSTED_KEY,
                                  Refused)
from daemon.fleet.release.release import MANIFEST_NAME, SIGNATURE_NAME, Claim, claimed, parse_manifest, verify_manifest
from daemon.model.runtime import Model, file_sha256

ROOT = Path(__file__).resolve().parents[3]
MODEL = ROOT / "models" / "activity" / "model.tflite"
LABELS = ROOT / "models" / "activity" / "labels.txt"
TEST_DATA = ROOT / "models" / "activity" / "test.npz"
MINISIGN = shutil.which("minisign")
needs_minisign = pytest.mark.skipif(MINISIGN is None, reason="minisign is not installed (apt-get install minisign)")


@pytest.fixture(scope="module")
def keys():
    return [minisign.generate() for _ in range(3)]


@pytest.fixture(scope="module")
def made(tmp_path_factory, keys) -> Path:
    out = tmp_path_factory.mktemp("release") / "activity-4"
    claim = Claim(file_sha256(TEST_DATA), "accuracy", 0.975)
    publish.make_release(out, "activity", "1.3.0", 4, MODEL, LABELS, keys[0], (claim,), "fewer false walking")
    return out


@pytest.fixture()
def manifest_bytes(made) -> bytes:
    return (made / MANIFEST_NAME).read_bytes()


@pytest.fixture()
def doc(manifest_bytes) -> dict:
    return json.loads(manifest_bytes)


def _refused(code: str, call, *args) -> Refused:
    with pytest.raises(Refused) as info:
        call(*args)
    assert info.value.code == code, info.value
    return info.value


def _encode(doc: dict) -> bytes:
    return json.dumps(doc).encode()


# --- what fleet sign writes ---


def test_the_release_holds_the_files_a_sorted_manifest_and_its_signature(made, keys, manifest_bytes):
    assert sorted(p.name for p in made.iterdir()) == sorted(["labels.txt", "model.tflite", MANIFEST_NAME,
                                                             SIGNATURE_NAME])
    doc = json.loads(manifest_bytes)
    assert manifest_bytes.decode() == json.dumps(doc, sort_keys=True, indent=2) + "\n"
    manifest = parse_manifest(manifest_bytes)
    assert (manifest.model, manifest.version, manifest.serial) == ("activity", "1.3.0", 4)
    assert manifest.model_file == "model.tflite" and manifest.labels_file == "labels.txt"
    for entry in manifest.files:
        assert entry.sha256 == file_sha256(made / entry.name) and entry.size == (made / entry.name).stat().st_size
    assert manifest.claims == (Claim(file_sha256(TEST_DATA), "accuracy", 0.975),)
    (sig,) = minisign.parse_signatures((made / SIGNATURE_NAME).read_text())
    assert sig.trusted_comment == "model=activity version=1.3.0 serial=4" and sig.key_id == keys[0].key_id


def test_the_interface_is_the_models_own_and_survives_json(made, manifest_bytes):
    interface = parse_manifest(manifest_bytes).interface
    assert interface == Model(MODEL, xnnpack=False).interface
    assert interface.problems() == []
    assert release.interface_from_json(release.interface_to_json(interface)) == interface
    assert "DELEGATE" not in interface.ops  # the model's ops, not the signing machine's delegate


def test_a_release_is_not_made_twice_into_one_folder(made, keys):
    with pytest.raises(DaemonError, match="already holds a release"):
        publish.make_release(made, "activity", "1.3.0", 5, MODEL, LABELS, keys[0])


def test_a_model_the_daemon_cannot_serve_is_not_released(tmp_path, keys):
    truncated = tmp_path / "truncated.tflite"
    truncated.write_bytes(MODEL.read_bytes()[:2000])
    with pytest.raises(ModelError, match="rejected the model"):
        publish.make_release(tmp_path / "r", "activity", "1", 1, truncated, None, keys[0])
    assert not (tmp_path / "r" / MANIFEST_NAME).exists()


def test_a_release_whose_manifest_a_node_would_refuse_is_not_made(tmp_path, keys):
    _refused(BAD_MANIFEST, publish.make_release, tmp_path / "r", "activity", "1 3", 1, MODEL, None, keys[0])
    _refused(UNSAFE_NAME, publish.make_release, tmp_path / "r", "../x", "1", 1, MODEL, None, keys[0])
    with pytest.raises(minisign.MinisignError, match="trusted comment"):  # a version minisign -V could not read
        publish.make_release(tmp_path / "r", "activity", "1" * 9000, 1, MODEL, None, keys[0])
    assert not (tmp_path / "r").exists()


@needs_minisign
def test_minisign_verifies_the_release(made, keys, tmp_path):
    pub = tmp_path / "k.pub"
    pub.write_text(keys[0].public_key.to_text())
    out = subprocess.run([MINISIGN, "-V", "-H", "-m", str(made / MANIFEST_NAME), "-p", str(pub)],
                         capture_output=True, text=True, timeout=60, check=True)
    assert "Trusted comment: model=activity version=1.3.0 serial=4" in out.stdout


@needs_minisign
def test_a_manifest_signed_by_minisign_itself_is_trusted(tmp_path, manifest_bytes):
    pub, key, manifest = tmp_path / "m.pub", tmp_path / "m.key", tmp_path / MANIFEST_NAME
    manifest.write_bytes(manifest_bytes)
    subprocess.run([MINISIGN, "-G", "-W", "-p", str(pub), "-s", str(key)], capture_output=True, check=True, timeout=60)
    subprocess.run([MINISIGN, "-S", "-s", str(key), "-m", str(manifest), "-t", "model=activity version=1.3.0 serial=4"],
                   capture_output=True, check=True, timeout=60)
    trusted = [minisign.PublicKey.from_text(pub.read_text())]
    sig_text = (tmp_path / SIGNATURE_NAME).read_text()
    assert verify_manifest(manifest_bytes, sig_text, trusted, 1).serial == 4


# --- trust ---


def _sig(made: Path) -> str:
    return (made / SIGNATURE_NAME).read_text()


def test_signed_by_a_trusted_key(made, keys, manifest_bytes):
    assert verify_manifest(manifest_bytes, _sig(made), [keys[0].public_key], 1) == parse_manifest(manifest_bytes)
    assert verify_manifest(manifest_bytes, _sig(made).encode(), [keys[2].public_key, keys[0].public_key], 1)


def test_a_tampered_manifest_is_a_bad_signature(made, keys, manifest_bytes):
    tampered = manifest_bytes.replace(b'"serial": 4', b'"serial": 5')
    assert tampered != manifest_bytes
    _refused(BAD_SIGNATURE, verify_manifest, tampered, _sig(made), [keys[0].public_key], 1)


def test_a_tampered_trusted_comment_is_a_bad_signature(made, keys, manifest_bytes):
    text = _sig(made).replace("serial=4", "serial=3")
    _refused(BAD_SIGNATURE, verify_manifest, manifest_bytes, text, [keys[0].public_key], 1)


def test_a_trusted_comment_that_disagrees_with_the_manifest_is_a_bad_signature(keys, manifest_bytes):
    text = minisign.sign(manifest_bytes, keys[0], "model=activity version=1.3.0 serial=3")
    refusal = _refused(BAD_SIGNATURE, verify_manifest, manifest_bytes, text, [keys[0].public_key], 1)
    assert "serial=3" in refusal.message


def test_only_untrusted_keys_signed(made, keys, manifest_bytes):
    text = _sig(made) + minisign.sign(manifest_bytes, keys[1], "model=activity version=1.3.0 serial=4")
    refusal = _refused(UNTRUSTED_KEY, verify_manifest, manifest_bytes, text, [keys[2].public_key], 1)
    assert keys[0].key_id_hex in refusal.message and keys[1].key_id_hex in refusal.message


def test_an_untrusted_signature_beside_a_trusted_one_is_ignored(made, keys, manifest_bytes):
    text = minisign.sign(manifest_bytes, keys[1], "anything") + _sig(made)
    assert verify_manifest(manifest_bytes, text, [keys[0].public_key], 1).serial == 4


def test_a_failing_trusted_signature_refuses_even_beside_a_good_one(made, keys, manifest_bytes):
    forged = minisign.sign(manifest_bytes + b" ", keys[1], "model=activity version=1.3.0 serial=4")
    trusted = [keys[0].public_key, keys[1].public_key]
    _refused(BAD_SIGNATURE, verify_manifest, manifest_bytes, _sig(made) + forged, trusted, 1)


def test_threshold_two_needs_two_distinct_keys(made, keys, manifest_bytes, tmp_path):
    copied = tmp_path / "r"
    shutil.copytree(made, copied)
    trusted = [k.public_key for k in keys[:2]]
    refusal = _refused(TOO_FEW_SIGNATURES, verify_manifest, manifest_bytes, _sig(copied), trusted, 2)
    assert "1 trusted key(s)" in refusal.message and "2 needed" in refusal.message
    publish.add_signature(copied, keys[1])
    assert len(minisign.parse_signatures(_sig(copied))) == 2
    assert verify_manifest(manifest_bytes, _sig(copied), trusted, 2).serial == 4
    _refused(TOO_FEW_SIGNATURES, verify_manifest, manifest_bytes, _sig(copied), trusted, 3)


def test_the_same_key_twice_counts_once(made, keys, manifest_bytes, tmp_path):
    again = minisign.sign(manifest_bytes, keys[0], "model=activity version=1.3.0 serial=4", prehashed=False)
    trusted = [keys[0].public_key, keys[0].public_key, keys[1].public_key]
    _refused(TOO_FEW_SIGNATURES, verify_manifest, manifest_bytes, _sig(made) + again, trusted, 2)
    copied = tmp_path / "r"
    shutil.copytree(made, copied)
    with pytest.raises(DaemonError, match="already signed"):
        publish.add_signature(copied, keys[0])


@pytest.mark.parametrize("text", ["", "garbage\n", b"\xff\xfe".decode("latin-1"), b"\xff\xfe"])
def test_a_malformed_signature_file_is_a_bad_signature(keys, manifest_bytes, text):
    _refused(BAD_SIGNATURE, verify_manifest, manifest_bytes, text, [keys[0].public_key], 1)


def test_a_threshold_below_one_is_a_programming_error(made, keys, manifest_bytes):
    with pytest.raises(ValueError):
        verify_manifest(manifest_bytes, _sig(made), [keys[0].public_key], 0)


# --- the reader's rules ---


UNSAFE = ["", "a/b", "/etc/passwd", "..\\x", "a\\b", ".", "..", "a\0b", "x" * 256, "é" * 128, MANIFEST_NAME,
          SIGNATURE_NAME]


@pytest.mark.parametrize("name", UNSAFE)
@pytest.mark.parametrize("where", ["files", "model_file", "labels_file", "model"])
def test_every_unsafe_name_is_refused(doc, name, where):
    if where == "files":
        doc["files"][1]["name"] = name
    else:
        doc[where] = name
    refusal = _refused(UNSAFE_NAME, parse_manifest, _encode(doc))
    assert refusal.message.startswith("files[1].name" if where == "files" else where)


def test_a_long_name_up_to_255_bytes_is_safe(doc):
    name = "x" * 255
    doc["files"][1]["name"] = doc["labels_file"] = name
    assert parse_manifest(_encode(doc)).labels_file == name


def _drop(key):
    return lambda d: d.pop(key)


def _set(path, value):
    def mutate(d):
        *parents, last = path
        for part in parents:
            d = d[part]
        d[last] = value
    return mutate


BAD = [
    (_drop("schema"), "schema: missing"),
    (_set(["schema"], "edge-inferd.release/2"), "schema:"),
    (_drop("model"), "model: missing"),
    (_set(["model"], 7), "model: must be a string, not an integer"),
    (_set(["version"], "1 .3"), "version: must be non-empty"),
    (_set(["version"], ""), "version: must be non-empty"),
    (_drop("serial"), "serial: missing"),
    (_set(["serial"], "4"), "serial: must be an integer, not a string"),
    (_set(["serial"], True), "serial: must be an integer, not a boolean"),
    (_set(["serial"], 4.0), "serial: must be an integer, not a number"),
    (_set(["serial"], -1), "serial: must not be negative"),
    (_drop("files"), "files: missing"),
    (_set(["files"], {}), "files: must be a list, not an object"),
    (_set(["files", 0], "model.tflite"), "files[0]: must be an object"),
    (_set(["files", 0, "size"], None), "files[0].size: must be an integer, not null"),
    (_set(["files", 0, "size"], -3), "files[0].size: must not be negative"),
    (_set(["files", 1, "sha256"], "abc"), "files[1].sha256: must be 64 hex digits"),
    (_set(["files", 1, "sha256"], "g" * 64), "files[1].sha256: must be 64 hex digits"),
    (lambda d: d["files"].append(dict(d["files"][0])), "files: lists 'model.tflite' more than once"),
    (_drop("model_file"), "model_file: missing"),
    (_set(["model_file"], "other.tflite"), "model_file: 'other.tflite' is not in files"),
    (_set(["labels_file"], "other.txt"), "labels_file: 'other.txt' is not in files"),
    (_drop("interface"), "interface: missing"),
    (_set(["interface"], []), "interface: must be an object, not a list"),
    (lambda d: d["interface"].pop("inputs"), "interface.inputs: missing"),
    (_set(["interface", "inputs", 0, "dtype"], "int9"), "interface.inputs[0].dtype:"),
    (_set(["interface", "inputs", 0, "dtype"], "i1"), "interface.inputs[0].dtype: 'i1' is not a numpy dtype name"),
    (_set(["interface", "inputs", 0, "shape"], [1, "50"]), "interface.inputs[0].shape: must be a list of integers"),
    (_set(["interface", "outputs", 0, "signature"], [-2, 4]), "interface.outputs[0].signature:"),
    (_set(["interface", "outputs", 0, "scale"], "0.1"), "interface.outputs[0].scale: must be a number"),
    (_set(["interface", "outputs", 0, "zero_point"], 0.5), "interface.outputs[0].zero_point: must be an integer"),
    (_set(["interface", "outputs", 0, "name"], None), "interface.outputs[0].name: must be a string, not null"),
    (_set(["interface", "ops"], [1]), "interface.ops[0]: must be a string"),
    (_set(["interface", "quantized_tensors"], "13"), "interface.quantized_tensors: must be an integer"),
    (_set(["claims"], {}), "claims: must be a list"),
    (_set(["claims", 0, "metric"], "f1"), "claims[0].metric: 'f1' is not one of"),
    (_set(["claims", 0, "value"], "0.9"), "claims[0].value: must be a number"),
    (lambda d: d["claims"][0].pop("validate_sha256"), "claims[0].validate_sha256: missing"),
    (_set(["summary"], ["x"]), "summary: must be a string, not a list"),
]


@pytest.mark.parametrize("mutate, expected", BAD, ids=[expected for _, expected in BAD])
def test_each_bad_manifest_names_its_key(doc, mutate, expected):
    mutate(doc)
    refusal = _refused(BAD_MANIFEST, parse_manifest, _encode(doc))
    assert refusal.message.startswith(expected), refusal.message


@pytest.mark.parametrize("data, expected", [
    (b"\xff{}", "manifest: not UTF-8"),
    (b"{", "manifest: not JSON"),
    (b"[1, 2]", "manifest: must be a JSON object, not a list"),
    (b'{"schema": NaN}', "manifest: NaN is not JSON"),
    (b'{"schema": "a", "schema": "b"}', "schema: appears twice"),
    (b"[" * 100_000 + b"]" * 100_000, "manifest:"),
    (b" " * (release.MAX_MANIFEST_BYTES + 1), "manifest:"),
])
def test_bytes_that_are_not_a_manifest(data, expected):
    assert _refused(BAD_MANIFEST, parse_manifest, data).message.startswith(expected)


def test_a_number_too_large_for_a_float_is_refused(doc):
    data = _encode(doc).replace(b'"value": 0.975', b'"value": 1e400')
    assert _refused(BAD_MANIFEST, parse_manifest, data).message == "claims[0].value: must be a finite number"


def test_optional_keys_may_be_absent_or_null(doc):
    for key in ("labels_file", "claims", "summary"):
        doc.pop(key)
    manifest = parse_manifest(_encode(doc))
    assert (manifest.labels_file, manifest.claims, manifest.summary) == (None, (), "")
    doc["labels_file"] = None
    assert parse_manifest(_encode(doc)).labels_file is None


def test_unknown_keys_are_ignored_for_later_minor_additions(doc):
    doc["later"] = {"x": 1}
    assert parse_manifest(_encode(doc)).serial == 4


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
                    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_parse_manifest_refuses_arbitrary_json_with_refused_only(value):
    with pytest.raises(Refused) as info:
        parse_manifest(json.dumps(value).encode())
    assert info.value.code in (BAD_MANIFEST, UNSAFE_NAME)


def _paths(value, prefix=()):
    yield prefix
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        yield from _paths(child, (*prefix, key))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_manifest_with_any_one_value_replaced_parses_or_is_refused(doc, data):
    paths = [p for p in _paths(doc) if p]
    path = data.draw(st.sampled_from(paths))
    changed = copy.deepcopy(doc)
    _set(list(path), data.draw(JSON))(changed)
    try:
        parse_manifest(json.dumps(changed).encode())
    except Refused as exc:
        assert exc.code in (BAD_MANIFEST, UNSAFE_NAME)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text())
def test_verify_manifest_refuses_any_signature_text_with_refused_only(keys, manifest_bytes, text):
    with pytest.raises(Refused) as info:
        verify_manifest(manifest_bytes, text, [keys[0].public_key], 1)
    assert info.value.code in (BAD_SIGNATURE, UNTRUSTED_KEY)


def test_a_manifests_file_by_name(manifest_bytes):
    manifest = parse_manifest(manifest_bytes)
    assert manifest.file("labels.txt").size == LABELS.stat().st_size
    with pytest.raises(KeyError, match="other"):
        manifest.file("other")


@pytest.mark.parametrize("data, said", [
    (b'{"serial": 5, "version": "1.4.0", "model": "activity"}', (5, "1.4.0")),
    (b'{"serial": true, "version": "1.4 beta"}', (None, "unknown")),
    (b'{"serial": -1, "version": ""}', (None, "unknown")),
    (b'{"version": "' + b"9" * 65 + b'"}', (None, "unknown")),
    (b"[5]", (None, "unknown")),
    (b"\xff not json", (None, "unknown")),
])
def test_what_a_manifest_claims_before_it_is_verified_is_a_plain_serial_and_version_or_unknown(data, said):
    assert claimed(data) == said
