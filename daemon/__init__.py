"""edge-inferd: an MQTT inference daemon for INT8 TFLite models on gateway CPUs."""

__version__ = "0.1.0"
