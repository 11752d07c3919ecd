"""docs/config.md is generated (tools/gen_config_doc.py) and must not go stale."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

from daemon.config import schema as config
from daemon.model import preprocess

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_config_doc", ROOT / "tools" / "gen_config_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_config_md_is_up_to_date():
    assert _generator().main(["--check"]) == 0, "docs/config.md is stale: run python tools/gen_config_doc.py"


def test_every_key_step_and_format_is_documented():
    gen = _generator()
    text = (ROOT / "docs" / "config.md").read_text()
    headers = {line[len("## `"):-1] for line in text.splitlines() if line.startswith("## `")}
    assert headers == {section.path for section in gen.SECTIONS}
    docs = gen.attribute_docs()
    for section in gen.SECTIONS:
        for f in dataclasses.fields(section.cls):
            annotation = docs[section.cls.__name__][f.name][0]
            nested = any(name in annotation for name in gen.SECTION_CLASSES)
            if f.init and f.metadata.get("doc", True) and not nested:
                assert f"| `{f.metadata.get('yaml', f.name)}` |" in text, f"{section.path}: {f.name}"
    for name in (*preprocess.STEP_TYPES, *config.INPUT_FORMATS):
        assert f"### `{name}`" in text
