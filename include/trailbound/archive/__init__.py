"""The redo archive: its contract, segments and manifests, the Spark reader, the catalog."""
