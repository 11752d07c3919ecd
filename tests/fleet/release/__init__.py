"""Tests of daemon/fleet/release/."""
