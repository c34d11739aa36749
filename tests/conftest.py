"""Shared test setup: W&B can never reach the network, and runs go to temporary folders."""

from __future__ import annotations

import os

os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"
os.environ.setdefault("WANDB_DISABLE_GIT", "true")
