"""Data sources, batch augmentations, partitioners and partition reports."""
