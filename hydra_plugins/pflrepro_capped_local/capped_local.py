"""``python -m bench.experiment.run -m hydra/launcher=capped_local hydra.launcher.max_concurrent=2 seed=0,1,2,3``.

Hydra's ``submitit_local`` starts every job of a sweep at once; on a small machine that oversubscribes the
cores (two 2-thread torch jobs on 2 cores run ~8x slower). This launcher submits the sweep in waves of
``max_concurrent`` jobs (default: cores // cpus_per_task) and gives each job ``cpus_per_task`` torch threads
(default 1), so its records equal those of ``bench.experiment.run threads=<cpus_per_task>`` and of Slurm jobs with
that many CPUs.
"""

# no ``from __future__ import annotations``: Hydra's plugin scan loads this module outside sys.modules, where
# dataclasses cannot resolve string annotations
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher


@dataclass
class CappedLocalQueueConf(LocalQueueConf):
    _target_: str = "hydra_plugins.pflrepro_capped_local.capped_local.CappedLocalLauncher"
    max_concurrent: Optional[int] = None  # noqa: UP045 - jobs at once; None = cores // cpus_per_task
    cpus_per_task: Optional[int] = 1  # noqa: UP045 - torch threads per job


class CappedLocalLauncher(LocalLauncher):
    def __init__(self, max_concurrent: int | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.threads = int(self.params.get("cpus_per_task") or 1)
        self.max_concurrent = max_concurrent or max(1, (os.cpu_count() or 1) // self.threads)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # runs inside the job
        import torch

        torch.set_num_threads(self.threads)
        return super().__call__(*args, **kwargs)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        results: list[Any] = []
        for start in range(0, len(job_overrides), self.max_concurrent):
            wave = job_overrides[start:start + self.max_concurrent]
            results += super().launch(wave, initial_job_idx + start)
        return results


ConfigStore.instance().store(group="hydra/launcher", name="capped_local", node=CappedLocalQueueConf(),
                             provider="pflrepro")
