"""Redis-backed state: responses, embeddings, prefix affinity, semantic index (see each module)."""
