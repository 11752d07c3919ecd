"""Tests of daemon/fleet/node/."""
