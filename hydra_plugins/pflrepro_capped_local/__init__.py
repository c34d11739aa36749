"""Hydra launcher ``hydra/launcher=capped_local``: submitit's local launcher with a cap on concurrent jobs."""
