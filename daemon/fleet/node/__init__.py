"""The node's side: the agent that fetches, stores, gates, canaries and installs releases, its commands, Home Assistant's update entity."""
