"""Typed, frozen config: the schema dataclasses, the YAML reader with lines, one module per section,
pass 2 (cross-field and model-file checks) and the model-file helpers. May import `model`, `errors`, `topics`."""
