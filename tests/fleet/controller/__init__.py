"""Tests of daemon/fleet/controller/."""
