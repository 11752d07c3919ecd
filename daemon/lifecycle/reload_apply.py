"""Applying a reload (SIGHUP, or the fleet agent's swap) to the running Service: reload.py says what
changed and checks the new config in a child process; this applies it, a hot swap of the changed
models or an ordered restart of the steps from the first one a change affects, and keeps the
running config and models serving when anything fails. A mixin of `service.Service`, whose state
(config, models, pins, steps, serving) it changes; cut from service.py along that seam."""

from __future__ import annotations

import logging
from typing import Optional

from daemon.errors import DaemonError
from daemon.lifecycle import drift_reference, reload
from daemon.lifecycle.gc_settle import settle_gc
from daemon.lifecycle.steps import StepName
from daemon.config.schema import Config
from daemon.pipeline.route_pipeline import route_pipelines

logger = logging.getLogger("daemon.lifecycle.service")  # the service's log lines, as before the cut


class Reloads:
    """Service's reload (mixed in: it uses the Service's config, models, steps and serving)."""

    def _reload(self) -> None:
        self.reload("SIGHUP")

    def reload(self, reason: str) -> Optional[str]:
        """SIGHUP, or the fleet agent's swap: verify the re-read config in a child, then apply it; on
        failure keep serving. None when applied (or nothing changed), else why it was not."""
        logger.info("%s: reloading %s", reason, self.config.source)
        self.stats.incr("reloads")
        try:
            new = self._reread()
            change = reload.plan(self.config, new, {name: m.fingerprint for name, m in self._models.items()})
            if not change.changed:
                logger.info("reload: nothing to apply%s", _ignored(change))
                return None
            problem = reload.verify(new.source, while_waiting=lambda: self._notifier.watchdog(self._progressing()))
            if problem is not None:
                raise DaemonError(f"the new config or a model failed its check in a child process ({problem})")
            self._apply(new, change)
            settle_gc()
            return None
        except Exception as exc:  # whatever fails, the running config and models keep serving
            self.stats.incr("reload_failures")
            logger.error("reload failed; still serving the running config and models: %s", exc)
            return str(exc)

    def _apply(self, new: Config, change: "reload.Plan") -> None:
        old, old_models = self.config, self._models
        if change.restart_from is not None:
            self._restart_from(change.restart_from, new, change.digests)
        else:
            try:
                self.config = new
                self._pins = dict(change.digests)
                self._load_models(change.changed_models)
                pipes = route_pipelines(self.config, self._models)
                # changed models: new references
                drift_reference.configure(self.drift, self.config, pipes, self._models)
                self._serving.swap(pipes, self._worker_models)
            except Exception:
                self.config, self._models = old, old_models
                raise
        logger.info("reload: applied (%s)%s", f"restarted from {change.restart_from}" if change.restart_from else
                    "models swapped: " + ", ".join(sorted(change.changed_models)), _ignored(change))

    def _restart_from(self, first: StepName, new: Config, digests: dict) -> None:
        """Stop the started steps down to `first` (in reverse, draining), start them again with `new`;
        if that fails, the old config is started again."""
        names = [step.name for step in self.steps()]
        index = names.index(first)
        self._stop_down_to(index)
        old, self.config = self.config, new
        try:
            self._start_steps(index, digests)
        except Exception as exc:
            logger.error("reload: starting %s with the new config failed (%s); back to the old config", first, exc)
            self._stop_down_to(index)
            self.config = old
            self._start_steps(index, {})
            raise DaemonError(f"the new config failed to start: {exc}") from exc


def _ignored(change: "reload.Plan") -> str:
    return "".join(f"; {name} changed: restart the daemon to apply it" for name in change.ignored)
