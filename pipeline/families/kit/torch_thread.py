"""A stage's work thread for torch, with torch itself on one thread too."""

from __future__ import annotations

import torch

from pipeline.families.kit.work_thread import WorkThread


class TorchThread(WorkThread):
    """A stage's work thread for torch, with torch itself on one thread too.

    Small ops are far faster single-threaded on these machines, and one thread keeps the
    stage's results reproducible.
    """

    def __init__(self, name: str) -> None:
        torch.set_num_threads(1)
        super().__init__(name, "torch")
