"""Start-up and shutdown, the supervisor of worker processes, reload, signals, notify, heartbeat.
May import every wing but `tools`."""
