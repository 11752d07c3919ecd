"""Bytes in and out (codecs), the pure request path, the per-device reuse fast path, validate.
No threads on the request path, no MQTT, no storage library. May import `model`, `cache`, `config`."""
