"""The experiment layer: one run from a config (`run`), run identity and manifests, table specs, launching,
collection, rendering, the results page, plots, provenance, tuning and cross-checks."""
