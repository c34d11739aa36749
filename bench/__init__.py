"""pflrepro benchmark engine: runner, records, launcher glue, collection and plots."""
