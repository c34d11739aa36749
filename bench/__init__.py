"""pflrepro: the federated core (`bench.core`), the assembly (`bench.builder`) and the experiment layer
(`bench.experiment`: runs, tables, collection, rendering, the results page)."""
