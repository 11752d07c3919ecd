"""The MQTT link: paho, the PUBACK registry, the on-disk outbox, link health. May import `config`, `obs`."""
