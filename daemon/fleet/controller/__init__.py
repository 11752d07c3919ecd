"""The operator's side: rollouts in waves, aborts and rollbacks, fleet status, and signing releases (`edge-inferd fleet ...`)."""
