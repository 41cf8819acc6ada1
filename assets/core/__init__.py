"""The machinery every asset shares: version keys (versioning), reading upstream outputs (upstream), the
reuse-or-build factory (factory), and the lineage of a trained checkpoint (lineage)."""
