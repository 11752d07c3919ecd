"""Fleet delivery (docs/fleet.md), in three rooms by where the code runs: `release/` (what both sides
read: the release format and its minisign signatures, the desired documents, refusal codes),
`node/` (the node's agent: fetch, store, gate, canary, install, its commands and Home Assistant
update entity) and `controller/` (the operator's: rollout, waves, status, signing releases). The
node and the controller never import each other; `release/` imports neither (tests/test_walls.py)."""
