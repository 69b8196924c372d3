"""Writing shards and committing them: the shard writer, the one write loop, commit targets,
parts of a distributed write and record indexes (TF-free: records come in already encoded)."""
