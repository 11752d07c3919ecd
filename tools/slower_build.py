#!/usr/bin/env python3
"""A build of a model that does its graph N times per sample and answers exactly as it does: the
fleet canary's really slower release (tests/fleet/node/test_canary_probe.py, tests/integration/test_fleet_rollout.py).

    python tools/slower_build.py                     # models/activity -> tests/fixtures/activity_x3 (5 copies)
    python tools/slower_build.py SRC_DIR OUT_DIR --copies 3

The model's graph is laid out `copies` times side by side: every copy reads the same input
tensor and shares the weights (buffers), and MAXIMUM ops join the copies' outputs into the one
graph output. The copies compute the same int8 tensor with the same quantization, so the maximum
is that tensor: the answers are bit for bit the original's (tests/fleet/node/test_canary_probe.py
checks it on the test split). The join also reads every copy's result, so no runtime may drop a
copy as dead (litert 2.3 runs an unread copy all the same: measured, 39 against 40 us). Needs
only what the daemon installs (ai-edge-litert's schema, flatbuffers), no training extra.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
from pathlib import Path

import flatbuffers
from ai_edge_litert import schema_py_generated as schema

ROOT = Path(__file__).resolve().parent.parent
# Five copies of the activity graph: 3.4x its CPU time per sample at batch 1 when alone (the
# invoke's fixed cost is not copied); 3.8-4.1x invoked back to back beside the original, quiet or
# busy (tests/fleet/node/test_canary_probe.py).
COPIES = 5


def slower(model_bytes: bytes, copies: int) -> bytes:
    """The model with its only subgraph laid out `copies` times and joined by MAXIMUM ops."""
    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(model_bytes, 0))
    graph = model.subgraphs[0]
    if len(model.subgraphs) != 1 or len(graph.outputs) != 1:
        raise SystemExit("slower_build: only a model of one subgraph with one output")
    originals, output = list(graph.operators), int(graph.outputs[0])
    finals = [output]
    for _ in range(copies - 1):
        finals.append(_copy_ops(graph, originals, output))
    maximum = _opcode(model, schema.BuiltinOperator.MAXIMUM)
    joined = finals[0]
    for final in finals[1:]:
        joined_next = _new_tensor(graph, graph.tensors[output], b"slower_build/maximum")
        op = schema.OperatorT()
        op.opcodeIndex, op.inputs, op.outputs = maximum, [joined, final], [joined_next]
        op.builtinOptionsType = schema.BuiltinOptions.MaximumMinimumOptions
        op.builtinOptions = schema.MaximumMinimumOptionsT()
        graph.operators.append(op)
        joined = joined_next
    graph.outputs = [joined]
    builder = flatbuffers.Builder(len(model_bytes) * copies)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _copy_ops(graph, originals: list, output: int) -> int:
    """One more copy of the operators: every tensor an operator writes gets a twin (inputs and
    weights are shared). Returns the twin of `output`."""
    twins: dict[int, int] = {}
    for op in originals:
        twin = copy.deepcopy(op)
        twin.inputs = [twins.get(int(i), int(i)) for i in op.inputs]
        for out in op.outputs:
            twins[int(out)] = _new_tensor(graph, graph.tensors[int(out)], b"slower_build/copy")
        twin.outputs = [twins[int(o)] for o in op.outputs]
        graph.operators.append(twin)
    return twins[output]


def _new_tensor(graph, like, prefix: bytes) -> int:
    tensor = copy.deepcopy(like)
    tensor.name = prefix + b"/" + (like.name or b"")
    tensor.buffer = 0  # an activation: no data of its own (buffer 0 is the empty one)
    graph.tensors.append(tensor)
    return len(graph.tensors) - 1


def _opcode(model, builtin: int) -> int:
    for index, code in enumerate(model.operatorCodes):
        if code.builtinCode == builtin:
            return index
    code = schema.OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, builtin, 2  # version 2: int8
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", nargs="?", default=str(ROOT / "models/activity"))
    parser.add_argument("out", nargs="?", default=str(ROOT / "tests/fixtures/activity_x3"))
    parser.add_argument("--copies", type=int, default=COPIES)
    args = parser.parse_args(argv)
    src, out = Path(args.src), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.tflite").write_bytes(slower((src / "model.tflite").read_bytes(), args.copies))
    shutil.copyfile(src / "labels.txt", out / "labels.txt")
    card = {"name": out.name, "purpose": f"test fixture: {src.name}'s graph {args.copies} times side by side, "
            "the same answers at several times the CPU time per sample: a release the fleet canary must roll back",
            "made_by": f"tools/slower_build.py {src.relative_to(ROOT)} {out.relative_to(ROOT)} --copies {args.copies}",
            "copies": args.copies, "labels": (src / "labels.txt").read_text().split()}
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    print(f"{out / 'model.tflite'}: {args.copies} copies of {src / 'model.tflite'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
